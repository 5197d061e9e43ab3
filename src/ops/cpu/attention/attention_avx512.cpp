// Attention on AVX-512, per token over one head or over two to four heads that share a KV head:
//   scores: q.k_j with the query in registers (head sizes up to 256), four positions at a time
//     (independent multiply-add chains, one hsum4 tree for the four sums);
//   softmax: the 16-lane exp of exp_simd.hpp;
//   weighted sum of the value rows with the output columns held in registers.
// The grouped kernel loads (and converts, from an F16 cache) each K and V chunk once for its
// heads, and gives the one-head kernel's bits. The portable loop in attention/attention.cpp calls dot_f32 /
// axpy_f32 once per position, which at head size 64 spends most of its time in call and
// reduction overhead.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cpu/activation_impl.hpp"
#include "ops/cpu/attention/attention.hpp"
#include "ops/cpu/attention/kv_prefetch.hpp"

// GCC 12 warns that _mm256_undefined_pd() (inside the lane extracts of _mm512_reduce_add_ps) "may
// be used uninitialized" once these loops are unrolled; it is undefined by design.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/simd_f32.hpp"
#include "ops/cpu/exp_simd.hpp"

constexpr int kMaxRegs = 16;  // head sizes up to 256 keep q / the output in registers

inline __mmask16 lane_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
}

// Sixteen K or V elements (masked) as floats: the cache holds F32 (float) or F16 (uint16_t).
inline __m512 load(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load(__mmask16 m, const uint16_t* p) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

// The four lane sums of a, b, c, d.
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], the same for c, d; then the four sums.
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 x = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  const __m256 y = _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
  return _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
}

// The lane sum of a by the same tree as hsum4's (so that a score gets the same bits whichever
// kernel computed it: one head four positions at a time, four heads at once, or alone).
inline float hsum1(__m512 a) {
  const __m512 z = _mm512_setzero_ps();
  return _mm_cvtss_f32(hsum4(a, z, z, z));
}

// scores[j] = scale * q.k_j for j < n (k_j at k + j * stride), four positions at a time (four
// independent multiply-add chains; one chain would wait on its own latency).
template <int R, class E>
void scores_regs(const float* q, const E* k, int64_t stride, int64_t n, int64_t hd, float scale, float* scores) {
  // (Every loop over register arrays unrolled: see group_weighted_block.)
  __m512 qv[R];
  __mmask16 m[R];
#pragma GCC unroll 16
  for (int c = 0; c < R; ++c) m[c] = lane_mask(hd - 16 * c), qv[c] = _mm512_maskz_loadu_ps(m[c], q + 16 * c);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const E* k0 = k + j * stride;
    __m512 acc[4];
    for (int i = 0; i < 4; ++i) prefetch_kv_ahead(k, stride, j + i, n, hd);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) acc[i] = _mm512_mul_ps(qv[0], load(m[0], k0 + i * stride));
#pragma GCC unroll 16
    for (int c = 1; c < R; ++c)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) acc[i] = _mm512_fmadd_ps(qv[c], load(m[c], k0 + i * stride + 16 * c), acc[i]);
    _mm_storeu_ps(scores + j, _mm_mul_ps(hsum4(acc[0], acc[1], acc[2], acc[3]), _mm_set1_ps(scale)));
  }
  for (; j < n; ++j) {
    const E* kj = k + j * stride;
    __m512 acc = _mm512_mul_ps(qv[0], load(m[0], kj));
#pragma GCC unroll 16
    for (int c = 1; c < R; ++c) acc = _mm512_fmadd_ps(qv[c], load(m[c], kj + 16 * c), acc);
    scores[j] = hsum1(acc) * scale;
  }
}

// out[0, hd) = sum_j p[j] v_j, the output columns in R registers.
template <int R, class E>
void weighted_sum_regs(const float* p, const E* v, int64_t stride, int64_t n, int64_t hd, float* out) {
  __m512 acc[R];
  __mmask16 m[R];
#pragma GCC unroll 16
  for (int c = 0; c < R; ++c) acc[c] = _mm512_setzero_ps(), m[c] = lane_mask(hd - 16 * c);
  for (int64_t j = 0; j < n; ++j) {
    const __m512 pj = _mm512_set1_ps(p[j]);
    const E* vj = v + j * stride;
    prefetch_kv_ahead(v, stride, j, n, hd);
#pragma GCC unroll 16
    for (int c = 0; c < R; ++c) acc[c] = _mm512_fmadd_ps(pj, load(m[c], vj + 16 * c), acc[c]);
  }
#pragma GCC unroll 16
  for (int c = 0; c < R; ++c) _mm512_mask_storeu_ps(out + 16 * c, m[c], acc[c]);
}

template <int R, class E>
void scores_at(const float* q, const E* k, int64_t stride, int64_t n, int64_t hd, float scale, float* scores) {
  if constexpr (R > 1) {
    if (16 * (R - 1) >= hd) return scores_at<R - 1>(q, k, stride, n, hd, scale, scores);
  }
  scores_regs<R>(q, k, stride, n, hd, scale, scores);
}

template <int R, class E>
void weighted_sum_at(const float* p, const E* v, int64_t stride, int64_t n, int64_t hd, float* out) {
  if constexpr (R > 1) {
    if (16 * (R - 1) >= hd) return weighted_sum_at<R - 1>(p, v, stride, n, hd, out);
  }
  weighted_sum_regs<R>(p, v, stride, n, hd, out);
}

// Any head size: up to 256 the query in registers, above it from memory.
template <class E>
void attend_scores(const float* q, const E* k, int64_t stride, int64_t n, int64_t hd, float scale, float* scores) {
  if (hd <= 16 * kMaxRegs) return scores_at<kMaxRegs>(q, k, stride, n, hd, scale, scores);
  for (int64_t j = 0; j < n; ++j) {
    const E* kj = k + j * stride;
    prefetch_kv_ahead(k, stride, j, n, hd);
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), load(lane_mask(16), kj));  // hd > 256: full chunk
    for (int64_t c = 16; c < hd; c += 16) {
      const __mmask16 m = lane_mask(hd - c);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + c), load(m, kj + c), acc);
    }
    scores[j] = hsum1(acc) * scale;
  }
}

// Head sizes above 256: the output columns in chunks of 256.
template <class E>
void attend_weighted_sum(const float* p, const E* v, int64_t stride, int64_t n, int64_t hd, float* out) {
  for (int64_t c0 = 0; c0 < hd; c0 += 16 * kMaxRegs)
    weighted_sum_at<kMaxRegs>(p, v + c0, stride, n, std::min<int64_t>(hd - c0, 16 * kMaxRegs), out + c0);
}

// scores[0, n) = softmax(scores[0, n)) (after soft-capping when softcap > 0); stat, when given,
// receives the largest score and the sum of the exponentials (for merging chunks of positions).
void attend_softmax(float softcap, int64_t n, float* scores, float* stat) {
  if (softcap > 0)
    for (int64_t j = 0; j < n; ++j) scores[j] = softcap * std::tanh(scores[j] / softcap);
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = lane_mask(n - j);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, scores + j));
  }
  // p_j = e^(s_j - max), summed in sixteen lanes.
  const __m512 vmx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = lane_mask(n - j);
    const __m512 e = exp_approx(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + j), vmx));
    _mm512_mask_storeu_ps(scores + j, m, e);
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  const float total = _mm512_reduce_add_ps(sum);
  if (stat) stat[0] = _mm512_reduce_max_ps(vmax), stat[1] = total;
  const __m512 inv = _mm512_set1_ps(1.0f / total);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = lane_mask(n - j);
    _mm512_mask_storeu_ps(scores + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, scores + j), inv));
  }
}

#include "ops/cpu/attention/attend_head.hpp"

// G (2 to 4) heads that share their K and V rows (grouped-query attention): each K and V value
// is loaded (and converted from F16) once for the G instead of once per head. q and out hold
// the heads one after the other (head_dim apart); scores: G * n floats. Every score and output
// element goes through the same operations as in the one-head kernel (the products of a score
// chained over the columns from a multiply, the hsum4 tree, whose lane sums do not depend on
// each other; each output a chain over the positions), so the kernels agree bit for bit.

// The four lane sums of acc[0 .. G) (zeros beyond G).
template <int G>
inline __m128 hsum_g(const __m512 (&acc)[G]) {
  const __m512 z = _mm512_setzero_ps();
  if constexpr (G == 2) return hsum4(acc[0], acc[1], z, z);
  else if constexpr (G == 3) return hsum4(acc[0], acc[1], acc[2], z);
  else return hsum4(acc[0], acc[1], acc[2], acc[3]);
}

// The scores of P positions (j ..) of G heads from their lane sums acc[i * G + g] (position
// j + i, head g), through hsum4 four at a time, scaled; scores: the heads' rows of n apart.
template <int G, int P>
inline void store_scores(const __m512 (&acc)[G * P], __m128 vscale, float* scores, int64_t n, int64_t j) {
  constexpr int S = G * P;
  static_assert(S % 4 == 0);
  alignas(16) float sc[S];
#pragma GCC unroll 4
  for (int f = 0; f < S; f += 4)
    _mm_store_ps(sc + f, _mm_mul_ps(hsum4(acc[f], acc[f + 1], acc[f + 2], acc[f + 3]), vscale));
#pragma GCC unroll 16
  for (int f = 0; f < S; ++f) scores[f % G * n + j + f / G] = sc[f];
}

// The scores of the G heads, the heads' R column chunks held in registers (R <= 4). P positions
// at a time (4 where the registers allow, else 2): their G x P sums go through hsum4 four at a
// time, so one reduction tree serves four scores (a tree per position, padded with zeros, was
// most of this kernel's time). Each sum's own tree is the same either way: the bits do not change.
template <int G, int R, class E>
void group_scores_regs(const float* q, const E* k, int64_t stride, int64_t n, int64_t hd, float scale, float* scores) {
  constexpr int P = G * R + 4 * G + 1 <= 32 ? 4 : 2, S = G * P;
  __m512 qv[G][R];
  __mmask16 m[R];
#pragma GCC unroll 4
  for (int c = 0; c < R; ++c) {
    m[c] = lane_mask(hd - 16 * c);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) qv[g][c] = _mm512_maskz_loadu_ps(m[c], q + g * hd + 16 * c);
  }
  const __m128 vscale = _mm_set1_ps(scale);
  int64_t j = 0;
  for (; j + P <= n; j += P) {
    __m512 acc[S];  // acc[i * G + g]: position j + i, head g
    for (int i = 0; i < P; ++i) prefetch_kv_ahead(k, stride, j + i, n, hd);
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) {
      const E* kj = k + (j + i) * stride;
      const __m512 k0 = load(m[0], kj);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[i * G + g] = _mm512_mul_ps(qv[g][0], k0);
#pragma GCC unroll 4
      for (int c = 1; c < R; ++c) {
        const __m512 kc = load(m[c], kj + 16 * c);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) acc[i * G + g] = _mm512_fmadd_ps(qv[g][c], kc, acc[i * G + g]);
      }
    }
    store_scores<G, P>(acc, vscale, scores, n, j);
  }
  for (; j < n; ++j) {
    const E* kj = k + j * stride;
    __m512 acc[G];
    const __m512 k0 = load(m[0], kj);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[g] = _mm512_mul_ps(qv[g][0], k0);
#pragma GCC unroll 4
    for (int c = 1; c < R; ++c) {
      const __m512 kc = load(m[c], kj + 16 * c);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(qv[g][c], kc, acc[g]);
    }
    alignas(16) float sc[4];
    _mm_store_ps(sc, _mm_mul_ps(hsum_g<G>(acc), vscale));
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) scores[g * n + j] = sc[g];
  }
}

// The same for any head size, the query read from memory, from position j0 on.
template <int G, class E>
void group_scores_any(const float* q, const E* k, int64_t stride, int64_t n, int64_t hd, float scale, float* scores,
                      int64_t j0 = 0) {
  for (int64_t j = j0; j < n; ++j) {
    const E* kj = k + j * stride;
    prefetch_kv_ahead(k, stride, j, n, hd);
    __m512 acc[G];
    const __m512 k0 = load(lane_mask(hd), kj);
    for (int g = 0; g < G; ++g) acc[g] = _mm512_mul_ps(_mm512_maskz_loadu_ps(lane_mask(hd), q + g * hd), k0);
    for (int64_t c = 16; c < hd; c += 16) {
      const __mmask16 m = lane_mask(hd - c);
      const __m512 kc = load(m, kj + c);
      for (int g = 0; g < G; ++g) acc[g] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + g * hd + c), kc, acc[g]);
    }
    alignas(16) float sc[4];
    _mm_store_ps(sc, _mm_mul_ps(hsum_g<G>(acc), _mm_set1_ps(scale)));
    for (int g = 0; g < G; ++g) scores[g * n + j] = sc[g];
  }
}

// Head sizes 65 to 256 (too many column chunks to hold the G queries in registers): four
// positions at a time with the column chunks in the outer loop, each query chunk read (from L1)
// once for the four; the 4 G sums through hsum4 four at a time, as in group_scores_regs. The
// positions after the last four go through group_scores_any.
template <int G, class E>
void group_scores_wide(const float* q, const E* k, int64_t stride, int64_t n, int64_t hd, float scale,
                       float* scores) {
  constexpr int P = 4, S = G * P;
  const __m128 vscale = _mm_set1_ps(scale);
  int64_t j = 0;
  for (; j + P <= n; j += P) {
    const E* kj = k + j * stride;
    __m512 acc[S], kc[P];  // acc[i * G + g]: position j + i, head g
    for (int i = 0; i < P; ++i) prefetch_kv_ahead(k, stride, j + i, n, hd);
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) kc[i] = load(lane_mask(16), kj + i * stride);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 qg = _mm512_loadu_ps(q + g * hd);
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i) acc[i * G + g] = _mm512_mul_ps(qg, kc[i]);
    }
    for (int64_t c = 16; c < hd; c += 16) {
      const __mmask16 m = lane_mask(hd - c);
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i) kc[i] = load(m, kj + i * stride + c);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const __m512 qg = _mm512_maskz_loadu_ps(m, q + g * hd + c);
#pragma GCC unroll 4
        for (int i = 0; i < P; ++i) acc[i * G + g] = _mm512_fmadd_ps(qg, kc[i], acc[i * G + g]);
      }
    }
    store_scores<G, P>(acc, vscale, scores, n, j);
  }
  group_scores_any<G>(q, k, stride, n, hd, scale, scores, j);
}

// Columns [0, 16 R) (R <= 4; hd_left of them valid) of the G heads' outputs: sum_j p_g[j] v_j,
// 4 R accumulators, each value chunk loaded once per position.
template <int G, int R, class E>
void group_weighted_block(const float* p, const E* v, int64_t stride, int64_t n, int64_t hd_left, int64_t hd,
                         float* out) {
  // Every loop over g and c unrolled: an index GCC cannot resolve keeps acc in memory, stored back
  // on every position (12 stores a position at G = 3, R = 4: half the kernel's time).
  __m512 acc[G][R];
  __mmask16 m[R];
#pragma GCC unroll 4
  for (int c = 0; c < R; ++c) {
    m[c] = lane_mask(hd_left - 16 * c);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[g][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < n; ++j) {
    __m512 vc[R];
    prefetch_kv_ahead(v, stride, j, n, std::min<int64_t>(hd_left, 16 * R));
#pragma GCC unroll 4
    for (int c = 0; c < R; ++c) vc[c] = load(m[c], v + j * stride + 16 * c);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 pg = _mm512_set1_ps(p[g * n + j]);
#pragma GCC unroll 4
      for (int c = 0; c < R; ++c) acc[g][c] = _mm512_fmadd_ps(pg, vc[c], acc[g][c]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int c = 0; c < R; ++c) _mm512_mask_storeu_ps(out + g * hd + 16 * c, m[c], acc[g][c]);
}

template <int G, class E>
void attend_group(const AttentionShape& s, const float* q, const E* k, const E* v, int64_t stride, int64_t n,
                  float* out, float* scores, float* stat) {
  const int64_t hd = s.head_dim;
  switch ((hd + 15) / 16) {
    case 1: group_scores_regs<G, 1>(q, k, stride, n, hd, s.scale, scores); break;
    case 2: group_scores_regs<G, 2>(q, k, stride, n, hd, s.scale, scores); break;
    case 3: group_scores_regs<G, 3>(q, k, stride, n, hd, s.scale, scores); break;
    case 4: group_scores_regs<G, 4>(q, k, stride, n, hd, s.scale, scores); break;
    default:
      if (hd <= 16 * kMaxRegs) group_scores_wide<G>(q, k, stride, n, hd, s.scale, scores);
      else group_scores_any<G>(q, k, stride, n, hd, s.scale, scores);
  }
  for (int g = 0; g < G; ++g) attend_softmax(s.softcap, n, scores + g * n, stat ? stat + 2 * g : nullptr);
  for (int64_t c0 = 0; c0 < hd; c0 += 64) {
    const int64_t left = hd - c0;
    switch (std::min<int64_t>(4, (left + 15) / 16)) {
      case 1: group_weighted_block<G, 1>(scores, v + c0, stride, n, left, hd, out + c0); break;
      case 2: group_weighted_block<G, 2>(scores, v + c0, stride, n, left, hd, out + c0); break;
      case 3: group_weighted_block<G, 3>(scores, v + c0, stride, n, left, hd, out + c0); break;
      default: group_weighted_block<G, 4>(scores, v + c0, stride, n, left, hd, out + c0);
    }
  }
}

}  // namespace

void attend_one_avx512(const AttentionShape& s, const float* qh, const void* k, const void* v, int64_t kv_stride,
                       int64_t n, float* outh, float* scores, float* stat) {
  attend_head(s, qh, k, v, kv_stride, n, outh, scores, stat);
}

void attend_group_avx512(const AttentionShape& s, int heads, const float* q, const void* k, const void* v,
                         int64_t kv_stride, int64_t n, float* out, float* scores, float* stat) {
  with_cache_type(s, k, v, [&](auto kt, auto vt) {
    switch (heads) {
      case 2: attend_group<2>(s, q, kt, vt, kv_stride, n, out, scores, stat); break;
      case 3: attend_group<3>(s, q, kt, vt, kv_stride, n, out, scores, stat); break;
      default: attend_group<4>(s, q, kt, vt, kv_stride, n, out, scores, stat); break;
    }
  });
}

}  // namespace ember::cpu::detail
