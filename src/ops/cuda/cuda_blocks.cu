// CUDA kernels of the attention block and the FFN block's norms; see cuda_blocks.hpp.
#include <cmath>

#include "ops/cuda/cuda_blocks.hpp"
#include "ops/cuda/cuda_common.cuh"

namespace ember::cuda {

using namespace detail;

namespace {

constexpr int kNormThreads = 256;

// One block per row.
__global__ void rms_norm_kernel(const float* x, const float* w, float* out, int64_t width, float eps) {
  __shared__ float red[33];
  const float* xr = x + blockIdx.x * width;
  float* o = out + blockIdx.x * width;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) s += xr[i] * xr[i];
  s = block_sum(s, red);
  const float scale = static_cast<float>(1.0 / sqrt(static_cast<double>(s) / static_cast<double>(width) + eps));
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) o[i] = w ? xr[i] * scale * w[i] : xr[i] * scale;
}

__global__ void layer_norm_kernel(const float* x, const float* w, const float* b, float* out, int64_t width,
                                  float eps) {
  __shared__ float red[33];
  const float* xr = x + blockIdx.x * width;
  float* o = out + blockIdx.x * width;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) s += xr[i];
  const float mean = block_sum(s, red) / static_cast<float>(width);
  float v = 0.0f;  // two passes, as the CPU: no cancellation when the mean is large
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
  v = block_sum(v, red);
  const float scale = static_cast<float>(1.0 / sqrt(static_cast<double>(v) / static_cast<double>(width) + eps));
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    float y = (xr[i] - mean) * scale;
    if (w) y *= w[i];
    if (b) y += b[i];
    o[i] = y;
  }
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t rows, int64_t width) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * width) y[i] += b[i % width];
}

__global__ void add_inplace_kernel(float* y, const float* x, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void softcap_kernel(float* y, int64_t n, float cap) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = cap * tanhf(y[i] / cap);
}

// Block (head, token), threads over the pairs.
__global__ void rope_kernel(float* x, int64_t n_heads, int64_t head_dim, int64_t pos0, const double* inv_freq,
                            int64_t n_rot, double attn_factor, bool neox) {
  const int64_t h = blockIdx.x, t = blockIdx.y, half = n_rot / 2;
  float* xh = x + (t * n_heads + h) * head_dim;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const double theta = static_cast<double>(pos0 + t) * inv_freq[i];
    const float c = static_cast<float>(attn_factor * cos(theta));
    const float s = static_cast<float>(attn_factor * sin(theta));
    const int64_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    const float a = xh[ia], b = xh[ib];
    xh[ia] = a * c - b * s;
    xh[ib] = a * s + b * c;
  }
}

__global__ void kv_store_kernel(const float* rows, int64_t count, void* cache, int64_t offset, bool f16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  if (f16)
    static_cast<__half*>(cache)[offset + i] = __float2half_rn(rows[i]);
  else
    static_cast<float*>(cache)[offset + i] = rows[i];
}

template <bool F16>
__device__ __forceinline__ float cache_at(const void* c, int64_t i) {
  if (F16) return __half2float(static_cast<const __half*>(c)[i]);
  return static_cast<const float*>(c)[i];
}

constexpr int kMaxHeadDim = 256;

// Block (head, token, chunk) of attn_threads(head_dim) threads, over the token's visible
// positions in chunk c ([c kAttnChunk, (c + 1) kAttnChunk)). Scores: a warp per position (lanes
// over the head's dimensions, a fixed shuffle tree), into the token's scores at their positions;
// the chunk's max m, the sum l of exp(score - m), and out = sum exp(score - m) v by groups of
// head_dim threads over interleaved positions, added in group order. One chunk: out / l is the
// output; more: (m, l, out) go to `partial` for attention_merge_kernel. An empty chunk (outside
// a sliding window, or after the token) gives m = -inf, l = 0, out = 0.
template <bool F16>
__global__ void attention_kernel(AttentionArgs a, const float* q, int64_t pos0, const void* k, const void* v,
                                 float* out, float* scores, float* partial) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float red[33];
  __shared__ float part[kMaxHeadDim * 2];
  const int64_t h = blockIdx.x, t = blockIdx.y, c = blockIdx.z, n_chunks = gridDim.z, hd = a.head_dim;
  const int64_t kvh = h / (a.n_head / a.n_head_kv), stride = a.n_head_kv * hd;
  const int64_t pos = pos0 + t;
  const int64_t first = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
  const int64_t lo = first > c * kAttnChunk ? first : c * kAttnChunk;
  const int64_t hi = pos + 1 < (c + 1) * kAttnChunk ? pos + 1 : (c + 1) * kAttnChunk;
  const int64_t n_pos = hi > lo ? hi - lo : 0;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, n_warps = blockDim.x / kWarp;
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[(t * a.n_head + h) * hd + i];
  __syncthreads();
  float* sc = scores + (t * a.n_head + h) * a.n_ctx + lo;
  float mx = -INFINITY;
  for (int64_t base = 0; base < n_pos; base += n_warps) {  // rounds: every warp shuffles alike
    const int64_t p = base + warp;
    float d = 0.0f;
    if (p < n_pos) {
      const int64_t row = (lo + p) * stride + kvh * hd;
      for (int64_t i = lane; i < hd; i += kWarp) d += qs[i] * cache_at<F16>(k, row + i);
    }
    d = warp_sum(d) * a.scale;
    if (lane == 0 && p < n_pos) sc[p] = d, mx = fmaxf(mx, d);
  }
  __syncthreads();
  mx = block_max(mx, red);
  float sum = 0.0f;
  for (int64_t p = threadIdx.x; p < n_pos; p += blockDim.x) {
    const float e = expf(sc[p] - mx);
    sc[p] = e;
    sum += e;
  }
  sum = block_sum(sum, red);  // its barriers make the exponentials visible to the whole block
  const int64_t groups = blockDim.x / hd;  // >= 1: attn_threads(hd) >= hd
  const int64_t g = threadIdx.x / hd, i = threadIdx.x % hd;
  if (g < groups) {
    float acc = 0.0f;
    for (int64_t p = g; p < n_pos; p += groups) acc += sc[p] * cache_at<F16>(v, (lo + p) * stride + kvh * hd + i);
    part[g * hd + i] = acc;
  }
  __syncthreads();
  if (threadIdx.x < hd) {
    float o = 0.0f;
    for (int64_t gg = 0; gg < groups; ++gg) o += part[gg * hd + threadIdx.x];
    if (n_chunks == 1) {
      out[(t * a.n_head + h) * hd + threadIdx.x] = o / sum;
    } else {
      float* pc = partial + ((t * a.n_head + h) * n_chunks + c) * (hd + 2);
      pc[2 + threadIdx.x] = o;
      if (threadIdx.x == 0) pc[0] = mx, pc[1] = sum;
    }
  }
}

// Block (head, token), threads over the head's values: the chunks' partial softmaxes merged in
// chunk order, out = sum_c exp(m_c - M) out_c / sum_c exp(m_c - M) l_c with M = max_c m_c.
__global__ void attention_merge_kernel(int64_t n_head, int64_t head_dim, int64_t n_chunks, const float* partial,
                                       float* out) {
  const int64_t h = blockIdx.x, t = blockIdx.y;
  const float* pt = partial + (t * n_head + h) * n_chunks * (head_dim + 2);
  float m = -INFINITY;
  for (int64_t c = 0; c < n_chunks; ++c) m = fmaxf(m, pt[c * (head_dim + 2)]);
  for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float l = 0.0f, o = 0.0f;
    for (int64_t c = 0; c < n_chunks; ++c) {
      const float* pc = pt + c * (head_dim + 2);
      if (pc[1] == 0.0f) continue;  // an empty chunk
      const float w = expf(pc[0] - m);
      l += w * pc[1];
      o += w * pc[2 + i];
    }
    out[(t * n_head + h) * head_dim + i] = o / l;
  }
}

// Threads of an attention block: at least the head size, a multiple of 32, 128 or 256.
int attn_threads(int64_t head_dim) { return head_dim <= 128 ? 128 : 256; }

}  // namespace

void norm_rows(const float* x, const float* w, const float* b, float* out, int64_t rows, int64_t width, float eps,
               bool layer_norm, void* stream) {
  if (rows == 0) return;
  cudaStream_t s = as_stream(stream);
  if (layer_norm)
    layer_norm_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, s>>>(x, w, b, out, width, eps);
  else
    rms_norm_kernel<<<static_cast<unsigned>(rows), kNormThreads, 0, s>>>(x, w, out, width, eps);
  check_launch("norm kernel");
}

void add_bias(float* y, const float* b, int64_t rows, int64_t width, void* stream) {
  if (rows * width == 0) return;
  add_bias_kernel<<<grid_of(rows * width, 256), 256, 0, as_stream(stream)>>>(y, b, rows, width);
  check_launch("add_bias kernel");
}

void add_inplace(float* y, const float* x, int64_t n, void* stream) {
  if (n == 0) return;
  add_inplace_kernel<<<grid_of(n, 256), 256, 0, as_stream(stream)>>>(y, x, n);
  check_launch("add_inplace kernel");
}

void softcap(float* y, int64_t n, float cap, void* stream) {
  if (n == 0) return;
  softcap_kernel<<<grid_of(n, 256), 256, 0, as_stream(stream)>>>(y, n, cap);
  check_launch("softcap kernel");
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t pos0, const double* inv_freq,
          int64_t n_rot, double attn_factor, bool neox, void* stream) {
  EMBER_CHECK(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim, "CUDA rope: {} rotated dimensions of {}", n_rot,
              head_dim);
  if (n_tokens == 0 || n_heads == 0) return;
  rope_kernel<<<dim3(static_cast<unsigned>(n_heads), static_cast<unsigned>(n_tokens)), 64, 0, as_stream(stream)>>>(
      x, n_heads, head_dim, pos0, inv_freq, n_rot, attn_factor, neox);
  check_launch("rope kernel");
}

void kv_store(const float* rows, int64_t n, int64_t row, void* cache, int64_t pos0, bool f16, void* stream) {
  if (n * row == 0) return;
  kv_store_kernel<<<grid_of(n * row, 256), 256, 0, as_stream(stream)>>>(rows, n * row, cache, pos0 * row, f16);
  check_launch("kv_store kernel");
}

void attention(const AttentionArgs& a, const float* q, int64_t n_tokens, int64_t pos0, const void* k_cache,
               const void* v_cache, float* out, float* scores, float* partial, void* stream) {
  EMBER_CHECK(a.head_dim >= 1 && a.head_dim <= kMaxHeadDim, "CUDA attention: head size {} (1 to {})", a.head_dim,
              kMaxHeadDim);
  EMBER_CHECK(a.n_head_kv >= 1 && a.n_head % a.n_head_kv == 0, "CUDA attention: {} heads over {} KV heads", a.n_head,
              a.n_head_kv);
  EMBER_CHECK(pos0 >= 0 && pos0 + n_tokens <= a.n_ctx, "CUDA attention: positions {}..{} beyond the cache's {}", pos0,
              pos0 + n_tokens - 1, a.n_ctx);
  if (n_tokens == 0) return;
  // Chunks of kAttnChunk positions up to the last token's: they depend on the positions only, so
  // the result does not depend on anything else (deterministic).
  const int64_t n_chunks = attention_chunks(pos0 + n_tokens);
  const dim3 grid(static_cast<unsigned>(a.n_head), static_cast<unsigned>(n_tokens), static_cast<unsigned>(n_chunks));
  const int threads = attn_threads(a.head_dim);
  cudaStream_t s = as_stream(stream);
  if (a.f16)
    attention_kernel<true><<<grid, threads, 0, s>>>(a, q, pos0, k_cache, v_cache, out, scores, partial);
  else
    attention_kernel<false><<<grid, threads, 0, s>>>(a, q, pos0, k_cache, v_cache, out, scores, partial);
  check_launch("attention kernel");
  if (n_chunks > 1) {
    attention_merge_kernel<<<dim3(static_cast<unsigned>(a.n_head), static_cast<unsigned>(n_tokens)), 128, 0, s>>>(
        a.n_head, a.head_dim, n_chunks, partial, out);
    check_launch("attention merge kernel");
  }
}

}  // namespace ember::cuda
