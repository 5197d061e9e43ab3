// CUDA kernels of the attention block and the FFN block's norms; see cuda_blocks.hpp.
#include <cmath>

#include "ops/cuda/cuda_blocks.hpp"
#include "ops/cuda/cuda_common.cuh"

namespace ember::cuda {

using namespace detail;

namespace {

constexpr int kNormThreads = static_cast<int>(kNormSpan);  // a value a thread, out of place

// Sum over row xr of f(x[i]), each thread over its values (runs of four where the row allows),
// then the block's fixed tree: the same in every block of the row.
template <class F>
__device__ __forceinline__ float row_sum(const float* xr, int64_t width, float* red, F f) {
  float s = 0.0f;
  if (width % 4 == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t i = threadIdx.x; i < width / 4; i += blockDim.x) {
      const float4 v = x4[i];
      s += f(v.x) + f(v.y) + f(v.z) + f(v.w);
    }
  } else {
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) s += f(xr[i]);
  }
  return block_sum(s, red);
}

// Block (slice, row): the row's sums, then values slice * span .. + span - 1 normalized (all of
// them with one slice: in place), rounded to 8 bits too with xq (width a multiple of 32).
__global__ void __launch_bounds__(kNormThreads) norm_kernel(const float* x, const float* w, const float* b, float* out,
                                                            int64_t width, float eps, bool layer_norm, int64_t span,
                                                            uint8_t* codes, __half* ds) {
  __shared__ float red[33];
  const int64_t row = blockIdx.y;
  const float* xr = x + row * width;
  float* o = out + row * width;
  float mean = 0.0f, scale;
  if (layer_norm) {
    mean = row_sum(xr, width, red, [](float v) { return v; }) / static_cast<float>(width);
    // Two passes, as the CPU: no cancellation when the mean is large.
    const float var = row_sum(xr, width, red, [mean](float v) { return (v - mean) * (v - mean); });
    scale = static_cast<float>(1.0 / sqrt(static_cast<double>(var) / static_cast<double>(width) + eps));
  } else {
    const float ss = row_sum(xr, width, red, [](float v) { return v * v; });
    scale = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(width) + eps));
  }
  const int64_t first = static_cast<int64_t>(blockIdx.x) * span;
  const int64_t end = first + span < width ? first + span : width;
  for (int64_t base = first; base < end; base += blockDim.x) {  // the same count in every thread
    const int64_t i = base + threadIdx.x;
    const bool valid = i < end;
    float y = 0.0f;
    if (valid) {
      y = layer_norm ? (xr[i] - mean) * scale : xr[i] * scale;
      if (w) y *= w[i];
      if (b) y += b[i];
      o[i] = y;
    }
    if (codes) {  // a warp's 32 values are one block of 32 (width % 32 == 0)
      const int64_t blk = (row * width + base) / kQK + threadIdx.x / kWarp;
      warp_quantize_q8(y, valid, codes + blk * kQK, ds + 2 * blk);
    }
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

// Block (head of q then of k, token): the head's pairs rotated; for a k head also its k and v
// rows stored into the caches at the token's position.
__global__ void rope_store_kernel(float* q, float* k, const float* v, int64_t n_head, int64_t n_head_kv,
                                  int64_t head_dim, const int32_t* pos0, RopeArgs r, void* kc, void* vc, bool f16) {
  const int64_t hh = blockIdx.x, t = blockIdx.y, pos = *pos0 + t;
  const bool is_k = hh >= n_head;
  const int64_t h = is_k ? hh - n_head : hh;
  float* xh = is_k ? k + (t * n_head_kv + h) * head_dim : q + (t * n_head + h) * head_dim;
  if (r.inv_freq) {
    const int64_t half = r.n_rot / 2;
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      const double theta = static_cast<double>(pos) * r.inv_freq[i];
      const float c = static_cast<float>(r.attn_factor * cos(theta));
      const float s = static_cast<float>(r.attn_factor * sin(theta));
      const int64_t ia = r.neox ? i : 2 * i, ib = r.neox ? i + half : 2 * i + 1;
      const float a = xh[ia], b = xh[ib];
      xh[ia] = a * c - b * s;
      xh[ib] = a * s + b * c;
    }
  }
  if (!is_k) return;
  __syncthreads();  // the rotated row, written by other threads, is stored below
  const int64_t row = n_head_kv * head_dim, at = pos * row + h * head_dim;
  const float* vh = v + (t * n_head_kv + h) * head_dim;
  for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) {
    if (f16) {
      static_cast<__half*>(kc)[at + i] = __float2half_rn(xh[i]);
      static_cast<__half*>(vc)[at + i] = __float2half_rn(vh[i]);
    } else {
      static_cast<float*>(kc)[at + i] = xh[i];
      static_cast<float*>(vc)[at + i] = vh[i];
    }
  }
}

template <bool F16>
__device__ __forceinline__ float cache_at(const void* c, int64_t i) {
  if (F16) return __half2float(static_cast<const __half*>(c)[i]);
  return static_cast<const float*>(c)[i];
}

constexpr int kMaxHeadDim = 256;

// The first position a token at `pos` sees: 0, or the start of its sliding window.
__device__ __forceinline__ int64_t first_visible(int64_t pos, int64_t window) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// Block (head, token, chunk) of attn_threads(head_dim) threads, over the token's visible
// positions in chunk c ([c kAttnChunk, (c + 1) kAttnChunk)). Scores: a warp per position (lanes
// over the head's dimensions, a fixed shuffle tree), into the token's scores at their positions;
// the chunk's max m, the sum l of exp(score - m), and out = sum exp(score - m) v by groups of
// head_dim threads over interleaved positions, added in group order. One chunk: out / l is the
// output; more: (m, l, out) go to `partial` for attention_merge_kernel. An empty chunk (outside
// a sliding window, or after the token) gives m = -inf, l = 0, out = 0.
template <bool F16>
__global__ void attention_kernel(AttentionArgs a, const float* q, const int32_t* pos0, const void* k, const void* v,
                                 float* out, float* scores, float* partial) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float red[33];
  __shared__ float part[kMaxHeadDim * 2];
  const int64_t h = blockIdx.x, t = blockIdx.y, c = blockIdx.z, n_chunks = gridDim.z, hd = a.head_dim;
  const int64_t kvh = h / (a.n_head / a.n_head_kv), stride = a.n_head_kv * hd;
  const int64_t pos = *pos0 + t;
  const int64_t first = first_visible(pos, a.window);
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

// Prompts: block (head, tile of kAqTokens tokens) of kAqThreads threads, over the key positions
// kAqKeys at a time, the keys' (and then the values') rows staged in shared memory once for the
// tile's tokens (the per-token kernel reads them once a token). Scores q.k a thread per (token,
// two keys) column after column, scaled; then per token the running softmax (the tile's max m,
// the sum l of exp(score - m), the output rescaled when m grows: FlashAttention's order) and
// out += exp(score - m) v, a thread per value column. The same values as attention_kernel to float
// rounding: its sums run in another order.
constexpr int kAqTokens = 16, kAqKeys = 16, kAqThreads = 128;

template <bool F16>
__global__ void __launch_bounds__(kAqThreads) attention_tiles_kernel(AttentionArgs a, const float* q,
                                                                     const int32_t* pos0, int64_t n_tokens,
                                                                     const void* k, const void* v, float* out) {
  __shared__ float qs[kAqTokens][kMaxHeadDim + 1];   // +1: the tokens' rows in different banks
  __shared__ float kv[kAqKeys][kMaxHeadDim + 1];     // the keys', then the values' rows
  __shared__ float ps[kAqTokens][kAqKeys];           // scores, then exp(score - m)
  __shared__ float row_scale[kAqTokens], row_l[kAqTokens], row_m[kAqTokens];
  const int64_t h = blockIdx.x, t0 = static_cast<int64_t>(blockIdx.y) * kAqTokens, hd = a.head_dim;
  const int64_t kvh = h / (a.n_head / a.n_head_kv), stride = a.n_head_kv * hd;
  const int64_t p0 = *pos0;
  const int nq = static_cast<int>(n_tokens - t0 < kAqTokens ? n_tokens - t0 : kAqTokens);
  const int tid = threadIdx.x;
  for (int i = tid; i < kAqTokens * hd; i += kAqThreads) {
    const int r = i / static_cast<int>(hd), c = i % static_cast<int>(hd);
    qs[r][c] = r < nq ? q[((t0 + r) * a.n_head + h) * hd + c] : 0.0f;
  }
  if (tid < kAqTokens) row_m[tid] = -INFINITY, row_l[tid] = 0.0f;
  // Each thread's value columns (hd <= 256: at most two) of every token's output.
  constexpr int kCols = kMaxHeadDim / kAqThreads;
  float o[kAqTokens][kCols];
#pragma unroll
  for (int r = 0; r < kAqTokens; ++r)
#pragma unroll
    for (int j = 0; j < kCols; ++j) o[r][j] = 0.0f;
  // The keys the tile's tokens see: from the first token's window start to the last token.
  const int64_t last = p0 + t0 + nq - 1;
  const int64_t first = first_visible(p0 + t0, a.window);
  const int sr = tid % kAqTokens, sc0 = tid / kAqTokens;  // scores: token sr, keys sc0 + 8 j
  for (int64_t kb = first; kb <= last; kb += kAqKeys) {
    __syncthreads();  // the previous tile's values are used
    for (int i = tid; i < kAqKeys * hd; i += kAqThreads) {
      const int r = i / static_cast<int>(hd), c = i % static_cast<int>(hd);
      kv[r][c] = kb + r <= last ? cache_at<F16>(k, (kb + r) * stride + kvh * hd + c) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kAqKeys / (kAqThreads / kAqTokens); ++j) {
      const int c = sc0 + (kAqThreads / kAqTokens) * j;  // keys sc0 and sc0 + 8
      const int64_t pos = p0 + t0 + sr, key = kb + c;
      const int64_t lo = first_visible(pos, a.window);
      float d = -INFINITY;
      if (sr < nq && key <= pos && key >= lo) {
        d = 0.0f;
        for (int64_t i = 0; i < hd; ++i) d += qs[sr][i] * kv[c][i];
        d *= a.scale;
      }
      ps[sr][c] = d;
    }
    __syncthreads();
    if (tid < kAqTokens) {  // the token's running softmax over this tile's keys
      float m = row_m[tid];
      for (int c = 0; c < kAqKeys; ++c) m = fmaxf(m, ps[tid][c]);
      const float scale = m == -INFINITY ? 1.0f : expf(row_m[tid] - m);  // exp(-inf) = 0 on first keys
      float l = row_l[tid] * scale;
      for (int c = 0; c < kAqKeys; ++c) {
        const float e = ps[tid][c] == -INFINITY ? 0.0f : expf(ps[tid][c] - m);
        ps[tid][c] = e;
        l += e;
      }
      row_m[tid] = m, row_l[tid] = l, row_scale[tid] = scale;
    }
    __syncthreads();
    for (int i = tid; i < kAqKeys * hd; i += kAqThreads) {  // the values' rows in the keys' place
      const int r = i / static_cast<int>(hd), c = i % static_cast<int>(hd);
      kv[r][c] = kb + r <= last ? cache_at<F16>(v, (kb + r) * stride + kvh * hd + c) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int c = tid + j * kAqThreads;
      if (c < hd) {
#pragma unroll
        for (int r = 0; r < kAqTokens; ++r) {
          float acc = o[r][j] * row_scale[r];
#pragma unroll
          for (int key = 0; key < kAqKeys; ++key) acc += ps[r][key] * kv[key][c];
          o[r][j] = acc;
        }
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    const int c = tid + j * kAqThreads;
#pragma unroll
    for (int r = 0; r < kAqTokens; ++r)
      if (c < hd && r < nq) out[((t0 + r) * a.n_head + h) * hd + c] = o[r][j] / row_l[r];
  }
}

// Threads of an attention block: at least the head size, a multiple of 32, 128 or 256.
int attn_threads(int64_t head_dim) { return head_dim <= 128 ? 128 : 256; }

}  // namespace

void norm_rows(const float* x, const float* w, const float* b, float* out, int64_t rows, int64_t width, float eps,
               bool layer_norm, void* stream, void* xq) {
  if (rows == 0) return;
  EMBER_CHECK(!xq || width % kQK == 0, "CUDA norm_rows: 8-bit output of rows of {} values (a multiple of 32)", width);
  EMBER_CHECK(!xq || out != x, "CUDA norm_rows: 8-bit output in place");
  // In place a block must not overwrite values another block still sums: one block a row.
  const int64_t span = out == x ? width : kNormSpan;
  uint8_t* codes = static_cast<uint8_t*>(xq);
  __half* ds = xq ? reinterpret_cast<__half*>(codes + rows * width) : nullptr;
  const dim3 grid(grid_of(width, span), static_cast<unsigned>(rows));
  norm_kernel<<<grid, kNormThreads, 0, as_stream(stream)>>>(x, w, b, out, width, eps, layer_norm, span, codes, ds);
  launched("norm kernel");
}

void add_bias(float* y, const float* b, int64_t rows, int64_t width, void* stream) {
  if (rows * width == 0) return;
  add_bias_kernel<<<grid_of(rows * width, 256), 256, 0, as_stream(stream)>>>(y, b, rows, width);
  launched("add_bias kernel");
}

void add_inplace(float* y, const float* x, int64_t n, void* stream) {
  if (n == 0) return;
  add_inplace_kernel<<<grid_of(n, 256), 256, 0, as_stream(stream)>>>(y, x, n);
  launched("add_inplace kernel");
}

void softcap(float* y, int64_t n, float cap, void* stream) {
  if (n == 0) return;
  softcap_kernel<<<grid_of(n, 256), 256, 0, as_stream(stream)>>>(y, n, cap);
  launched("softcap kernel");
}

void rope_store(float* q, float* k, const float* v, int64_t n_tokens, int64_t n_head, int64_t n_head_kv,
                int64_t head_dim, const int32_t* pos0, const RopeArgs& rope, void* k_cache, void* v_cache, bool f16,
                void* stream) {
  EMBER_CHECK(!rope.inv_freq || (rope.n_rot > 0 && rope.n_rot % 2 == 0 && rope.n_rot <= head_dim),
              "CUDA rope: {} rotated dimensions of {}", rope.n_rot, head_dim);
  if (n_tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(n_head + n_head_kv), static_cast<unsigned>(n_tokens));
  rope_store_kernel<<<grid, 64, 0, as_stream(stream)>>>(q, k, v, n_head, n_head_kv, head_dim, pos0, rope, k_cache,
                                                        v_cache, f16);
  launched("rope_store kernel");
}

void attention(const AttentionArgs& a, const float* q, int64_t n_tokens, const int32_t* pos0, int64_t max_positions,
               const void* k_cache, const void* v_cache, float* out, float* scores, float* partial, void* stream) {
  EMBER_CHECK(a.head_dim >= 1 && a.head_dim <= kMaxHeadDim, "CUDA attention: head size {} (1 to {})", a.head_dim,
              kMaxHeadDim);
  EMBER_CHECK(a.n_head_kv >= 1 && a.n_head % a.n_head_kv == 0, "CUDA attention: {} heads over {} KV heads", a.n_head,
              a.n_head_kv);
  EMBER_CHECK(max_positions >= n_tokens && max_positions <= a.n_ctx, "CUDA attention: {} positions in a cache of {}",
              max_positions, a.n_ctx);
  if (n_tokens == 0) return;
  cudaStream_t s = as_stream(stream);
  if (n_tokens >= kAttnTilesMin) {  // a prompt: each key and value row read once per kAqTokens tokens
    const dim3 grid(static_cast<unsigned>(a.n_head), static_cast<unsigned>((n_tokens + kAqTokens - 1) / kAqTokens));
    if (a.f16)
      attention_tiles_kernel<true><<<grid, kAqThreads, 0, s>>>(a, q, pos0, n_tokens, k_cache, v_cache, out);
    else
      attention_tiles_kernel<false><<<grid, kAqThreads, 0, s>>>(a, q, pos0, n_tokens, k_cache, v_cache, out);
    launched("attention tiles kernel");
    return;
  }
  // Chunks of kAttnChunk positions up to max_positions; those past a token's position are empty
  // and skipped by the merge, so the result is the same for any max_positions (deterministic).
  const int64_t n_chunks = attention_chunks(max_positions);
  const dim3 grid(static_cast<unsigned>(a.n_head), static_cast<unsigned>(n_tokens), static_cast<unsigned>(n_chunks));
  const int threads = attn_threads(a.head_dim);
  if (a.f16)
    attention_kernel<true><<<grid, threads, 0, s>>>(a, q, pos0, k_cache, v_cache, out, scores, partial);
  else
    attention_kernel<false><<<grid, threads, 0, s>>>(a, q, pos0, k_cache, v_cache, out, scores, partial);
  launched("attention kernel");
  if (n_chunks > 1) {
    attention_merge_kernel<<<dim3(static_cast<unsigned>(a.n_head), static_cast<unsigned>(n_tokens)), 128, 0, s>>>(
        a.n_head, a.head_dim, n_chunks, partial, out);
    launched("attention merge kernel");
  }
}

}  // namespace ember::cuda
