// Prompts' products as tiles staged in shared memory (see cuda_ops.hpp, kGemmMinTokens), on
// tensor cores or dp4a (TileMath).
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/matvec.cuh"
#include "ops/cuda/mma.cuh"

namespace ember::cuda {

using namespace detail;

namespace {

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

template <DType T>
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
  using W = std::conditional_t<T == DType::F32, float, __half>;
  const W* wrow = reinterpret_cast<const W*>(a.w) + lr * a.cols;
  const float* xrow = static_cast<const float*>(a.x) + lt * a.cols;
  for (int64_t k0 = 0; k0 < a.cols; k0 += kGfCols) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t c = k0 + lc + j;
      float v = 0.0f;
      if (row_ok && c < a.cols) {
        if constexpr (T == DType::F32) v = wrow[c];
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


template <DType T, bool kMma>
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
      if constexpr (Split<T>::kWide) {
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
          int c[4] = {0, 0, 0, 0}, cb[4] = {0, 0, 0, 0};
          if constexpr (T == DType::Q6_K) {  // each half's sum alone: the other half's codes zeroed
            const int a0[4] = {af[0], af[1], 0, 0}, a1[4] = {0, 0, af[2], af[3]};
            mma_s8_16x8x32(a0, bf, c);
            mma_s8_16x8x32(a1, bf, cb);
          } else {
            mma_s8_16x8x32(af, bf, c);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int rr = mr + g + 8 * (e / 2), tt = tb + 2 * q4 + e % 2;
            acc[p][e] += block_term<T>(c[e], cb[e], swd[rr][kb], swm[rr][kb], sxds[tt][kb], sxsum[tt][kb]);
          }
        }
      } else {
#pragma unroll
        for (int p = 0; p < kGmSub; ++p) {
          const int rr = tr + p * (kGmRows / kGmSub);
#pragma unroll
          for (int q = 0; q < kGmSub; ++q) {
            const int tt = tc + q * (kGmTokens / kGmSub);
            int isum = 0, isum_b = 0;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              if (T == DType::Q6_K && e >= 4) isum_b = __dp4a(sw[rr][kb][e], sx[tt][kb][e], isum_b);
              else isum = __dp4a(sw[rr][kb][e], sx[tt][kb][e], isum);
            }
            acc[p][q] += block_term<T>(isum, isum_b, swd[rr][kb], swm[rr][kb], sxds[tt][kb], sxsum[tt][kb]);
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

void detail::launch_tiles(DType type, const MvArgs& a, cudaStream_t s) {
  const MatvecOut& out = a.out;
  const int64_t max_rows = a.max_rows;
  if (out.kind == Epilogue::fire || out.kind == Epilogue::select) {
    const int64_t n_counts = out.kind == Epilogue::fire ? max_rows : std::min(out.k, max_rows);
    if (n_counts > 0) check(cudaMemsetAsync(out.counts, 0, sizeof(int32_t) * n_counts, s), "cudaMemsetAsync");
  }
  const dim3 grid(grid_of(max_rows, kGmRows), grid_of(a.n_tokens, kGmTokens));
  const bool mma = tile_math() == TileMath::mma;
  by_type(type, [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    if constexpr (takes_q8_v<T>) {
      if (mma) matmul_tiles_kernel<T, true><<<grid, kGmThreads, 0, s>>>(a);
      else matmul_tiles_kernel<T, false><<<grid, kGmThreads, 0, s>>>(a);
    } else {
      matmul_tiles_f_kernel<T><<<grid, kGmThreads, 0, s>>>(a);
    }
  });
  launched("tiled matmul kernel");
}

}  // namespace ember::cuda
