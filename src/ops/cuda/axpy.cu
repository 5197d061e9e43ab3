// The down projection of the fired neurons (sparse_axpy: sums of rows, chunked, added in chunk
// order) and the FFN block's merge on the device (see cuda_ops.hpp).
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.hpp"
#include "ops/cuda/mma.cuh"

namespace ember::cuda {

using namespace detail;

namespace {

// Columns a thread of the axpy owns: one block of 32 for the block types (its codes in one or two
// 16-byte loads), 8 values for F16 and F32 (one or two 16-byte loads).
template <DType T>
constexpr int kAxpyCols = (T == DType::F32 || T == DType::F16) ? 8 : kQK;
constexpr int kAxpyThreads = 64;

// Thread's columns j0 .. j0 + C - 1 of row r, times hv, into acc.
template <DType T>
__device__ __forceinline__ void axpy_row(const uint8_t* D, int64_t n_rows, int64_t cols, int64_t r, int64_t j0, float hv,
                                         float (&acc)[kAxpyCols<T>]) {
  if constexpr (T == DType::F32 || T == DType::F16) {
    float w[8];
    if constexpr (T == DType::F32) load8(reinterpret_cast<const float*>(D) + r * cols, j0, w);
    else load8(reinterpret_cast<const __half*>(D) + r * cols, j0, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += hv * w[i];
  } else {
    const SplitRows<T> s(D, n_rows, cols);
    WBlock<T> blk;
    load_block<T>(s, r, j0 / kQK, blk);
    const float dh = blk.d * hv;
    const uint8_t* q = reinterpret_cast<const uint8_t*>(blk.c);
    if constexpr (T == DType::Q8_0) {
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[i] += dh * static_cast<float>(static_cast<int8_t>(q[i]));
    } else {
      const float off = T == DType::Q4_0 ? -8.0f : 0.0f, mh = blk.m * hv;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const float lo = static_cast<float>(q[i] & 15) + off, hi = static_cast<float>(q[i] >> 4) + off;
        if constexpr (T == DType::Q4_0) {
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
template <DType T>
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

template <DType T>
__device__ __forceinline__ void axpy_cols8(const uint8_t* D, int64_t n_rows, int64_t cols, int64_t r, int64_t j0,
                                           float (&w)[8], float& d, float& m) {
  if constexpr (T == DType::F32 || T == DType::F16) {
    if constexpr (T == DType::F32) load8(reinterpret_cast<const float*>(D) + r * cols, j0, w);
    else load8(reinterpret_cast<const __half*>(D) + r * cols, j0, w);
  } else {
    const SplitRows<T> sr(D, n_rows, cols);
    const int64_t b = j0 / kQK;
    const int sub = static_cast<int>((j0 % kQK) / 8);  // which 8 of the block's 32
    const uint8_t* codes = sr.row_codes(r) + b * Split<T>::kCodeBytes;
    const uint8_t* f = sr.block_factors(r, b);
    d = half_at(f);
    if constexpr (T == DType::Q4_1) m = half_at(f + 2);
    if constexpr (T == DType::Q8_0) {
      const uint2 v = reinterpret_cast<const uint2*>(codes)[sub];
      const unsigned u[2] = {v.x, v.y};
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = static_cast<float>(static_cast<int8_t>((u[i / 4] >> (8 * (i % 4))) & 0xffu));
    } else {
      const uint2 v = reinterpret_cast<const uint2*>(codes)[sub % 2];  // bytes 0-7 or 8-15
      const unsigned u[2] = {v.x, v.y};
      const float off = T == DType::Q4_0 ? -8.0f : 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const unsigned byte = (u[i / 4] >> (8 * (i % 4))) & 0xffu;
        w[i] = static_cast<float>(sub < 2 ? (byte & 15u) : (byte >> 4)) + off;
      }
    }
  }
}

template <DType T>
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
      if constexpr (T == DType::F32 || T == DType::F16) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[q][i] += hv[q] * w[i];
      } else if constexpr (T == DType::Q4_1) {
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

template <DType T>
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
        const uint32_t w = *reinterpret_cast<const uint32_t*>(codes + (T == DType::Q8_0 ? off : off % 16));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const unsigned byte = (w >> (8 * i)) & 0xffu;
          float code;
          if constexpr (T == DType::Q8_0) code = static_cast<float>(static_cast<int8_t>(byte));
          else code = static_cast<float>(off < 16 ? (byte & 15u) : (byte >> 4)) - (T == DType::Q4_0 ? 8.0f : 0.0f);
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
          const uint8_t* f = sr.block_factors(active[k], nb0 + b);
          d[b] = half_at(f);
          if constexpr (T == DType::Q4_1) m[b] = half_at(f + 2);
        }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = tt + 16 * i;
        const float hv = k < na && t0 + t < n_tokens ? h[(t0 + t) * h_stride + k] : 0.0f;
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          if constexpr (T == DType::Q4_1) hm_own[i][b] += hv * m[b];  // in step order
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
  if constexpr (T == DType::Q4_1) {
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
      if constexpr (T == DType::Q4_1) {
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
}  // namespace

void sparse_axpy_partial(DType type, const void* D, int64_t n_rows, int64_t cols, const int32_t* active,
                         const int32_t* n_active, const float* h, int64_t h_stride, int64_t n_tokens, float* partial,
                         void* stream) {
  check_type(type, cols);
  EMBER_CHECK(axpy_reads(type), "CUDA sparse_axpy: neuron-major rows of {} are not read (the down's copy is Q8_0)",
              dtype_name(type));
  EMBER_CHECK(cols % 8 == 0, "CUDA sparse_axpy: rows of {} values (a multiple of 8)", cols);
  if (cols == 0 || n_tokens == 0) return;
  const int64_t n_chunks = axpy_chunks(n_tokens);
  const auto* d = static_cast<const uint8_t*>(D);
  cudaStream_t s = as_stream(stream);
  const bool tiles = n_tokens >= kAxpyTilesMin && takes_q8(type) && tile_math() == TileMath::mma;
  by_type(type, [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    if constexpr (axpy_reads(T)) {  // others refused above
      if constexpr (takes_q8_v<T>) {
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
    }
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
