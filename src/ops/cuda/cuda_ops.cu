// CUDA kernels of the hybrid engine; see cuda_ops.hpp. Fixed summation orders throughout (a warp
// per output row with lanes over blocks and a fixed shuffle tree; chunked partial sums added in
// chunk order; compaction by counting, no atomics on floats), and every kernel over many blocks.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.hpp"

namespace ember::cuda {

using namespace detail;

namespace {
std::atomic<uint64_t> g_launches{0};
}  // namespace

void detail::count_launch() { g_launches.fetch_add(1, std::memory_order_relaxed); }

namespace {

// ---- 8-bit activations ---------------------------------------------------------------------------

// A warp per block of 32 values (of n_blocks over all tokens).
__global__ void quantize_q8_kernel(const float* x, int64_t n_blocks, uint8_t* codes, __half* ds) {
  const int lane = threadIdx.x % kWarp;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const bool valid = blk < n_blocks;
  warp_quantize_q8(valid ? x[blk * kQK + lane] : 0.0f, valid, codes + blk * kQK, ds + 2 * blk);
}

// ---- matvec ----------------------------------------------------------------------------------------

constexpr int kMvWarps = 4;   // rows a block computes, a warp each
constexpr int kMvUnroll = 4;  // blocks of 32 weights a lane loads before it uses the first

// A block of 32 weights of a quantized row in registers.
template <int T>
struct WBlock {
  uint4 c[Split<T>::kCodeBytes / 16];
  float d = 0.0f, m = 0.0f;
};
template <int T>
__device__ __forceinline__ void load_block(const SplitRows<T>& w, int64_t r, int64_t b, WBlock<T>& o) {
  const uint4* c = reinterpret_cast<const uint4*>(w.row_codes(r)) + b * (Split<T>::kCodeBytes / 16);
#pragma unroll
  for (int i = 0; i < Split<T>::kCodeBytes / 16; ++i) o.c[i] = c[i];
  const uint8_t* f = w.row_factors(r) + b * Split<T>::kFactorBytes;
  o.d = half_at(f);
  if constexpr (T == 3) o.m = half_at(f + 2);
}

// d_w d_x sum(q_w q_x) over one block (Q4_0: q_w - 8, taken off as 8 sum(q_x); Q4_1: plus m_w s_x)
// against x's codes (32 bytes) and (d, s).
template <int T>
__device__ __forceinline__ float block_dot(const WBlock<T>& w, const uint8_t* xc, uint32_t xds) {
  const int4 x0 = reinterpret_cast<const int4*>(xc)[0], x1 = reinterpret_cast<const int4*>(xc)[1];
  const int u[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  const float dx = half_lo(xds);
  int isum = 0;
  if constexpr (T == 8) {
    const int v[8] = {static_cast<int>(w.c[0].x), static_cast<int>(w.c[0].y), static_cast<int>(w.c[0].z),
                      static_cast<int>(w.c[0].w), static_cast<int>(w.c[1].x), static_cast<int>(w.c[1].y),
                      static_cast<int>(w.c[1].z), static_cast<int>(w.c[1].w)};
#pragma unroll
    for (int i = 0; i < 8; ++i) isum = __dp4a(v[i], u[i], isum);
    return w.d * dx * static_cast<float>(isum);
  } else {
    const int v[4] = {static_cast<int>(w.c[0].x), static_cast<int>(w.c[0].y), static_cast<int>(w.c[0].z),
                      static_cast<int>(w.c[0].w)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      isum = __dp4a(v[i] & 0x0F0F0F0F, u[i], isum);             // codes of elements 4i .. 4i + 3
      isum = __dp4a((v[i] >> 4) & 0x0F0F0F0F, u[i + 4], isum);  // and of 16 + 4i ..
    }
    if constexpr (T == 2) {
      int xsum = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) xsum = __dp4a(0x01010101, u[i], xsum);
      return w.d * dx * static_cast<float>(isum - 8 * xsum);
    } else {
      return w.d * dx * static_cast<float>(isum) + w.m * half_hi(xds);
    }
  }
}

// A lane's share of row r's dots with tokens t0 .. t0 + ng - 1 into acc: blocks lane, lane + 32,
// ... in order (kMvUnroll of them loaded before the first is used).
template <int T>
__device__ __forceinline__ void lane_dots_q(const SplitRows<T>& w, int64_t r, const Q8Acts& x, int64_t t0, int ng,
                                            int lane, float (&acc)[kMvTokens]) {
  for (int64_t b0 = lane; b0 < w.nb; b0 += static_cast<int64_t>(kWarp) * kMvUnroll) {
    WBlock<T> blk[kMvUnroll];
#pragma unroll
    for (int u = 0; u < kMvUnroll; ++u) {
      const int64_t b = b0 + u * kWarp;
      if (b < w.nb) load_block<T>(w, r, b, blk[u]);
    }
#pragma unroll
    for (int u = 0; u < kMvUnroll; ++u) {
      const int64_t b = b0 + u * kWarp;
      if (b >= w.nb) break;
#pragma unroll
      for (int j = 0; j < kMvTokens; ++j) {
        if (j >= ng) break;
        const int64_t xb = (t0 + j) * x.nb + b;
        acc[j] += block_dot<T>(blk[u], x.codes + xb * kQK, x.ds[xb]);
      }
    }
  }
}

// Float rows (F32, F16) against float x: lanes over runs of 8 values (16-byte loads) where the
// row length allows, else over single values.
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
template <class W>
__device__ __forceinline__ void lane_dots_f(const W* row, int64_t cols, const float* x, int64_t t0, int ng, int lane,
                                            float (&acc)[kMvTokens]) {
  if (cols % 8 == 0) {
    for (int64_t j = 8 * static_cast<int64_t>(lane); j < cols; j += 8 * kWarp) {
      float w[8];
      load8(row, j, w);
#pragma unroll
      for (int t = 0; t < kMvTokens; ++t) {
        if (t >= ng) break;
        float xv[8];
        load8(x + (t0 + t) * cols, j, xv);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) s += w[i] * xv[i];
        acc[t] += s;
      }
    }
  } else {
    for (int64_t j = lane; j < cols; j += kWarp) {
      const float w = static_cast<float>(row[j]);
#pragma unroll
      for (int t = 0; t < kMvTokens; ++t) {
        if (t >= ng) break;
        acc[t] += w * x[(t0 + t) * cols + j];
      }
    }
  }
}

__device__ __forceinline__ float act_value(cpu::Activation act, float x) {
  switch (act) {
    case cpu::Activation::silu: return x / (1.0f + expf(-x));
    case cpu::Activation::relu: return x > 0.0f ? x : 0.0f;
    default: {
      const float k = 0.7978845608028654f;
      return 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x)));
    }
  }
}

// Output value v of list row i (matrix row r) for token t through the epilogue: the one place
// every product kernel (the matvec and the prompt tiles) writes its results. `fired` counts the
// firing pairs (fire) or records a selected token (select) of the row.
__device__ __forceinline__ void apply_epilogue(const MatvecOut& o, int64_t t, int64_t i, int64_t r, float v,
                                               int& fired) {
  if (o.bias) v += o.bias[r];
  float* y = o.y + t * o.stride + i;
  switch (o.kind) {
    case Epilogue::store: *y = v; break;
    case Epilogue::add: *y += v; break;
    case Epilogue::relu: *y = fmaxf(v, 0.0f); break;
    case Epilogue::gate_mul: *y = v * o.a[t * o.a_stride + (o.pos ? o.pos[i] : i)]; break;
    case Epilogue::act: *y = act_value(o.act, v); break;
    case Epilogue::fire: {
      float f = act_value(o.act, v);
      if (fabsf(f) > o.threshold && (!o.allowed || o.allowed[t * o.allowed_stride + r])) ++fired;
      else f = 0.0f;
      *y = f;
      break;
    }
    case Epilogue::select: {
      const bool on = v >= o.threshold;
      o.mask[t * o.mask_stride + i] = static_cast<uint8_t>(on);
      fired |= on;
      break;
    }
  }
}

struct MvArgs {
  const uint8_t* w;
  int64_t w_rows, cols;
  const int32_t* ids;
  const int32_t* count;
  int64_t max_rows;
  const void* x;  // floats or quantize_q8's layout
  int64_t n_tokens;
  int64_t tokens_per_block;  // tokens of blockIdx.y's slice (per-token epilogues split the tokens)
  MatvecOut out;
};

// Block (rows kMvWarps i .. + kMvWarps - 1, token slice y): a warp per row, all the slice's
// tokens kMvTokens at a time from one read of the row each; the epilogue at lane 0.
template <int T>
__global__ void __launch_bounds__(kMvWarps * kWarp) matvec_kernel(MvArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kMvWarps + threadIdx.x / kWarp;
  const int64_t n = a.count ? *a.count : a.max_rows;
  const bool valid = i < n;  // a warp past the end still takes part in the (uniform) shuffles
  const int64_t r = valid ? (a.ids ? a.ids[i] : i) : 0;
  const int64_t t_begin = static_cast<int64_t>(blockIdx.y) * a.tokens_per_block;
  const int64_t t_end = t_begin + a.tokens_per_block < a.n_tokens ? t_begin + a.tokens_per_block : a.n_tokens;
  const MatvecOut& o = a.out;
  int fired = 0;
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kMvTokens) {
    const int ng = static_cast<int>(t_end - t0 < kMvTokens ? t_end - t0 : kMvTokens);
    float acc[kMvTokens];
#pragma unroll
    for (int j = 0; j < kMvTokens; ++j) acc[j] = 0.0f;
    if (valid) {
      if constexpr (T == 0) {
        lane_dots_f(reinterpret_cast<const float*>(a.w) + r * a.cols, a.cols, static_cast<const float*>(a.x), t0, ng,
                    lane, acc);
      } else if constexpr (T == 1) {
        lane_dots_f(reinterpret_cast<const __half*>(a.w) + r * a.cols, a.cols, static_cast<const float*>(a.x), t0, ng,
                    lane, acc);
      } else {
        lane_dots_q<T>(SplitRows<T>(a.w, a.w_rows, a.cols), r, Q8Acts(a.x, a.n_tokens, a.cols), t0, ng, lane, acc);
      }
    }
#pragma unroll
    for (int j = 0; j < kMvTokens; ++j) acc[j] = warp_sum(acc[j]);
    if (!valid || lane != 0) continue;
    for (int j = 0; j < ng; ++j) apply_epilogue(o, t0 + j, i, r, acc[j], fired);
  }
  if (!valid || lane != 0) return;
  if (o.kind == Epilogue::fire) o.counts[i] = fired;
  if (o.kind == Epilogue::select && i < o.k) o.counts[i] = fired;
}

// ---- prompts: tiled products ---------------------------------------------------------------------

// A block computes a tile of kGmRows rows x kGmTokens tokens: for each step of kGmBlocks weight
// blocks it stages the tile's weight codes (nibbles unpacked to bytes) and the tokens' 8-bit codes
// in shared memory once, and every thread multiplies its kGmSub x kGmSub of them from there. So a
// weight is read once per kGmTokens tokens (the matvec reads it once per kMvTokens), which makes a
// prompt's products compute-bound rather than a re-read of every matrix per four tokens. Each
// (row, token) sums the same per-block terms as block_dot, block after block in order: deterministic.
constexpr int kGmRows = 64, kGmTokens = 64, kGmBlocks = 4, kGmSub = 4;
constexpr int kGmThreads = (kGmRows / kGmSub) * (kGmTokens / kGmSub);  // 256
static_assert(kGmRows * kGmBlocks == kGmThreads && kGmTokens * kGmBlocks == kGmThreads, "one staged block a thread");

// A row's firing count (fire) or selection (select) over a tile's tokens, added to the counts
// with integer atomics: the same totals whatever order the token tiles come in (zeroed before).
__device__ __forceinline__ void tile_count(const MatvecOut& o, int64_t i, int fired) {
  if (o.kind == Epilogue::fire && fired) atomicAdd(o.counts + i, fired);
  if (o.kind == Epilogue::select && fired && i < o.k) atomicOr(o.counts + i, 1);
}

// A thread's kGmSub x kGmSub outputs of a tile, rows i + 16 p and tokens t + 16 q (acc[p][q]),
// through the epilogue.
__device__ __forceinline__ void tile_epilogue(const MvArgs& a, int64_t n, int64_t i, int64_t t,
                                              const float (&acc)[kGmSub][kGmSub]) {
#pragma unroll
  for (int p = 0; p < kGmSub; ++p) {
    const int64_t ip = i + p * (kGmRows / kGmSub);
    if (ip >= n) continue;
    const int64_t r = a.ids ? a.ids[ip] : ip;
    int fired = 0;
#pragma unroll
    for (int q = 0; q < kGmSub; ++q) {
      const int64_t tq = t + q * (kGmTokens / kGmSub);
      if (tq < a.n_tokens) apply_epilogue(a.out, tq, ip, r, acc[p][q], fired);
    }
    tile_count(a.out, ip, fired);
  }
}

// F32 and F16 rows against float activations, in the same tiles: each step stages kGfCols columns
// of the tile's weights (F16 widened) and of its tokens' values in shared memory, and every thread
// adds its 4 x 4 products column after column with fused multiply-adds. Each weight is read once
// per 64 tokens; the sums run in another order than the matvec's lanes (the same values to
// float rounding, not the same bits).
constexpr int kGfCols = 32;
static_assert(kGmRows * kGfCols == 8 * kGmThreads && kGmTokens * kGfCols == 8 * kGmThreads, "8 values a thread");

template <int T>
__global__ void __launch_bounds__(kGmThreads) matmul_tiles_f_kernel(MvArgs a) {
  __shared__ float sw[kGmRows][kGfCols + 1];  // +1: rows in different banks
  __shared__ float sx[kGmTokens][kGfCols + 1];
  const int64_t n = a.count ? *a.count : a.max_rows;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kGmRows, t0 = static_cast<int64_t>(blockIdx.y) * kGmTokens;
  if (i0 >= n) return;  // the whole block: no barrier is skipped by part of it
  const int tid = threadIdx.x;
  const int tr = tid % (kGmRows / kGmSub), tc = tid / (kGmRows / kGmSub);
  float acc[kGmSub][kGmSub];
#pragma unroll
  for (int p = 0; p < kGmSub; ++p)
#pragma unroll
    for (int q = 0; q < kGmSub; ++q) acc[p][q] = 0.0f;
  // What this thread stages: 8 consecutive columns of one row and of one token a step.
  const int ls = tid / (kGfCols / 8), lc = 8 * (tid % (kGfCols / 8));
  const int64_t li = i0 + ls, lt = t0 + ls;
  const bool row_ok = li < n, tok_ok = lt < a.n_tokens;
  const int64_t lr = row_ok ? (a.ids ? a.ids[li] : li) : 0;
  using W = std::conditional_t<T == 0, float, __half>;
  const W* wrow = reinterpret_cast<const W*>(a.w) + lr * a.cols;
  const float* xrow = static_cast<const float*>(a.x) + lt * a.cols;
  for (int64_t k0 = 0; k0 < a.cols; k0 += kGfCols) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t c = k0 + lc + j;
      float v = 0.0f;
      if (row_ok && c < a.cols) {
        if constexpr (T == 0) v = wrow[c];
        else v = __half2float(wrow[c]);
      }
      sw[ls][lc + j] = v;
      sx[ls][lc + j] = tok_ok && c < a.cols ? xrow[c] : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kGfCols; ++kk) {
      float wv[kGmSub], xv[kGmSub];
#pragma unroll
      for (int p = 0; p < kGmSub; ++p) wv[p] = sw[tr + p * (kGmRows / kGmSub)][kk];
#pragma unroll
      for (int q = 0; q < kGmSub; ++q) xv[q] = sx[tc + q * (kGmTokens / kGmSub)][kk];
#pragma unroll
      for (int p = 0; p < kGmSub; ++p)
#pragma unroll
        for (int q = 0; q < kGmSub; ++q) acc[p][q] = fmaf(wv[p], xv[q], acc[p][q]);
    }
    __syncthreads();
  }
  tile_epilogue(a, n, i0 + tr, t0 + tc, acc);
}

// The m16n8 mma instructions' definition where they are absent (the HIP CPU runtime): with
// g = lane / 4 and q = lane % 4, a[r] holds row g + 8 (r % 2), k word q + 4 (r / 2) of A, b[r]
// column g, k word q + 4 r of B, c[e] row g + 8 (e / 2), column 2 q + e % 2 of C; each lane
// gathers its rows' and columns' eight k words with shuffles and adds dot(a word, b word) for
// each. Every lane shuffles alike (the runtime's shuffles wait for the whole block).
template <class W, class C, class Dot>
__device__ __forceinline__ void mma_by_shuffles(const W (&a)[4], const W (&b)[2], C (&c)[4], Dot dot) {
  const int lane = threadIdx.x % kWarp, g = lane / 4, q = lane % 4;
#pragma unroll
  for (int w = 0; w < 8; ++w) {  // k word w: A's words from lane 4 g + w % 4, B's from 4 n + w % 4
    const W a_lo = __shfl_sync(0xffffffffu, a[2 * (w / 4)], 4 * g + w % 4);
    const W a_hi = __shfl_sync(0xffffffffu, a[2 * (w / 4) + 1], 4 * g + w % 4);
    const W b0 = __shfl_sync(0xffffffffu, b[w / 4], 4 * (2 * q) + w % 4);
    const W b1 = __shfl_sync(0xffffffffu, b[w / 4], 4 * (2 * q + 1) + w % 4);
    c[0] = dot(a_lo, b0, c[0]);
    c[1] = dot(a_lo, b1, c[1]);
    c[2] = dot(a_hi, b0, c[2]);
    c[3] = dot(a_hi, b1, c[3]);
  }
}

// c += A B for a warp's fragments of mma.m16n8k32 with 8-bit signed integers (PTX ISA, "Matrix
// fragments for mma.m16n8k32"): A is 16 rows x 32, B 32 x 8 columns, C 16 x 8 int32, in
// mma_by_shuffles' layout with words of four consecutive k. Sums of products of integers: exact, so the tiles' results do not depend on this instruction
// or the dp4a that stands in for it on cards without one (and on the HIP CPU runtime, where the
// definition is written out with shuffles, so that the fragments the kernel loads are tested).
__device__ __forceinline__ void mma_s8_16x8x32(const int (&a)[4], const int (&b)[2], int (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(EMBER_CUDA_ON_CPU)
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  mma_by_shuffles(a, b, c, [](int x, int y, int acc) { return __dp4a(x, y, acc); });
#endif
}

// bf16 as the upper 16 bits of a float: to it with rounding to nearest even (finite values), and back.
__device__ __forceinline__ unsigned bf16_bits(float v) {
  const unsigned u = __float_as_uint(v);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float bf16_value(unsigned b) { return __uint_as_float(b << 16); }
// Two consecutive bf16 (k, k + 1) as one fragment word, k in the low half.
__device__ __forceinline__ unsigned bf16_pair(const uint16_t* p) { return p[0] | static_cast<unsigned>(p[1]) << 16; }

// c += A B for a warp's fragments of mma.m16n8k16 with bf16 inputs and float sums (PTX ISA,
// "Matrix fragments for mma.m16n8k16 with floating point type"): the same layout as
// mma_s8_16x8x32's with a word holding two consecutive k (the lower k in the low half). Products
// of two bf16 values are exact in float; the sums' order is the instruction's (or, where it is
// absent, the definition's written out as in mma_s8_16x8x32).
__device__ __forceinline__ void mma_bf16_16x8x16(const unsigned (&a)[4], const unsigned (&b)[2], float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(EMBER_CUDA_ON_CPU)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  mma_by_shuffles(a, b, c, [](unsigned x, unsigned y, float acc) {
    return acc + (bf16_value(x & 0xffffu) * bf16_value(y & 0xffffu) + bf16_value(x >> 16) * bf16_value(y >> 16));
  });
#endif
}

// The term a block adds to output (row, token) of a tile, from the integer sum of its codes'
// products, as block_dot writes it: the same float operations whatever computed isum.
template <int T>
__device__ __forceinline__ float tile_term(int isum, float dw, float mw, uint32_t ds, int xsum) {
  if constexpr (T == 8) return dw * half_lo(ds) * static_cast<float>(isum);
  else if constexpr (T == 2) return dw * half_lo(ds) * static_cast<float>(isum - 8 * xsum);
  else return dw * half_lo(ds) * static_cast<float>(isum) + mw * half_hi(ds);
}

template <int T, bool kMma>
__global__ void __launch_bounds__(kGmThreads) matmul_tiles_kernel(MvArgs a) {
  __shared__ int sw[kGmRows][kGmBlocks][9];  // codes as 8 words (+1: fewer bank conflicts)
  __shared__ float swd[kGmRows][kGmBlocks], swm[kGmRows][kGmBlocks];
  __shared__ int sx[kGmTokens][kGmBlocks][9];
  __shared__ uint32_t sxds[kGmTokens][kGmBlocks];
  __shared__ int sxsum[kGmTokens][kGmBlocks];
  const int64_t n = a.count ? *a.count : a.max_rows;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kGmRows, t0 = static_cast<int64_t>(blockIdx.y) * kGmTokens;
  if (i0 >= n) return;  // the whole block: no barrier is skipped by part of it
  const SplitRows<T> w(a.w, a.w_rows, a.cols);
  const Q8Acts x(a.x, a.n_tokens, a.cols);
  const int tid = threadIdx.x;
  // dp4a: the thread's rows tr + 16 p and tokens tc + 16 q (acc[p][q]); mma: its warp's 16 rows from mr
  // and 32 tokens from mt, the lane's outputs of column tile p in acc[p][e] (mma_s8_16x8x32's c[e]).
  const int tr = tid % (kGmRows / kGmSub), tc = tid / (kGmRows / kGmSub);
  const int lane = tid % kWarp, g = lane / 4, q4 = lane % 4;
  const int mr = 16 * (tid / kWarp % 4), mt = 32 * (tid / kWarp / 4);
  static_assert(kGmThreads / kWarp == 8 && kGmRows == 4 * 16 && kGmTokens == 2 * 32, "mma: 4 x 2 warps of 16 x 32");
  float acc[kGmSub][kGmSub];
#pragma unroll
  for (int p = 0; p < kGmSub; ++p)
#pragma unroll
    for (int q = 0; q < kGmSub; ++q) acc[p][q] = 0.0f;
  // What this thread stages: one weight block and one activation block a step.
  const int ls = tid / kGmBlocks, lb = tid % kGmBlocks;
  const int64_t li = i0 + ls, lt = t0 + ls;
  const bool row_ok = li < n, tok_ok = lt < a.n_tokens;
  const int64_t lr = row_ok ? (a.ids ? a.ids[li] : li) : 0;
  for (int64_t k0 = 0; k0 < w.nb; k0 += kGmBlocks) {
    const int64_t b = k0 + lb;
    if (row_ok && b < w.nb) {
      WBlock<T> blk;
      load_block<T>(w, lr, b, blk);
      if constexpr (T == 8) {
        const unsigned v[8] = {blk.c[0].x, blk.c[0].y, blk.c[0].z, blk.c[0].w, blk.c[1].x, blk.c[1].y, blk.c[1].z, blk.c[1].w};
#pragma unroll
        for (int q = 0; q < 8; ++q) sw[ls][lb][q] = static_cast<int>(v[q]);
      } else {
        const unsigned v[4] = {blk.c[0].x, blk.c[0].y, blk.c[0].z, blk.c[0].w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          sw[ls][lb][q] = static_cast<int>(v[q] & 0x0F0F0F0Fu);             // elements 4q .. 4q + 3
          sw[ls][lb][q + 4] = static_cast<int>((v[q] >> 4) & 0x0F0F0F0Fu);  // and 16 + 4q ..
        }
      }
      swd[ls][lb] = blk.d;
      swm[ls][lb] = blk.m;
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) sw[ls][lb][q] = 0;
      swd[ls][lb] = 0.0f;
      swm[ls][lb] = 0.0f;
    }
    if (tok_ok && b < w.nb) {
      const int64_t xb = lt * x.nb + b;
      const int4 c0 = reinterpret_cast<const int4*>(x.codes + xb * kQK)[0];
      const int4 c1 = reinterpret_cast<const int4*>(x.codes + xb * kQK)[1];
      const int u[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
      int xsum = 0;
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        sx[ls][lb][q] = u[q];
        xsum = __dp4a(0x01010101, u[q], xsum);
      }
      sxds[ls][lb] = x.ds[xb];
      sxsum[ls][lb] = xsum;
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) sx[ls][lb][q] = 0;
      sxds[ls][lb] = 0u;
      sxsum[ls][lb] = 0;
    }
    __syncthreads();
    const int steps = w.nb - k0 < kGmBlocks ? static_cast<int>(w.nb - k0) : kGmBlocks;
    for (int kb = 0; kb < steps; ++kb) {
      if constexpr (kMma) {
        // Warp: rows mr .. mr + 15, tokens mt .. mt + 31 as four mma column tiles of 8.
        int af[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) af[r] = sw[mr + g + 8 * (r % 2)][kb][q4 + 4 * (r / 2)];
#pragma unroll
        for (int p = 0; p < kGmSub; ++p) {
          const int tb = mt + 8 * p;
          const int bf[2] = {sx[tb + g][kb][q4], sx[tb + g][kb][q4 + 4]};
          int c[4] = {0, 0, 0, 0};
          mma_s8_16x8x32(af, bf, c);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int rr = mr + g + 8 * (e / 2), tt = tb + 2 * q4 + e % 2;
            acc[p][e] += tile_term<T>(c[e], swd[rr][kb], swm[rr][kb], sxds[tt][kb], sxsum[tt][kb]);
          }
        }
      } else {
#pragma unroll
        for (int p = 0; p < kGmSub; ++p) {
          const int rr = tr + p * (kGmRows / kGmSub);
#pragma unroll
          for (int q = 0; q < kGmSub; ++q) {
            const int tt = tc + q * (kGmTokens / kGmSub);
            int isum = 0;
#pragma unroll
            for (int e = 0; e < 8; ++e) isum = __dp4a(sw[rr][kb][e], sx[tt][kb][e], isum);
            acc[p][q] += tile_term<T>(isum, swd[rr][kb], swm[rr][kb], sxds[tt][kb], sxsum[tt][kb]);
          }
        }
      }
    }
    __syncthreads();
  }
  const MatvecOut& o = a.out;
  if constexpr (kMma) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // rows g and g + 8 of the warp's 16
      const int64_t i = i0 + mr + g + 8 * h;
      if (i >= n) continue;
      const int64_t r = a.ids ? a.ids[i] : i;
      int fired = 0;
#pragma unroll
      for (int p = 0; p < kGmSub; ++p)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const int64_t t = t0 + mt + 8 * p + 2 * q4 + e % 2;
          if (t < a.n_tokens) apply_epilogue(o, t, i, r, acc[p][e], fired);
        }
      tile_count(o, i, fired);
    }
  } else {
    tile_epilogue(a, n, i0 + tr, t0 + tc, acc);
  }
}

// ---- compaction ----------------------------------------------------------------------------------

// Block-wide compaction step, in thread order: every thread of the block calls it with its
// flag; a flagged thread gets its slot among the block's flagged threads in *slot. Returns the
// block's count (the same in every thread).
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
  __syncthreads();
  return total;
}

// Block b (kCompactSpan threads): positions b kCompactSpan .. + kCompactSpan - 1. Its offset is
// the number of flagged positions before it, counted here; the block holding the last position
// writes the totals.
__global__ void __launch_bounds__(kCompactSpan) compact_kernel(const int32_t* counts, int64_t max_n,
                                                               const int32_t* n_valid, const int32_t* ids,
                                                               int32_t* out_ids, int32_t* out_pos, int32_t* totals,
                                                               unsigned long long* fired_total) {
  __shared__ int red[33];
  const int64_t n = n_valid ? *n_valid : max_n;
  const int64_t b = blockIdx.x, start = b * kCompactSpan;
  const int64_t last = n > 0 ? (n - 1) / kCompactSpan : 0;
  if (b > last) return;  // the whole block: its barriers stay uniform
  int before = 0;
  for (int64_t j = threadIdx.x; j < start; j += blockDim.x) before += counts[j] > 0;
  const int offset = block_sum(before, red);
  const int64_t i = start + threadIdx.x;
  const int flag = i < n && counts[i] > 0;
  int slot = 0;
  const int total = block_compact(flag, &slot);
  if (flag) {
    out_ids[offset + slot] = ids ? ids[i] : static_cast<int32_t>(i);
    if (out_pos) out_pos[offset + slot] = static_cast<int32_t>(i);
  }
  if (b != last) return;
  int pairs = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) pairs += counts[j];
  pairs = block_sum(pairs, red);
  if (threadIdx.x == 0) {
    totals[0] = offset + total;
    totals[1] = pairs;
    if (fired_total) atomicAdd(fired_total, static_cast<unsigned long long>(pairs));  // integers: order-free
  }
}

// ---- the down axpy ---------------------------------------------------------------------------------

// Columns a thread of the axpy owns: one block of 32 for the block types (its codes in one or two
// 16-byte loads), 8 values for F16 and F32 (one or two 16-byte loads).
template <int T>
constexpr int kAxpyCols = (T == 0 || T == 1) ? 8 : kQK;
constexpr int kAxpyThreads = 64;

// Thread's columns j0 .. j0 + C - 1 of row r, times hv, into acc.
template <int T>
__device__ __forceinline__ void axpy_row(const uint8_t* D, int64_t n_rows, int64_t cols, int64_t r, int64_t j0, float hv,
                                         float (&acc)[kAxpyCols<T>]) {
  if constexpr (T == 0 || T == 1) {
    float w[8];
    if constexpr (T == 0) load8(reinterpret_cast<const float*>(D) + r * cols, j0, w);
    else load8(reinterpret_cast<const __half*>(D) + r * cols, j0, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += hv * w[i];
  } else {
    const SplitRows<T> s(D, n_rows, cols);
    WBlock<T> blk;
    load_block<T>(s, r, j0 / kQK, blk);
    const float dh = blk.d * hv;
    const uint8_t* q = reinterpret_cast<const uint8_t*>(blk.c);
    if constexpr (T == 8) {
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[i] += dh * static_cast<float>(static_cast<int8_t>(q[i]));
    } else {
      const float off = T == 2 ? -8.0f : 0.0f, mh = blk.m * hv;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const float lo = static_cast<float>(q[i] & 15) + off, hi = static_cast<float>(q[i] >> 4) + off;
        if constexpr (T == 2) {
          acc[i] += dh * lo;
          acc[i + 16] += dh * hi;
        } else {
          acc[i] += dh * lo + mh;
          acc[i + 16] += dh * hi + mh;
        }
      }
    }
  }
}

// Block (column tile, chunk c, token t): the partial sums over chunk c's share of the active rows
// (rows c, c + n_chunks, ... : interleaved, so that chunks stay even however many fire), each
// thread over its kAxpyCols columns, two rows loaded before the first is used.
template <int T>
__global__ void __launch_bounds__(kAxpyThreads) axpy_kernel(const uint8_t* D, int64_t n_rows, int64_t cols,
                                                            const int32_t* active, const int32_t* n_active,
                                                            const float* h, int64_t h_stride, float* partial) {
  constexpr int C = kAxpyCols<T>;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * C;
  const int64_t c = blockIdx.y, n_chunks = gridDim.y, t = blockIdx.z, n_tokens = gridDim.z;
  if (j0 >= cols) return;
  const int32_t na = *n_active;
  float acc[C];
#pragma unroll
  for (int i = 0; i < C; ++i) acc[i] = 0.0f;
  for (int64_t k = c; k < na; k += n_chunks) {
    const float hv = h[t * h_stride + k];
    if (hv != 0.0f) axpy_row<T>(D, n_rows, cols, active[k], j0, hv, acc);
  }
  float* p = partial + (c * n_tokens + t) * cols + j0;
#pragma unroll
  for (int i = 0; i < C; i += 4) *reinterpret_cast<float4*>(p + i) = make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
}

// Prompts: the same partial sums for kAxpyTok tokens from one read of each row. A thread owns 8
// columns (for the block types, an eighth-aligned quarter of a block) and the group's tokens; each
// (token, column) takes exactly axpy_row's terms in the same order (a token whose h is 0 skips the
// row as there), so the sums are those of axpy_kernel, bit for bit, from a kAxpyTok-th of the reads.
constexpr int kAxpyTok = 8;
constexpr int64_t kAxpyBatchMin = 8;  // tokens from which sparse_axpy reads rows once per group

template <int T>
__device__ __forceinline__ void axpy_cols8(const uint8_t* D, int64_t n_rows, int64_t cols, int64_t r, int64_t j0,
                                           float (&w)[8], float& d, float& m) {
  if constexpr (T == 0 || T == 1) {
    if constexpr (T == 0) load8(reinterpret_cast<const float*>(D) + r * cols, j0, w);
    else load8(reinterpret_cast<const __half*>(D) + r * cols, j0, w);
  } else {
    const SplitRows<T> sr(D, n_rows, cols);
    const int64_t b = j0 / kQK;
    const int sub = static_cast<int>((j0 % kQK) / 8);  // which 8 of the block's 32
    const uint8_t* codes = sr.row_codes(r) + b * Split<T>::kCodeBytes;
    const uint8_t* f = sr.row_factors(r) + b * Split<T>::kFactorBytes;
    d = half_at(f);
    if constexpr (T == 3) m = half_at(f + 2);
    if constexpr (T == 8) {
      const uint2 v = reinterpret_cast<const uint2*>(codes)[sub];
      const unsigned u[2] = {v.x, v.y};
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = static_cast<float>(static_cast<int8_t>((u[i / 4] >> (8 * (i % 4))) & 0xffu));
    } else {
      const uint2 v = reinterpret_cast<const uint2*>(codes)[sub % 2];  // bytes 0-7 or 8-15
      const unsigned u[2] = {v.x, v.y};
      const float off = T == 2 ? -8.0f : 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const unsigned byte = (u[i / 4] >> (8 * (i % 4))) & 0xffu;
        w[i] = static_cast<float>(sub < 2 ? (byte & 15u) : (byte >> 4)) + off;
      }
    }
  }
}

template <int T>
__global__ void __launch_bounds__(kAxpyThreads) axpy_tokens_kernel(const uint8_t* D, int64_t n_rows, int64_t cols,
                                                                   const int32_t* active, const int32_t* n_active,
                                                                   const float* h, int64_t h_stride, int64_t n_tokens,
                                                                   float* partial) {
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  const int64_t c = blockIdx.y, n_chunks = gridDim.y, t0 = static_cast<int64_t>(blockIdx.z) * kAxpyTok;
  if (j0 >= cols) return;
  const int nt = static_cast<int>(n_tokens - t0 < kAxpyTok ? n_tokens - t0 : kAxpyTok);
  const int32_t na = *n_active;
  float acc[kAxpyTok][8];
#pragma unroll
  for (int q = 0; q < kAxpyTok; ++q)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[q][i] = 0.0f;
  for (int64_t k = c; k < na; k += n_chunks) {
    float hv[kAxpyTok];
    bool any = false;
#pragma unroll
    for (int q = 0; q < kAxpyTok; ++q) {
      hv[q] = q < nt ? h[(t0 + q) * h_stride + k] : 0.0f;
      any |= hv[q] != 0.0f;
    }
    if (!any) continue;
    float w[8], d = 0.0f, m = 0.0f;
    axpy_cols8<T>(D, n_rows, cols, active[k], j0, w, d, m);
#pragma unroll
    for (int q = 0; q < kAxpyTok; ++q) {
      if (hv[q] == 0.0f) continue;
      if constexpr (T == 0 || T == 1) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[q][i] += hv[q] * w[i];
      } else if constexpr (T == 3) {
        const float dh = d * hv[q], mh = m * hv[q];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[q][i] += dh * w[i] + mh;
      } else {
        const float dh = d * hv[q];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[q][i] += dh * w[i];
      }
    }
  }
  for (int q = 0; q < nt; ++q) {
    float* p = partial + (c * n_tokens + t0 + q) * cols + j0;
    *reinterpret_cast<float4*>(p) = make_float4(acc[q][0], acc[q][1], acc[q][2], acc[q][3]);
    *reinterpret_cast<float4*>(p + 4) = make_float4(acc[q][4], acc[q][5], acc[q][6], acc[q][7]);
  }
}

// Prompts of kAxpyTilesMin tokens or more on tensor cores (TileMath::mma): the down's sums as a
// matrix product out[t][j] = sum_k h[t][k] D[active[k]][j] in tiles of 64 tokens x 64 columns
// (two blocks of 32), each step 16 active rows. The codes (exact in bf16) go in as they are;
// h[t][k] times the row's block factor d, a float, goes in as three bf16 parts (hi + mid + lo: 24
// bits of its 24), so each product is h d q to float rounding; Q4_1's h m is summed per (token,
// block) on the side. A warp takes 16 tokens x one block (four 8-column mma tiles). The sums run in
// the tensor cores' order: the same values as axpy_tokens_kernel to float rounding, not its bits.
constexpr int64_t kAxpyTilesMin = 64;  // from here axpy_chunks is 1: one partial, written whole
constexpr int kAtTokens = 64, kAtCols = 64, kAtRows = 16, kAtThreads = 256;

template <int T>
__global__ void __launch_bounds__(kAtThreads) axpy_tiles_kernel(const uint8_t* D, int64_t n_rows, int64_t cols,
                                                                const int32_t* active, const int32_t* n_active,
                                                                const float* h, int64_t h_stride, int64_t n_tokens,
                                                                float* partial) {
  __shared__ uint16_t sb[kAtCols][kAtRows + 8];             // codes [column][row] (+8: banks)
  __shared__ uint16_t sa[3][2][kAtTokens][kAtRows + 8];     // h d parts [part][block][token][row]
  __shared__ float shm[kAtTokens][2][kAtRows];              // Q4_1: h m, summed after the steps
  const SplitRows<T> sr(D, n_rows, cols);
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kAtCols, t0 = static_cast<int64_t>(blockIdx.y) * kAtTokens;
  const int64_t nb0 = j0 / kQK;  // the tile's first block
  const int nblk = cols - j0 >= kAtCols ? 2 : 1;
  const int64_t na = *n_active;
  const int tid = threadIdx.x, lane = tid % kWarp, wid = tid / kWarp, g = lane / 4, q = lane % 4;
  const int wt = 16 * (wid % 4), wb = wid / 4;  // the warp's tokens and block
  float acc[4][4];
#pragma unroll
  for (int p = 0; p < 4; ++p)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[p][e] = 0.0f;
  float hm_own[4][2] = {};  // Q4_1: this thread's h m over its row position, 4 tokens x 2 blocks
  // Staging: codes of row kr, columns 4 cc .. 4 cc + 3; h of row kk for tokens tt + 16 i.
  const int kr = tid / 16, cc = tid % 16, kk = tid % 16, tt = tid / 16;
  for (int64_t k0 = 0; k0 < na; k0 += kAtRows) {
    {
      const int64_t k = k0 + kr;
      const int col = 4 * cc, blk = col / kQK, off = col % kQK;
      unsigned v[4] = {0, 0, 0, 0};
      if (k < na && blk < nblk) {
        const uint8_t* codes = sr.row_codes(active[k]) + (nb0 + blk) * Split<T>::kCodeBytes;
        const uint32_t w = *reinterpret_cast<const uint32_t*>(codes + (T == 8 ? off : off % 16));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const unsigned byte = (w >> (8 * i)) & 0xffu;
          float code;
          if constexpr (T == 8) code = static_cast<float>(static_cast<int8_t>(byte));
          else code = static_cast<float>(off < 16 ? (byte & 15u) : (byte >> 4)) - (T == 2 ? 8.0f : 0.0f);
          v[i] = bf16_bits(code);  // exact: a small integer
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) sb[col + i][kr] = static_cast<uint16_t>(v[i]);
    }
    {
      const int64_t k = k0 + kk;
      float d[2] = {0.0f, 0.0f}, m[2] = {0.0f, 0.0f};
      if (k < na)
        for (int b = 0; b < nblk; ++b) {
          const uint8_t* f = sr.row_factors(active[k]) + (nb0 + b) * Split<T>::kFactorBytes;
          d[b] = half_at(f);
          if constexpr (T == 3) m[b] = half_at(f + 2);
        }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = tt + 16 * i;
        const float hv = k < na && t0 + t < n_tokens ? h[(t0 + t) * h_stride + k] : 0.0f;
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          if constexpr (T == 3) hm_own[i][b] += hv * m[b];  // in step order
          const float v = hv * d[b];
          const unsigned hi = bf16_bits(v);
          const float r1 = v - bf16_value(hi);
          const unsigned mid = bf16_bits(r1);
          const unsigned lo = bf16_bits(r1 - bf16_value(mid));
          sa[0][b][t][kk] = static_cast<uint16_t>(hi);
          sa[1][b][t][kk] = static_cast<uint16_t>(mid);
          sa[2][b][t][kk] = static_cast<uint16_t>(lo);
        }
      }
    }
    __syncthreads();
    // Every warp, also one past a half tile's last block (zeros there): the HIP CPU runtime's
    // shuffles, which stand in for the instruction, wait for the whole block.
    {
#pragma unroll
      for (int part = 0; part < 3; ++part) {
        unsigned af[4];
#pragma unroll
        for (int r = 0; r < 4; ++r)
          af[r] = bf16_pair(&sa[part][wb][wt + g + 8 * (r % 2)][2 * (q + 4 * (r / 2))]);
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          const int n = 32 * wb + 8 * p + g;
          const unsigned bfr[2] = {bf16_pair(&sb[n][2 * q]), bf16_pair(&sb[n][2 * (q + 4)])};
          mma_bf16_16x8x16(af, bfr, acc[p]);
        }
      }
    }
    __syncthreads();
  }
  if constexpr (T == 3) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      shm[tt + 16 * i][0][kk] = hm_own[i][0];
      shm[tt + 16 * i][1][kk] = hm_own[i][1];
    }
    __syncthreads();
  }
  if (wb >= nblk) return;
#pragma unroll
  for (int p = 0; p < 4; ++p)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int t = wt + g + 8 * (e / 2);
      const int64_t j = j0 + 32 * wb + 8 * p + 2 * q + e % 2;
      if (t0 + t >= n_tokens) continue;
      float v = acc[p][e];
      if constexpr (T == 3) {
        float hm = 0.0f;  // the row positions' h m in position order
        for (int r = 0; r < kAtRows; ++r) hm += shm[t][wb][r];
        v += hm;
      }
      partial[(t0 + t) * cols + j] = v;
    }
}

// The chunks' partial sums of (token, column) i added in chunk order.
__device__ __forceinline__ float chunk_sum(const float* partial, int64_t n_chunks, int64_t per_chunk, int64_t i) {
  float s = 0.0f;
  for (int64_t c = 0; c < n_chunks; ++c) s += partial[c * per_chunk + i];
  return s;
}

__global__ void axpy_reduce_kernel(const float* partial, int64_t n_chunks, int64_t cols, int64_t n_tokens, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= cols * n_tokens) return;
  out[i] = chunk_sum(partial, n_chunks, n_tokens * cols, i);
}

__global__ void ffn_merge_kernel(float* x, float* o, const float* cpu, const float* partial, int64_t n_chunks,
                                 const float* down_b, int64_t cols, int64_t n_tokens, bool keep_o) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= cols * n_tokens) return;
  float v = cpu ? cpu[i] : 0.0f;
  if (partial) v = v + chunk_sum(partial, n_chunks, n_tokens * cols, i);
  if (down_b) v = v + down_b[i % cols];
  if (keep_o) o[i] = v;
  else x[i] += v;
}

__global__ void relu_kernel(float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(y[i], 0.0f);
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

// f(std::integral_constant<int, T>) for the type's template tag T (cuda_common.cuh).
template <class F>
void by_type(DType type, F&& f) {
  switch (type) {
    case DType::F32: f(std::integral_constant<int, 0>{}); break;
    case DType::F16: f(std::integral_constant<int, 1>{}); break;
    case DType::Q8_0: f(std::integral_constant<int, 8>{}); break;
    case DType::Q4_1: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 2>{}); break;
  }
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
void copy_device(void* dst, const void* src, size_t bytes, void* s) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(s)), "cudaMemcpyAsync (on device)");
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

void* event_create() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}
void event_destroy(void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
void event_record(void* e, void* s) { check(cudaEventRecord(static_cast<cudaEvent_t>(e), as_stream(s)), "cudaEventRecord"); }
void event_sync(void* e) { check(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize"); }
void* timing_event_create() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreate(&e), "cudaEventCreate");
  return e;
}
float event_elapsed_ms(void* a, void* b) {
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)), "cudaEventElapsedTime");
  return ms;
}

uint64_t launches() { return g_launches.load(std::memory_order_relaxed); }

namespace {
std::atomic<int> g_tile_math{-1};
TileMath default_tile_math() {
  if (const char* env = std::getenv("EMBER_CUDA_TILES")) {
    if (std::strcmp(env, "dp4a") == 0) return TileMath::dp4a;
    if (std::strcmp(env, "mma") == 0) return TileMath::mma;
    fail("EMBER_CUDA_TILES='{}': dp4a or mma", env);
  }
#ifdef EMBER_CUDA_ON_CPU
  return TileMath::dp4a;
#else
  int dev = 0, major = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  return major >= 8 ? TileMath::mma : TileMath::dp4a;
#endif
}
}  // namespace

TileMath tile_math() {
  int m = g_tile_math.load(std::memory_order_relaxed);
  if (m < 0) {
    m = static_cast<int>(default_tile_math());
    g_tile_math.store(m, std::memory_order_relaxed);
  }
  return static_cast<TileMath>(m);
}
void set_tile_math(TileMath m) { g_tile_math.store(static_cast<int>(m), std::memory_order_relaxed); }

#ifdef EMBER_CUDA_ON_CPU
bool graphs_supported() { return false; }
void capture_begin(void*) { fail("CUDA graphs: the HIP CPU runtime has none"); }
void* capture_end(void*, size_t*) { fail("CUDA graphs: the HIP CPU runtime has none"); }
void graph_launch(void*, void*) { fail("CUDA graphs: the HIP CPU runtime has none"); }
void graph_destroy(void*) {}
#else
bool graphs_supported() { return true; }
void capture_begin(void* s) {
  check(cudaStreamBeginCapture(as_stream(s), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}
void* capture_end(void* s, size_t* nodes) {
  cudaGraph_t g = nullptr;
  check(cudaStreamEndCapture(as_stream(s), &g), "cudaStreamEndCapture");
  size_t n = 0;
  check(cudaGraphGetNodes(g, nullptr, &n), "cudaGraphGetNodes");
  if (nodes) *nodes = n;
  cudaGraphExec_t e = nullptr;
  const cudaError_t r = cudaGraphInstantiate(&e, g, 0);
  cudaGraphDestroy(g);
  check(r, "cudaGraphInstantiate");
  return e;
}
void graph_launch(void* g, void* s) {
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(g), as_stream(s)), "cudaGraphLaunch");
}
void graph_destroy(void* g) {
  if (g) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
}
#endif

bool supports(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1;
}

bool takes_q8(DType t) { return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0; }

void pack_matrix(DType type, const void* src, int64_t rows, int64_t cols, void* dst) {
  check_type(type, cols);
  const size_t rb = row_bytes(type, cols);
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (!takes_q8(type)) {
    std::memcpy(d, s, rb * static_cast<size_t>(rows));
    return;
  }
  // GGUF blocks: the factors (d; Q4_1: d, m) first, then the codes.
  const size_t factor = type == DType::Q4_1 ? 4 : 2, code = type == DType::Q8_0 ? 32 : 16, block = factor + code;
  const int64_t nb = cols / kQK;
  uint8_t* codes = d;
  uint8_t* factors = d + static_cast<size_t>(rows * nb) * code;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = s + static_cast<size_t>(r) * rb + static_cast<size_t>(b) * block;
      const size_t k = static_cast<size_t>(r * nb + b);
      std::memcpy(factors + k * factor, blk, factor);
      std::memcpy(codes + k * code, blk + factor, code);
    }
}

void quantize_q8(const float* x, int64_t n_tokens, int64_t cols, void* xq, void* stream) {
  EMBER_CHECK(cols % kQK == 0, "CUDA quantize_q8: rows of {} values (a multiple of 32)", cols);
  const int64_t n_blocks = n_tokens * cols / kQK;
  if (n_blocks == 0) return;
  constexpr int kWarpsPerBlock = 8;
  auto* codes = static_cast<uint8_t*>(xq);
  auto* ds = reinterpret_cast<__half*>(codes + n_blocks * kQK);
  quantize_q8_kernel<<<grid_of(n_blocks, kWarpsPerBlock), kWarpsPerBlock * kWarp, 0, as_stream(stream)>>>(x, n_blocks,
                                                                                                         codes, ds);
  launched("quantize_q8 kernel");
}

void q8_to_blocks(const void* host_xq, int64_t n_tokens, int64_t cols, void* host_blocks) {
  const int64_t n_blocks = n_tokens * cols / kQK;
  const auto* codes = static_cast<const uint8_t*>(host_xq);
  const uint8_t* ds = codes + n_blocks * kQK;
  auto* out = static_cast<uint8_t*>(host_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) {
    std::memcpy(out + b * kQ8_1Bytes, ds + b * 4, 4);
    std::memcpy(out + b * kQ8_1Bytes + 4, codes + b * kQK, kQK);
  }
}

void matvec(const Matrix& W, const RowSet& rs, Activations x, int64_t n_tokens, const MatvecOut& out, void* stream) {
  check_type(W.type, W.cols);
  const int64_t max_rows = rs.max >= 0 ? rs.max : W.rows;
  if (max_rows == 0 || n_tokens == 0) return;
  const void* xp = takes_q8(W.type) ? x.q8 : static_cast<const void*>(x.f);
  EMBER_CHECK(xp, "CUDA matvec: {} rows need {} activations", dtype_name(W.type), takes_q8(W.type) ? "8-bit" : "float");
  EMBER_CHECK(out.kind == Epilogue::select || out.y, "CUDA matvec: no output");
  EMBER_CHECK((out.kind != Epilogue::fire && out.kind != Epilogue::select) || out.counts, "CUDA matvec: no counts");
  EMBER_CHECK(out.kind != Epilogue::select || out.mask, "CUDA matvec: no mask for the selection");
  MvArgs a{static_cast<const uint8_t*>(W.data), W.rows, W.cols, rs.ids, rs.count, max_rows, xp, n_tokens, n_tokens, out};
  if (a.out.stride == 0) a.out.stride = max_rows;
  cudaStream_t s = as_stream(stream);
  if (n_tokens >= kGemmMinTokens) {  // a prompt: tiles, each weight read once per 64 tokens
    if (out.kind == Epilogue::fire || out.kind == Epilogue::select) {
      const int64_t n_counts = out.kind == Epilogue::fire ? max_rows : std::min(out.k, max_rows);
      if (n_counts > 0) detail::check(cudaMemsetAsync(out.counts, 0, sizeof(int32_t) * n_counts, s), "cudaMemsetAsync");
    }
    const dim3 grid(grid_of(max_rows, kGmRows), grid_of(n_tokens, kGmTokens));
    const bool mma = tile_math() == TileMath::mma;
    by_type(W.type, [&](auto tag) {
      constexpr int T = decltype(tag)::value;
      if constexpr (T >= 2) {
        if (mma) matmul_tiles_kernel<T, true><<<grid, kGmThreads, 0, s>>>(a);
        else matmul_tiles_kernel<T, false><<<grid, kGmThreads, 0, s>>>(a);
      } else {
        matmul_tiles_f_kernel<T><<<grid, kGmThreads, 0, s>>>(a);
      }
    });
    launched("tiled matmul kernel");
    return;
  }
  // Epilogues of one token at a time may split the tokens over blocks (prompts: more blocks,
  // each row read once per slice); fire and select count over all tokens in one warp.
  const bool per_token = out.kind != Epilogue::fire && out.kind != Epilogue::select;
  constexpr int64_t kSlice = 4 * kMvTokens;
  if (per_token && n_tokens > kSlice) a.tokens_per_block = kSlice;
  const dim3 grid(grid_of(max_rows, kMvWarps), static_cast<unsigned>((n_tokens + a.tokens_per_block - 1) / a.tokens_per_block));
  by_type(W.type, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    matvec_kernel<T><<<grid, kMvWarps * kWarp, 0, s>>>(a);
  });
  launched("matvec kernel");
}

void matvec(DType type, const void* W, int64_t cols, int64_t rows, Activations x, int64_t n_tokens, float* y,
            void* stream) {
  MatvecOut o;
  o.y = y;
  matvec({type, W, rows, cols}, {}, x, n_tokens, o, stream);
}

void gather_matvec(DType type, const void* W, int64_t w_rows, int64_t cols, const int32_t* rows,
                   const int32_t* n_rows, int64_t max_rows, Activations x, int64_t n_tokens, float* y,
                   int64_t y_stride, void* stream) {
  MatvecOut o;
  o.y = y;
  o.stride = y_stride;
  matvec({type, W, w_rows, cols}, {rows, n_rows, max_rows}, x, n_tokens, o, stream);
}

void compact(const int32_t* counts, int64_t max_n, const int32_t* n_valid, const int32_t* ids, int32_t* out_ids,
             int32_t* out_pos, int32_t* totals, void* stream, uint64_t* fired_total) {
  const unsigned blocks = grid_of(std::max<int64_t>(max_n, 1), kCompactSpan);
  compact_kernel<<<blocks, kCompactSpan, 0, as_stream(stream)>>>(counts, max_n, n_valid, ids, out_ids, out_pos, totals,
                                                                 reinterpret_cast<unsigned long long*>(fired_total));
  launched("compact kernel");
}

void relu(float* y, int64_t n, void* stream) {
  if (n == 0) return;
  relu_kernel<<<grid_of(n, 256), 256, 0, as_stream(stream)>>>(y, n);
  launched("relu kernel");
}

void add(const float* a, const float* b, float* out, int64_t n, void* stream) {
  if (n == 0) return;
  add_kernel<<<grid_of(n, 256), 256, 0, as_stream(stream)>>>(a, b, out, n);
  launched("add kernel");
}

void sparse_axpy_partial(DType type, const void* D, int64_t n_rows, int64_t cols, const int32_t* active,
                         const int32_t* n_active, const float* h, int64_t h_stride, int64_t n_tokens, float* partial,
                         void* stream) {
  check_type(type, cols);
  EMBER_CHECK(cols % 8 == 0, "CUDA sparse_axpy: rows of {} values (a multiple of 8)", cols);
  if (cols == 0 || n_tokens == 0) return;
  const int64_t n_chunks = axpy_chunks(n_tokens);
  const auto* d = static_cast<const uint8_t*>(D);
  cudaStream_t s = as_stream(stream);
  const bool tiles = n_tokens >= kAxpyTilesMin && takes_q8(type) && tile_math() == TileMath::mma;
  by_type(type, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if constexpr (T >= 2) {
      if (tiles) {  // a long prompt on tensor cores: each row read once per 64 tokens
        const dim3 grid(grid_of(cols, kAtCols), grid_of(n_tokens, kAtTokens));
        axpy_tiles_kernel<T><<<grid, kAtThreads, 0, s>>>(d, n_rows, cols, active, n_active, h, h_stride, n_tokens,
                                                         partial);
        return;
      }
    }
    if (n_tokens >= kAxpyBatchMin) {  // a prompt: each row read once per kAxpyTok tokens
      const dim3 grid(grid_of(cols / 8, kAxpyThreads), static_cast<unsigned>(n_chunks),
                      grid_of(n_tokens, kAxpyTok));
      axpy_tokens_kernel<T><<<grid, kAxpyThreads, 0, s>>>(d, n_rows, cols, active, n_active, h, h_stride, n_tokens,
                                                           partial);
      return;
    }
    const dim3 grid(grid_of(cols / kAxpyCols<T>, kAxpyThreads), static_cast<unsigned>(n_chunks),
                    static_cast<unsigned>(n_tokens));
    axpy_kernel<T><<<grid, kAxpyThreads, 0, s>>>(d, n_rows, cols, active, n_active, h, h_stride, partial);
  });
  launched("sparse_axpy kernel");
}

void axpy_reduce(const float* partial, int64_t cols, int64_t n_tokens, float* out, void* stream) {
  if (cols * n_tokens == 0) return;
  axpy_reduce_kernel<<<grid_of(cols * n_tokens, 256), 256, 0, as_stream(stream)>>>(partial, axpy_chunks(n_tokens), cols,
                                                                                   n_tokens, out);
  launched("axpy_reduce kernel");
}

void sparse_axpy(DType type, const void* D, int64_t n_rows, int64_t cols, const int32_t* active,
                 const int32_t* n_active, const float* h, int64_t h_stride, int64_t n_tokens, float* out,
                 float* partial, void* stream) {
  sparse_axpy_partial(type, D, n_rows, cols, active, n_active, h, h_stride, n_tokens, partial, stream);
  axpy_reduce(partial, cols, n_tokens, out, stream);
}

void ffn_merge(float* x, float* o, const float* cpu, const float* partial, const float* down_b, int64_t cols,
               int64_t n_tokens, bool keep_o, void* stream) {
  if (cols * n_tokens == 0) return;
  ffn_merge_kernel<<<grid_of(cols * n_tokens, 256), 256, 0, as_stream(stream)>>>(
      x, o, cpu, partial, axpy_chunks(n_tokens), down_b, cols, n_tokens, keep_o);
  launched("ffn_merge kernel");
}

}  // namespace ember::cuda
