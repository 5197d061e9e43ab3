// The device code every product kernel shares (matvec.cu, tiles.cu, experts.cu): a warp's dots of
// one row with up to kMvTokens tokens (8-bit blocks against quantize_q8's codes, float rows against
// floats), the activations, the epilogue that writes every product's result, and the launch
// arguments. Included by .cu files only.
#pragma once
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_ops.hpp"

namespace ember::cuda::detail {

constexpr int kMvWarps = 4;   // rows a block computes, a warp each
constexpr int kMvUnroll = 4;  // blocks of 32 weights a lane loads before it uses the first

// A block's term of a (row, token) product from the integer sums of its codes' products with the
// token's codes (isum; Q6_K: isum over the first 16, isum_b over the last), the block's factors
// (WBlock: d, m) and the token's (d, s) and code sum (xsum): Q8_0 and Q5_0 (its codes q - 16) d_w
// d_x isum; Q4_0 d_w d_x (isum - 8 xsum); Q4_1, Q5_1, Q4_K, Q5_K d_w d_x isum + m_w s_x; Q6_K d_x
// (d_a isum + d_b isum_b). The matvec (block_dot) and the prompt tiles both write their terms here:
// the same float operations.
template <DType T>
__device__ __forceinline__ float block_term(int isum, int isum_b, float dw, float mw, uint32_t ds, int xsum) {
  if constexpr (T == DType::Q8_0 || T == DType::Q5_0) return dw * half_lo(ds) * static_cast<float>(isum);
  else if constexpr (T == DType::Q4_0) return dw * half_lo(ds) * static_cast<float>(isum - 8 * xsum);
  else if constexpr (T == DType::Q6_K) return half_lo(ds) * (dw * static_cast<float>(isum) + mw * static_cast<float>(isum_b));
  else return dw * half_lo(ds) * static_cast<float>(isum) + mw * half_hi(ds);
}

// One block's term against x's codes (32 bytes) and (d, s).
template <DType T>
__device__ __forceinline__ float block_dot(const WBlock<T>& w, const uint8_t* xc, uint32_t xds) {
  const int4 x0 = reinterpret_cast<const int4*>(xc)[0], x1 = reinterpret_cast<const int4*>(xc)[1];
  const int u[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  int isum = 0, isum_b = 0, xsum = 0;
  if constexpr (Split<T>::kWide) {
    const int v[8] = {static_cast<int>(w.c[0].x), static_cast<int>(w.c[0].y), static_cast<int>(w.c[0].z),
                      static_cast<int>(w.c[0].w), static_cast<int>(w.c[1].x), static_cast<int>(w.c[1].y),
                      static_cast<int>(w.c[1].z), static_cast<int>(w.c[1].w)};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (T == DType::Q6_K && i >= 4) isum_b = __dp4a(v[i], u[i], isum_b);
      else isum = __dp4a(v[i], u[i], isum);
    }
  } else {
    const int v[4] = {static_cast<int>(w.c[0].x), static_cast<int>(w.c[0].y), static_cast<int>(w.c[0].z),
                      static_cast<int>(w.c[0].w)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      isum = __dp4a(v[i] & 0x0F0F0F0F, u[i], isum);             // codes of elements 4i .. 4i + 3
      isum = __dp4a((v[i] >> 4) & 0x0F0F0F0F, u[i + 4], isum);  // and of 16 + 4i ..
    }
    if constexpr (T == DType::Q4_0) {
#pragma unroll
      for (int i = 0; i < 8; ++i) xsum = __dp4a(0x01010101, u[i], xsum);
    }
  }
  return block_term<T>(isum, isum_b, w.d, w.m, xds, xsum);
}

// A lane's share of row r's dots with tokens t0 .. t0 + ng - 1 into acc: blocks lane, lane + 32,
// ... in order (kMvUnroll of them loaded before the first is used).
template <DType T>
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

// A warp's dots of row r of W (the device layout of w_rows rows of cols values of type T) with
// tokens t0 .. t0 + ng - 1 of x (floats for F32 / F16, quantize_q8's layout of n_tokens rows
// otherwise), each lane's share into acc (warp_sum adds them).
template <DType T>
__device__ __forceinline__ void lane_dots(const uint8_t* w, int64_t w_rows, int64_t cols, int64_t r, const void* x,
                                          int64_t n_tokens, int64_t t0, int ng, int lane, float (&acc)[kMvTokens]) {
  if constexpr (T == DType::F32) {
    lane_dots_f(reinterpret_cast<const float*>(w) + r * cols, cols, static_cast<const float*>(x), t0, ng, lane, acc);
  } else if constexpr (T == DType::F16) {
    lane_dots_f(reinterpret_cast<const __half*>(w) + r * cols, cols, static_cast<const float*>(x), t0, ng, lane, acc);
  } else {
    lane_dots_q<T>(SplitRows<T>(w, w_rows, cols), r, Q8Acts(x, n_tokens, cols), t0, ng, lane, acc);
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

// A prompt's product as tiles (tiles.cu): a.out's epilogue over every (row, token) of a, each
// weight read once per 64 tokens.
void launch_tiles(DType type, const MvArgs& a, cudaStream_t s);

}  // namespace ember::cuda::detail
