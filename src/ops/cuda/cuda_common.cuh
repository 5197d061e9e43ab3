// What the CUDA sources of ops/cuda/ share (device code, included by .cu files only): error
// checks, launch geometry, the fixed-order warp and block reductions, and element access to the
// GGUF block layouts the kernels read. Template tags are the GGUF type ids (DType): 0 F32,
// 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/error.hpp"

namespace ember::cuda::detail {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA {} failed: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e));
}
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }
inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
inline unsigned grid_of(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

constexpr int kWarp = 32;
constexpr int kQK = 32;        // elements per Q8_0 / Q4_0 / Q4_1 block
constexpr int kQ8Bytes = 34;   // half d + 32 int8
constexpr int kQ4Bytes = 18;   // half d + 16 bytes of nibbles
constexpr int kQ41Bytes = 20;  // half d, half m + 16 bytes of nibbles

__device__ __forceinline__ float half_at(const uint8_t* p) {
  const unsigned short bits = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(bits));
}

template <int T>
struct BlockBytes {  // F32 and F16 have no blocks
  static constexpr int value = 0;
};
template <>
struct BlockBytes<8> {
  static constexpr int value = kQ8Bytes;
};
template <>
struct BlockBytes<2> {
  static constexpr int value = kQ4Bytes;
};
template <>
struct BlockBytes<3> {
  static constexpr int value = kQ41Bytes;
};

// Element j of a row of the given type.
template <int T>
__device__ __forceinline__ float element(const uint8_t* row, int64_t j);
template <>
__device__ __forceinline__ float element<0>(const uint8_t* row, int64_t j) {  // F32
  return reinterpret_cast<const float*>(row)[j];
}
template <>
__device__ __forceinline__ float element<1>(const uint8_t* row, int64_t j) {  // F16
  return __half2float(reinterpret_cast<const __half*>(row)[j]);
}
template <>
__device__ __forceinline__ float element<8>(const uint8_t* row, int64_t j) {  // Q8_0
  const uint8_t* b = row + (j / kQK) * kQ8Bytes;
  return half_at(b) * static_cast<float>(static_cast<int8_t>(b[2 + j % kQK]));
}
template <>
__device__ __forceinline__ float element<2>(const uint8_t* row, int64_t j) {  // Q4_0
  const uint8_t* b = row + (j / kQK) * kQ4Bytes;
  const int jj = static_cast<int>(j % kQK);
  const int q = jj < 16 ? (b[2 + jj] & 0x0F) : (b[2 + jj - 16] >> 4);
  return half_at(b) * static_cast<float>(q - 8);
}
template <>
__device__ __forceinline__ float element<3>(const uint8_t* row, int64_t j) {  // Q4_1
  const uint8_t* b = row + (j / kQK) * kQ41Bytes;
  const int jj = static_cast<int>(j % kQK);
  const int q = jj < 16 ? (b[4 + jj] & 0x0F) : (b[4 + jj - 16] >> 4);
  return half_at(b) * static_cast<float>(q) + half_at(b + 2);
}

constexpr int kQ8_1Bytes = 36;  // BlockQ8_1 (tensor/quant.hpp): half d, half s, 32 int8

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
// warps. Every thread gets the result. `shared` holds 33 floats. Like every kernel here, it
// calls warp operations (shuffles, ballots) and barriers uniformly, every thread of a block the
// same number of times (so every warp runs the second tree; warp 0's result is kept): it costs
// nothing here and keeps the kernels correct on runtimes that schedule a block's threads
// cooperatively.
template <class Op>
__device__ __forceinline__ float block_reduce(float s, float* shared, float identity, Op op) {
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp, n_warps = blockDim.x / kWarp;
  s = warp_reduce(s, op);
  if (lane == 0) shared[w] = s;
  __syncthreads();
  float t = lane < n_warps ? shared[lane] : identity;
  t = warp_reduce(t, op);
  if (threadIdx.x == 0) shared[32] = t;
  __syncthreads();
  const float r = shared[32];
  __syncthreads();  // before the next call reuses `shared`
  return r;
}
__device__ __forceinline__ float block_sum(float s, float* shared) { return block_reduce(s, shared, 0.0f, SumOp{}); }
__device__ __forceinline__ float block_max(float s, float* shared) {
  return block_reduce(s, shared, -INFINITY, MaxOp{});
}

}  // namespace ember::cuda::detail
