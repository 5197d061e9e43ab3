// CUDA kernels of the hybrid engine; see cuda_ops.hpp. Written for clarity and a fixed
// summation order first (one warp per output row, lanes over blocks, a fixed shuffle tree).
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.hpp"

namespace ember::cuda {

using namespace detail;

namespace {

// One lane's share of dot(row, x): float rows (F32, F16) times float x, lanes over elements.
template <int T>
__device__ float lane_dot_float(const uint8_t* row, const float* x, int64_t cols, int lane) {
  float s = 0.0f;
  for (int64_t j = lane; j < cols; j += kWarp) s += element<T>(row, j) * x[j];
  return s;
}

// One lane's share of dot(row, x) for a quantized row (Q4_0, Q4_1, Q8_0) and x in Q8_1 blocks:
// lanes take blocks of 32 round robin; a block's codes are multiplied in integers (dp4a), then
// scaled once: d_w d_x sum(q_w q_x) (Q4_0: q_w - 8, taken off as 8 sum(q_x); Q4_1: plus m_w s_x).
template <int T>
__device__ float lane_dot_q8(const uint8_t* row, const uint8_t* xq, int64_t cols, int lane) {
  float s = 0.0f;
  const int64_t nb = cols / kQK;
  for (int64_t b = lane; b < nb; b += kWarp) {
    const uint8_t* wb = row + b * BlockBytes<T>::value;
    const uint8_t* xb = xq + b * kQ8_1Bytes;
    const uint8_t* xqs = xb + 4;
    const float dd = half_at(wb) * half_at(xb);
    int isum = 0;
    if (T == 8) {
      for (int i = 0; i < 8; ++i) isum = __dp4a(load_int_b2(wb + 2, i), load_int_b4(xqs, i), isum);
      s += dd * static_cast<float>(isum);
    } else if (T == 2) {
      int xsum = 0;
      for (int i = 0; i < 4; ++i) {
        const int v = load_int_b2(wb + 2, i), u0 = load_int_b4(xqs, i), u1 = load_int_b4(xqs, i + 4);
        isum = __dp4a(v & 0x0F0F0F0F, u0, isum);           // codes of elements 4i .. 4i + 3
        isum = __dp4a((v >> 4) & 0x0F0F0F0F, u1, isum);    // and of 16 + 4i ..
        xsum = __dp4a(0x01010101, u0, __dp4a(0x01010101, u1, xsum));
      }
      s += dd * static_cast<float>(isum - 8 * xsum);
    } else {  // Q4_1
      for (int i = 0; i < 4; ++i) {
        const int v = load_int_b4(wb + 4, i);
        isum = __dp4a(v & 0x0F0F0F0F, load_int_b4(xqs, i), isum);
        isum = __dp4a((v >> 4) & 0x0F0F0F0F, load_int_b4(xqs, i + 4), isum);
      }
      s += dd * static_cast<float>(isum) + half_at(wb + 2) * half_at(xb + 2);
    }
  }
  return s;
}

size_t row_size(DType type, int64_t cols) { return row_bytes(type, cols); }

constexpr int kRowsPerBlock = 4;  // warps per block, one row each

// x: floats (F32, F16 rows) or Q8_1 blocks (quantized rows), token t's at t * cols values.
template <int T>
__global__ void matvec_kernel(const uint8_t* W, size_t row_stride, int64_t cols, int64_t rows, const int32_t* ids,
                              const int32_t* n_ids, const void* x, float* y, int64_t y_stride) {
  const int lane = threadIdx.x % kWarp;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int64_t t = blockIdx.y;
  const int64_t n = n_ids ? *n_ids : rows;
  const bool valid = i < n;  // a warp past the end still takes part in the (uniform) shuffles
  float d = 0.0f;
  if (valid) {
    const uint8_t* row = W + (ids ? ids[i] : i) * row_stride;
    if constexpr (T == 0 || T == 1)
      d = lane_dot_float<T>(row, static_cast<const float*>(x) + t * cols, cols, lane);
    else
      d = lane_dot_q8<T>(row, static_cast<const uint8_t*>(x) + t * (cols / kQK) * kQ8_1Bytes, cols, lane);
  }
  const float s = warp_sum(d);
  if (valid && lane == 0) y[t * y_stride + i] = s;
}

// A warp per block of 32 values (of n_blocks over all tokens): max |x|, the codes, their sum.
__global__ void quantize_q8_kernel(const float* x, int64_t n_blocks, uint8_t* xq) {
  const int lane = threadIdx.x % kWarp;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const bool valid = blk < n_blocks;
  const float v = valid ? x[blk * kQK + lane] : 0.0f;
  const float amax = __shfl_sync(0xffffffffu, warp_reduce(fabsf(v), MaxOp{}), 0);
  // As tensor/quant.cpp's quant_sym8: d = amax / 127, the codes from id = 127 / amax.
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  const int r = __float2int_rn(v * id);  // nearest, ties even (the CPU's lrintf)
  const int q = r < -127 ? -127 : r > 127 ? 127 : r;
  const int sum = __shfl_sync(0xffffffffu, warp_reduce(q, SumOp{}), 0);
  if (!valid) return;
  uint8_t* b = xq + blk * kQ8_1Bytes;
  b[4 + lane] = static_cast<uint8_t>(static_cast<int8_t>(q));
  if (lane == 0) {
    reinterpret_cast<__half*>(b)[0] = __float2half_rn(d);
    reinterpret_cast<__half*>(b)[1] = __float2half_rn(d * static_cast<float>(sum));
  }
}

// Block-wide compaction step, in thread order: every thread of the block calls it with its
// flag; a flagged thread gets its slot among this chunk's flagged threads in *slot. Returns the
// chunk's count (the same in every thread).
__device__ int block_compact(int flag, int* slot) {
  __shared__ int warp_base[32];
  __shared__ int chunk_total;
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp, n_warps = blockDim.x / kWarp;
  const unsigned m = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_base[w] = __popc(m);
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (int q = 0; q < n_warps; ++q) {
      const int c = warp_base[q];
      warp_base[q] = s;
      s += c;
    }
    chunk_total = s;
  }
  __syncthreads();
  *slot = warp_base[w] + __popc(m & ((1u << lane) - 1u));
  const int total = chunk_total;
  __syncthreads();  // before the next chunk overwrites the shared counts
  return total;
}

// Block (column tile, chunk, token): the partial sum over chunk c's share of the active rows
// (rows c, c + kAxpyChunks, ... : interleaved, so that chunks stay even however many fire).
template <int T>
__global__ void axpy_kernel(const uint8_t* D, size_t row_stride, int64_t cols, const int32_t* active,
                            const int32_t* n_active, const float* h, int64_t h_stride, float* partial) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t c = blockIdx.y, n_chunks = gridDim.y, t = blockIdx.z, n_tokens = gridDim.z;
  if (j >= cols) return;
  const int32_t na = *n_active;
  float s = 0.0f;
  for (int64_t k = c; k < na; k += n_chunks) {
    const float hv = h[t * h_stride + k];
    if (hv != 0.0f) s += hv * element<T>(D + static_cast<int64_t>(active[k]) * row_stride, j);
  }
  partial[(c * n_tokens + t) * cols + j] = s;
}

// out[t][j] = the chunks' partial sums added in chunk order.
__global__ void axpy_reduce_kernel(const float* partial, int64_t n_chunks, int64_t cols, int64_t n_tokens, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= cols * n_tokens) return;
  float s = 0.0f;
  for (int64_t c = 0; c < n_chunks; ++c) s += partial[c * n_tokens * cols + i];
  out[i] = s;
}

__global__ void relu_kernel(float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(y[i], 0.0f);
}

// One block: the share's predicted positions compacted in order (as fire_kernel), the CPU's
// positions into the mask.
__global__ void predict_select_kernel(const float* scores, int64_t n_ff, int64_t n_tokens, float threshold, int64_t k,
                                      uint8_t* mask, int32_t* cand, int32_t* n_cand) {
  int base = 0;  // the same in every thread
  for (int64_t start = 0; start < n_ff; start += blockDim.x) {
    const int64_t i = start + threadIdx.x;
    int flag = 0;
    if (i < n_ff)
      for (int64_t t = 0; t < n_tokens && !flag; ++t) flag = scores[t * n_ff + i] >= threshold;
    if (i >= k && i < n_ff) mask[i - k] = static_cast<uint8_t>(flag);
    const int share_flag = flag && i < k;
    int slot = 0;
    const int total = block_compact(share_flag, &slot);
    if (share_flag) cand[base + slot] = static_cast<int32_t>(i);
    base += total;
  }
  if (threadIdx.x == 0) *n_cand = base;
}

__device__ __forceinline__ float activate(int act, float x) {
  switch (act) {
    case 0: return x / (1.0f + expf(-x));  // silu
    case 1: return x > 0.0f ? x : 0.0f;    // relu
    default: {
      const float k = 0.7978845608028654f;
      return 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x)));
    }
  }
}

// One block: activation and threshold for every (token, position), then the firing positions
// compacted in order (a block-wide scan per chunk of blockDim positions).
__global__ void fire_kernel(int act, float threshold, float* y, int64_t n, int64_t n_tokens, const int32_t* rows,
                            int32_t* active, int32_t* pos, int32_t* n_active, const int32_t* n_valid) {
  __shared__ unsigned long long fired_pairs;
  if (threadIdx.x == 0) fired_pairs = 0;
  __syncthreads();
  int base = 0;  // the same in every thread
  int my_fired = 0;
  const int64_t count = n_valid ? *n_valid : n;  // positions to test; n stays the row stride
  for (int64_t start = 0; start < count; start += blockDim.x) {
    const int64_t i = start + threadIdx.x;
    int flag = 0;
    if (i < count) {
      for (int64_t t = 0; t < n_tokens; ++t) {
        float v = activate(act, y[t * n + i]);
        if (fabsf(v) > threshold) flag = 1, ++my_fired;
        else v = 0.0f;
        y[t * n + i] = v;
      }
    }
    int slot = 0;
    const int total = block_compact(flag, &slot);
    if (flag) {
      active[base + slot] = rows[i];
      pos[base + slot] = static_cast<int32_t>(i);
    }
    base += total;
  }
  atomicAdd(&fired_pairs, static_cast<unsigned long long>(my_fired));  // integers: order-free
  __syncthreads();
  if (threadIdx.x == 0) {
    n_active[0] = base;
    n_active[1] = static_cast<int32_t>(fired_pairs);
  }
}

__global__ void gate_mul_kernel(float* h, const float* act, int64_t n, const int32_t* pos, const int32_t* n_active,
                                int64_t max_rows) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t t = blockIdx.y;
  if (k >= *n_active) return;
  h[t * max_rows + k] *= act[t * n + pos[k]];
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

void check_type(DType type, int64_t cols) {
  EMBER_CHECK(supports(type), "CUDA kernels do not read {} weights (F32, F16, Q8_0, Q4_0, Q4_1)", dtype_name(type));
  EMBER_CHECK(cols % info(type).block_size == 0, "CUDA: row length {} is not a multiple of {}'s block size", cols,
              dtype_name(type));
}

void launch_matvec(DType type, const void* W, int64_t cols, int64_t rows, const int32_t* ids, const int32_t* n_ids,
                   Activations a, int64_t n_tokens, float* y, int64_t y_stride, void* stream) {
  check_type(type, cols);
  if (rows == 0 || n_tokens == 0) return;
  const void* x = takes_q8(type) ? a.q8 : static_cast<const void*>(a.f);
  EMBER_CHECK(x, "CUDA matvec: {} rows need {} activations", dtype_name(type), takes_q8(type) ? "Q8_1" : "float");
  const dim3 grid(grid_of(rows, kRowsPerBlock), static_cast<unsigned>(n_tokens));
  const dim3 block(kRowsPerBlock * kWarp);
  const auto* w = static_cast<const uint8_t*>(W);
  const size_t rs = row_size(type, cols);
  cudaStream_t s = as_stream(stream);
  switch (type) {
    case DType::F32: matvec_kernel<0><<<grid, block, 0, s>>>(w, rs, cols, rows, ids, n_ids, x, y, y_stride); break;
    case DType::F16: matvec_kernel<1><<<grid, block, 0, s>>>(w, rs, cols, rows, ids, n_ids, x, y, y_stride); break;
    case DType::Q8_0: matvec_kernel<8><<<grid, block, 0, s>>>(w, rs, cols, rows, ids, n_ids, x, y, y_stride); break;
    case DType::Q4_1: matvec_kernel<3><<<grid, block, 0, s>>>(w, rs, cols, rows, ids, n_ids, x, y, y_stride); break;
    default: matvec_kernel<2><<<grid, block, 0, s>>>(w, rs, cols, rows, ids, n_ids, x, y, y_stride); break;
  }
  check_launch("matvec kernel");
}

}  // namespace

bool available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device found";
    return false;
  }
  return true;
}

std::string device_name() {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  return p.name;
}

void* malloc_device(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return p;
}
void free_device(void* p) { cudaFree(p); }
void* malloc_host_pinned(size_t bytes) {
  void* p = nullptr;
  check(cudaMallocHost(&p, bytes == 0 ? 1 : bytes), "cudaMallocHost");
  return p;
}
void free_host_pinned(void* p) { cudaFreeHost(p); }
void* stream_create() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}
void stream_destroy(void* s) { cudaStreamDestroy(as_stream(s)); }
void stream_sync(void* s) { check(cudaStreamSynchronize(as_stream(s)), "cudaStreamSynchronize"); }
void copy_to_device(void* dst, const void* src, size_t bytes, void* s) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(s)), "cudaMemcpyAsync (to device)");
}
void copy_to_host(void* dst, const void* src, size_t bytes, void* s) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(s)), "cudaMemcpyAsync (to host)");
}
void copy_to_device_sync(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (to device)");
}
void mem_info(size_t* free_bytes, size_t* total_bytes) {
  check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}
void copy_to_host_sync(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (to host)");
}

bool takes_q8(DType t) { return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0; }

void quantize_q8(const float* x, int64_t n_tokens, int64_t cols, void* xq, void* stream) {
  EMBER_CHECK(cols % kQK == 0, "CUDA quantize_q8: rows of {} values (a multiple of 32)", cols);
  const int64_t n_blocks = n_tokens * cols / kQK;
  if (n_blocks == 0) return;
  constexpr int kWarpsPerBlock = 8;
  quantize_q8_kernel<<<grid_of(n_blocks, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0, as_stream(stream)>>>(
      x, n_blocks, static_cast<uint8_t*>(xq));
  check_launch("quantize_q8 kernel");
}

bool supports(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1;
}

void matvec(DType type, const void* W, int64_t cols, int64_t rows, Activations x, int64_t n_tokens, float* y,
            void* stream) {
  launch_matvec(type, W, cols, rows, nullptr, nullptr, x, n_tokens, y, rows, stream);
}

void gather_matvec(DType type, const void* W, int64_t cols, const int32_t* rows, const int32_t* n_rows,
                   int64_t max_rows, Activations x, int64_t n_tokens, float* y, int64_t y_stride, void* stream) {
  launch_matvec(type, W, cols, max_rows, rows, n_rows, x, n_tokens, y, y_stride, stream);
}

void ffn_fire(cpu::Activation act, float threshold, float* y, int64_t n, int64_t n_tokens, const int32_t* rows,
              int32_t* active, int32_t* pos, int32_t* n_active, void* stream, const int32_t* n_valid) {
  const int a = act == cpu::Activation::silu ? 0 : act == cpu::Activation::relu ? 1 : 2;
  fire_kernel<<<1, 1024, 0, as_stream(stream)>>>(a, threshold, y, n, n_tokens, rows, active, pos, n_active, n_valid);
  check_launch("fire kernel");
}

void relu(float* y, int64_t n, void* stream) {
  if (n == 0) return;
  relu_kernel<<<grid_of(n, 256), 256, 0, as_stream(stream)>>>(y, n);
  check_launch("relu kernel");
}

void predict_select(const float* scores, int64_t n_ff, int64_t n_tokens, float threshold, int64_t k, uint8_t* mask,
                    int32_t* cand, int32_t* n_cand, void* stream) {
  predict_select_kernel<<<1, 1024, 0, as_stream(stream)>>>(scores, n_ff, n_tokens, threshold, k, mask, cand, n_cand);
  check_launch("predict_select kernel");
}

void* event_create() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}
void event_destroy(void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
void event_record(void* e, void* s) { check(cudaEventRecord(static_cast<cudaEvent_t>(e), as_stream(s)), "cudaEventRecord"); }
void event_sync(void* e) { check(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize"); }

void gate_mul(float* h, const float* act, int64_t n, const int32_t* pos, const int32_t* n_active, int64_t max_rows,
              int64_t n_tokens, void* stream) {
  if (max_rows == 0 || n_tokens == 0) return;
  gate_mul_kernel<<<dim3(grid_of(max_rows, 256), static_cast<unsigned>(n_tokens)), 256, 0, as_stream(stream)>>>(
      h, act, n, pos, n_active, max_rows);
  check_launch("gate_mul kernel");
}

void sparse_axpy(DType type, const void* D, int64_t cols, const int32_t* active, const int32_t* n_active,
                 const float* h, int64_t h_stride, int64_t n_tokens, float* out, float* partial, void* stream) {
  check_type(type, cols);
  if (cols == 0 || n_tokens == 0) return;
  // The partial sums take at most kAxpyChunks * cols floats: fewer chunks for more tokens (the
  // tokens are parallel work of their own).
  const int64_t n_chunks = std::max<int64_t>(1, kAxpyChunks / n_tokens);
  const dim3 grid(grid_of(cols, 256), static_cast<unsigned>(n_chunks), static_cast<unsigned>(n_tokens));
  const auto* d = static_cast<const uint8_t*>(D);
  const size_t rs = row_size(type, cols);
  cudaStream_t s = as_stream(stream);
  switch (type) {
    case DType::F32: axpy_kernel<0><<<grid, 256, 0, s>>>(d, rs, cols, active, n_active, h, h_stride, partial); break;
    case DType::F16: axpy_kernel<1><<<grid, 256, 0, s>>>(d, rs, cols, active, n_active, h, h_stride, partial); break;
    case DType::Q8_0: axpy_kernel<8><<<grid, 256, 0, s>>>(d, rs, cols, active, n_active, h, h_stride, partial); break;
    case DType::Q4_1: axpy_kernel<3><<<grid, 256, 0, s>>>(d, rs, cols, active, n_active, h, h_stride, partial); break;
    default: axpy_kernel<2><<<grid, 256, 0, s>>>(d, rs, cols, active, n_active, h, h_stride, partial); break;
  }
  check_launch("sparse_axpy kernel");
  axpy_reduce_kernel<<<grid_of(cols * n_tokens, 256), 256, 0, s>>>(partial, n_chunks, cols, n_tokens, out);
  check_launch("sparse_axpy reduce kernel");
}

void add(const float* a, const float* b, float* out, int64_t n, void* stream) {
  if (n == 0) return;
  add_kernel<<<grid_of(n, 256), 256, 0, as_stream(stream)>>>(a, b, out, n);
  check_launch("add kernel");
}

}  // namespace ember::cuda
