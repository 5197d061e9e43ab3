// What the CUDA sources of ops/cuda/ share (device code, included by .cu files only): error
// checks, launch geometry, the fixed-order warp and block reductions, and element access to the
// GGUF block layouts the kernels read. Kernels are templates on the weight type (DType) they
// read; by_type turns a run-time type into that template argument.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "core/error.hpp"
#include "ops/cuda/cuda_ops.hpp"
#include "tensor/dtype.hpp"
#include "tensor/kquant_scales.hpp"

namespace ember::cuda::detail {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA {} failed: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e));
}
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }
// Counts a kernel launch (cuda::launches()); defined in runtime.cu.
void count_launch();
// After every launch: its error checked, the launch counted.
inline void launched(const char* kernel) {
  check_launch(kernel);
  count_launch();
}
inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
inline unsigned grid_of(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

// The weight types the kernels read (supports()), and those multiplied in 8-bit integers (takes_q8).
template <DType T>
constexpr bool takes_q8_v = takes_q8(T);

// The error for a weight type the kernels do not read.
[[noreturn]] inline void refuse_type(DType type) {
  fail("CUDA kernels do not read {} weights (F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)",
       dtype_name(type));
}

// f(std::integral_constant<DType, T>{}) for the weight type: every kernel's template argument
// from a run-time type, the one switch over the types (check_type first).
template <class F>
void by_type(DType type, F&& f) {
  switch (type) {
    case DType::F32: f(std::integral_constant<DType, DType::F32>{}); break;
    case DType::F16: f(std::integral_constant<DType, DType::F16>{}); break;
    case DType::Q4_0: f(std::integral_constant<DType, DType::Q4_0>{}); break;
    case DType::Q4_1: f(std::integral_constant<DType, DType::Q4_1>{}); break;
    case DType::Q8_0: f(std::integral_constant<DType, DType::Q8_0>{}); break;
    case DType::Q5_0: f(std::integral_constant<DType, DType::Q5_0>{}); break;
    case DType::Q5_1: f(std::integral_constant<DType, DType::Q5_1>{}); break;
    case DType::Q4_K: f(std::integral_constant<DType, DType::Q4_K>{}); break;
    case DType::Q5_K: f(std::integral_constant<DType, DType::Q5_K>{}); break;
    case DType::Q6_K: f(std::integral_constant<DType, DType::Q6_K>{}); break;
    default: refuse_type(type);
  }
}

// A matrix of `type` with rows of `cols` values the kernels can read, or a named error.
inline void check_type(DType type, int64_t cols) {
  if (!supports(type)) refuse_type(type);
  EMBER_CHECK(cols % info(type).block_size == 0, "CUDA: row length {} is not a multiple of {}'s block size", cols,
              dtype_name(type));
}

constexpr int kWarp = 32;
constexpr int kQK = 32;        // elements per Q8_0 / Q4_0 / Q4_1 block
constexpr int kQ8Bytes = 34;   // half d + 32 int8
constexpr int kQ4Bytes = 18;   // half d + 16 bytes of nibbles
constexpr int kQ41Bytes = 20;  // half d, half m + 16 bytes of nibbles

__device__ __forceinline__ float half_at(const uint8_t* p) {
  const unsigned short bits = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(bits));
}

template <DType T>
struct BlockBytes {  // F32 and F16 have no blocks
  static constexpr int value = 0;
};
template <>
struct BlockBytes<DType::Q8_0> {
  static constexpr int value = kQ8Bytes;
};
template <>
struct BlockBytes<DType::Q4_0> {
  static constexpr int value = kQ4Bytes;
};
template <>
struct BlockBytes<DType::Q4_1> {
  static constexpr int value = kQ41Bytes;
};

// Element j of a row of the given type.
template <DType T>
__device__ __forceinline__ float element(const uint8_t* row, int64_t j);
template <>
__device__ __forceinline__ float element<DType::F32>(const uint8_t* row, int64_t j) {  // F32
  return reinterpret_cast<const float*>(row)[j];
}
template <>
__device__ __forceinline__ float element<DType::F16>(const uint8_t* row, int64_t j) {  // F16
  return __half2float(reinterpret_cast<const __half*>(row)[j]);
}
template <>
__device__ __forceinline__ float element<DType::Q8_0>(const uint8_t* row, int64_t j) {  // Q8_0
  const uint8_t* b = row + (j / kQK) * kQ8Bytes;
  return half_at(b) * static_cast<float>(static_cast<int8_t>(b[2 + j % kQK]));
}
template <>
__device__ __forceinline__ float element<DType::Q4_0>(const uint8_t* row, int64_t j) {  // Q4_0
  const uint8_t* b = row + (j / kQK) * kQ4Bytes;
  const int jj = static_cast<int>(j % kQK);
  const int q = jj < 16 ? (b[2 + jj] & 0x0F) : (b[2 + jj - 16] >> 4);
  return half_at(b) * static_cast<float>(q - 8);
}
template <>
__device__ __forceinline__ float element<DType::Q4_1>(const uint8_t* row, int64_t j) {  // Q4_1
  const uint8_t* b = row + (j / kQK) * kQ41Bytes;
  const int jj = static_cast<int>(j % kQK);
  const int q = jj < 16 ? (b[4 + jj] & 0x0F) : (b[4 + jj - 16] >> 4);
  return half_at(b) * static_cast<float>(q) + half_at(b + 2);
}

constexpr int kQ8_1Bytes = 36;  // BlockQ8_1 (tensor/quant.hpp): half d, half s, 32 int8

// The device's layout of a matrix of a block type (cuda_ops.hpp, pack_matrix): every row's codes
// first (code_bytes a block of 32, row after row), then every row's factors (group_bytes for each
// group of blocks: fp16 d; Q4_1, Q5_1: d then m; the K-quants a super-block's as GGUF holds them:
// Q4_K and Q5_K d, dmin and the 12 bytes of 6-bit scales and mins, Q6_K the 16 int8 scales then
// d). The same bytes as the file's. Codes: Q8_0's 32 bytes; Q4_0, Q4_1 and Q4_K's 16 bytes of
// nibbles in Q4_1's order (byte i: elements i and 16 + i); Q5_0, Q5_1 and Q5_K's those nibbles then
// a 32-bit word of fifth bits (bit e: element e's); Q6_K's nibbles then 8 bytes of high 2-bit
// pairs (element e's at bits 2 (e % 4) of byte e / 4). wide: the block's codes in registers are 32
// bytes (Q8_0's form, the 5- and 6-bit codes unpacked to bytes), else 16 bytes of nibbles.
struct SplitShape {
  int code_bytes, group, group_bytes;
  bool wide;
};
constexpr SplitShape split_shape(DType t) {
  switch (t) {
    case DType::Q8_0: return {32, 1, 2, true};
    case DType::Q4_0: return {16, 1, 2, false};
    case DType::Q4_1: return {16, 1, 4, false};
    case DType::Q5_0: return {20, 1, 2, true};
    case DType::Q5_1: return {20, 1, 4, true};
    case DType::Q4_K: return {16, 8, 16, false};
    case DType::Q5_K: return {20, 8, 16, true};
    case DType::Q6_K: return {24, 8, 18, true};
    default: return {0, 1, 0, false};  // F32, F16: no blocks
  }
}
template <DType T>
struct Split {
  static constexpr int kCodeBytes = split_shape(T).code_bytes, kGroup = split_shape(T).group,
                       kGroupBytes = split_shape(T).group_bytes;
  static constexpr bool kWide = split_shape(T).wide;
};
constexpr int kQKK = 256;  // elements per K-quant super-block
// The types whose rows the sparse axpy reads (a neuron's row of the down; others' downs are held
// as Q8_0 rows: hybrid_device_down_type).
constexpr bool axpy_reads(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1;
}

// A matrix in the device's layout: row r's codes and factors.
template <DType T>
struct SplitRows {
  const uint8_t* codes;
  const uint8_t* factors;
  int64_t nb;  // blocks a row
  __device__ __forceinline__ SplitRows(const uint8_t* w, int64_t rows, int64_t cols)
      : codes(w), factors(w + rows * (cols / kQK) * Split<T>::kCodeBytes), nb(cols / kQK) {}
  __device__ __forceinline__ const uint8_t* row_codes(int64_t r) const { return codes + r * nb * Split<T>::kCodeBytes; }
  __device__ __forceinline__ const uint8_t* row_factors(int64_t r) const {
    return factors + r * (nb / Split<T>::kGroup) * Split<T>::kGroupBytes;
  }
  // The factors of block b of row r (its group's).
  __device__ __forceinline__ const uint8_t* block_factors(int64_t r, int64_t b) const {
    return row_factors(r) + (b / Split<T>::kGroup) * Split<T>::kGroupBytes;
  }
};

// A block of 32 weights of a quantized row in registers: codes (kWide: 32 signed bytes, else 16
// bytes of nibbles) and the factors of block_term (matvec.cuh): d and m (Q6_K: the scales of its
// two halves).
template <DType T>
struct WBlock {
  uint4 c[Split<T>::kWide ? 2 : 1];
  float d = 0.0f, m = 0.0f;
};
// Four bits x (bit i: byte i's) spread to bit 0 of each byte of a word.
__device__ __forceinline__ unsigned spread_bits4(unsigned x) { return (x & 15u) * 0x00204081u & 0x01010101u; }
template <DType T>
__device__ __forceinline__ void load_block(const SplitRows<T>& w, int64_t r, int64_t b, WBlock<T>& o) {
  const uint8_t* f = w.block_factors(r, b);
  constexpr bool kFifth = T == DType::Q5_0 || T == DType::Q5_1 || T == DType::Q5_K;
  if constexpr (kFifth || T == DType::Q6_K) {
    // 4-byte loads (a block's codes start 4-byte aligned); the 5- or 6-bit codes as bytes.
    const unsigned* c = reinterpret_cast<const unsigned*>(w.row_codes(r) + b * Split<T>::kCodeBytes);
    unsigned v[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = c[k] & 0x0F0F0F0Fu, v[k + 4] = (c[k] >> 4) & 0x0F0F0F0Fu;
    if constexpr (kFifth) {
      const unsigned qh = c[4];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        v[k] |= spread_bits4(qh >> (4 * k)) << 4;
        // Q5_0: q - 16 in each byte, (q + 0x70) ^ 0x80 (no borrow across bytes for q < 32).
        if constexpr (T == DType::Q5_0) v[k] = (v[k] + 0x70707070u) ^ 0x80808080u;
      }
    } else {
      const unsigned hb[2] = {c[4], c[5]};  // the 2-bit pairs of elements 0-15, 16-31
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const unsigned x = (hb[k / 4] >> (8 * (k % 4))) & 0xFFu;
        const unsigned hi = (x & 3u) | ((x >> 2) & 3u) << 8 | ((x >> 4) & 3u) << 16 | ((x >> 6) & 3u) << 24;
        // q - 32 in each byte: (q + 0x60) ^ 0x80, no borrow across bytes for q < 64.
        v[k] = ((v[k] | hi << 4) + 0x60606060u) ^ 0x80808080u;
      }
    }
    o.c[0] = make_uint4(v[0], v[1], v[2], v[3]);
    o.c[1] = make_uint4(v[4], v[5], v[6], v[7]);
  } else {
    const uint4* c = reinterpret_cast<const uint4*>(w.row_codes(r)) + b * (Split<T>::kCodeBytes / 16);
#pragma unroll
    for (int i = 0; i < Split<T>::kCodeBytes / 16; ++i) o.c[i] = c[i];
  }
  if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    // Sub-block j = b % 8: x = d sc q - dmin m with 6-bit sc and m (tensor/kquant_scales.hpp), so
    // Q4_1's factors d sc and -dmin m (exact in float).
    uint8_t sc, m;
    kquant_scale_min(f + 4, static_cast<int>(b % 8), sc, m);
    o.d = half_at(f) * static_cast<float>(sc);
    o.m = -(half_at(f + 2) * static_cast<float>(m));
  } else if constexpr (T == DType::Q6_K) {  // x = d sc (q - 32), a scale for each 16 elements
    const int j = static_cast<int>(b % 8);
    o.d = half_at(f + 16) * static_cast<float>(static_cast<int8_t>(f[2 * j]));
    o.m = half_at(f + 16) * static_cast<float>(static_cast<int8_t>(f[2 * j + 1]));
  } else {
    o.d = half_at(f);
    if constexpr (T == DType::Q4_1 || T == DType::Q5_1) o.m = half_at(f + 2);
  }
}

// Eight consecutive values of a float or fp16 row from j on (16-byte aligned loads).
__device__ __forceinline__ void load8(const float* row, int64_t j, float (&w)[8]) {
  const float4 a = reinterpret_cast<const float4*>(row + j)[0], b = reinterpret_cast<const float4*>(row + j)[1];
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}
__device__ __forceinline__ void load8(const __half* row, int64_t j, float (&w)[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(row + j);
  const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // the halves out of the words by value (no type punning)
    w[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[i] & 0xffffu)));
    w[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[i] >> 16)));
  }
}

// Activations rounded to 8 bits on the device (quantize_q8): n_tokens rows of nb blocks, every
// block's 32 codes first (token after token), then every block's (d, s) as two fp16 (d first), read
// as one 32-bit word and split by value.
struct Q8Acts {
  const uint8_t* codes;
  const uint32_t* ds;
  int64_t nb;
  __device__ __forceinline__ Q8Acts(const void* xq, int64_t n_tokens, int64_t cols)
      : codes(static_cast<const uint8_t*>(xq)),
        ds(reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(xq) + n_tokens * (cols / kQK) * kQK)),
        nb(cols / kQK) {}
};
__device__ __forceinline__ float half_lo(uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
}
__device__ __forceinline__ float half_hi(uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}

// Four bytes as an int from a 2-byte aligned address (Q4_0 and Q8_0 blocks are 18 and 34
// bytes): the i-th int after p.
__device__ __forceinline__ int load_int_b2(const uint8_t* p, int i) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<int>(static_cast<uint32_t>(h[2 * i]) | (static_cast<uint32_t>(h[2 * i + 1]) << 16));
}
// The same from a 4-byte aligned address (Q4_1 and Q8_1 blocks' codes).
__device__ __forceinline__ int load_int_b4(const uint8_t* p, int i) { return reinterpret_cast<const int*>(p)[i]; }

struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// A warp's values combined in a fixed shuffle tree (lane 0 holds the result).
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T s, Op op) {
  for (int o = kWarp / 2; o > 0; o >>= 1) s = op(s, __shfl_down_sync(0xffffffffu, s, o));
  return s;
}
__device__ __forceinline__ float warp_sum(float s) { return warp_reduce(s, SumOp{}); }

// A block's values (blockDim.x threads, a multiple of 32, at most 1024) combined in a fixed
// order: each warp's tree, then a tree over the warps' results; `identity` fills the missing
// warps. Every thread gets the result. `shared` holds 33 values. Like every kernel here, it
// calls warp operations (shuffles, ballots) and barriers uniformly, every thread of a block the
// same number of times (so every warp runs the second tree; warp 0's result is kept): it costs
// nothing here and keeps the kernels correct on runtimes that schedule a block's threads
// cooperatively.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T s, T* shared, T identity, Op op) {
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp, n_warps = blockDim.x / kWarp;
  s = warp_reduce(s, op);
  if (lane == 0) shared[w] = s;
  __syncthreads();
  T t = lane < n_warps ? shared[lane] : identity;
  t = warp_reduce(t, op);
  if (threadIdx.x == 0) shared[32] = t;
  __syncthreads();
  const T r = shared[32];
  __syncthreads();  // before the next call reuses `shared`
  return r;
}
__device__ __forceinline__ float block_sum(float s, float* shared) { return block_reduce(s, shared, 0.0f, SumOp{}); }
__device__ __forceinline__ int block_sum(int s, int* shared) { return block_reduce(s, shared, 0, SumOp{}); }
__device__ __forceinline__ float block_max(float s, float* shared) {
  return block_reduce(s, shared, -INFINITY, MaxOp{});
}

// One block of 32 activations rounded to 8 bits by a warp, lane i holding value i (v = 0 where
// !valid; the warp calls it uniformly): as tensor/quant.cpp's quant_sym8, d = max|x| / 127 and
// the codes from 127 / max|x|, rounded to nearest even; s = d * sum(q). Lane i writes code i to
// codes[i], lane 0 (d, s) to ds[0], ds[1], where valid.
__device__ __forceinline__ void warp_quantize_q8(float v, bool valid, uint8_t* codes, __half* ds) {
  const int lane = threadIdx.x % kWarp;
  const float amax = __shfl_sync(0xffffffffu, warp_reduce(fabsf(v), MaxOp{}), 0);
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  const int r = __float2int_rn(v * id);  // nearest, ties even (the CPU's lrintf)
  const int q = r < -127 ? -127 : r > 127 ? 127 : r;
  const int sum = __shfl_sync(0xffffffffu, warp_reduce(q, SumOp{}), 0);
  if (!valid) return;
  codes[lane] = static_cast<uint8_t>(static_cast<int8_t>(q));
  if (lane == 0) ds[0] = __float2half_rn(d), ds[1] = __float2half_rn(d * static_cast<float>(sum));
}

}  // namespace ember::cuda::detail
