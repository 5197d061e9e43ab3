// Attention on AVX2 + FMA + F16C (the portable path's fast case: head sizes a multiple of 8),
// per token and head:
//   scores: q.k_j four positions at a time (independent multiply-add chains over the head's
//     8-value chunks, one horizontal-add tree for the four sums); the query stays in L1;
//   softmax: the 8-lane exp of exp_simd.hpp (the approximation activation_impl.hpp describes);
//   weighted sum of the value rows with up to 64 output columns held in registers.
// The loop in attention/attention.cpp calls dot_f32 / axpy_f32 once per position and libm's exp once per
// score, and widens F16 rows into a buffer first.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cpu/activation_impl.hpp"
#include "ops/cpu/attention/attention.hpp"
#include "ops/cpu/attention/kv_prefetch.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/simd_f32.hpp"
#include "ops/cpu/exp_simd.hpp"

// Eight K or V elements as floats: the cache holds F32 (float) or F16 (uint16_t).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// The four lane sums of a, b, c, d.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  const __m256 x = _mm256_hadd_ps(ab, cd);  // per 128-bit half: [a, b, c, d] partial sums
  return _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
}

inline float hsum1(__m256 a) {
  const __m256 z = _mm256_setzero_ps();
  return _mm_cvtss_f32(hsum4(a, z, z, z));
}

// scores[j] = scale * q.k_j for j < n (k_j at k + j * stride), four positions at a time.
template <class E>
void attend_scores(const float* q, const E* k, int64_t stride, int64_t n, int64_t hd, float scale, float* scores) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const E* k0 = k + j * stride;
    __m256 acc[4];
    for (int i = 0; i < 4; ++i) prefetch_kv_ahead(k, stride, j + i, n, hd);
    const __m256 q0 = _mm256_loadu_ps(q);
    for (int i = 0; i < 4; ++i) acc[i] = _mm256_mul_ps(q0, load8(k0 + i * stride));
    for (int64_t c = 8; c < hd; c += 8) {
      const __m256 qc = _mm256_loadu_ps(q + c);
      for (int i = 0; i < 4; ++i) acc[i] = _mm256_fmadd_ps(qc, load8(k0 + i * stride + c), acc[i]);
    }
    _mm_storeu_ps(scores + j, _mm_mul_ps(hsum4(acc[0], acc[1], acc[2], acc[3]), _mm_set1_ps(scale)));
  }
  for (; j < n; ++j) {
    const E* kj = k + j * stride;
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), load8(kj));
    for (int64_t c = 8; c < hd; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), load8(kj + c), acc);
    scores[j] = hsum1(acc) * scale;
  }
}

// scores[0, n) = softmax(scores[0, n)) (after soft-capping when softcap > 0).
void attend_softmax(float softcap, int64_t n, float* scores, float* stat) {
  if (softcap > 0)
    for (int64_t j = 0; j < n; ++j) scores[j] = softcap * std::tanh(scores[j] / softcap);
  float mx = -INFINITY;
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(scores + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  for (float l : lanes) mx = std::max(mx, l);
  for (; j < n; ++j) mx = std::max(mx, scores[j]);
  // p_j = e^(s_j - max); the tail through the same 8-lane exp.
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 sum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 e = exp_approx(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vmx));
    _mm256_storeu_ps(scores + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = hsum1(sum);
  if (j < n) {
    alignas(32) float t[8] = {};
    for (int64_t i = j; i < n; ++i) t[i - j] = scores[i] - mx;
    _mm256_store_ps(t, exp_approx(_mm256_load_ps(t)));
    for (int64_t i = j; i < n; ++i) scores[i] = t[i - j], total += t[i - j];
  }
  if (stat) stat[0] = mx, stat[1] = total;
  const __m256 inv = _mm256_set1_ps(1.0f / total);
  for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(scores + j, _mm256_mul_ps(_mm256_loadu_ps(scores + j), inv));
  for (; j < n; ++j) scores[j] *= 1.0f / total;
}

// out[0, 8 R) = sum_j p[j] v_j[0, 8 R), the columns in R registers.
template <int R, class E>
void weighted_block(const float* p, const E* v, int64_t stride, int64_t n, float* out) {
  __m256 acc[R];
  for (int c = 0; c < R; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const E* vj = v + j * stride;
    prefetch_kv_ahead(v, stride, j, n, 8 * R);
    for (int c = 0; c < R; ++c) acc[c] = _mm256_fmadd_ps(pj, load8(vj + 8 * c), acc[c]);
  }
  for (int c = 0; c < R; ++c) _mm256_storeu_ps(out + 8 * c, acc[c]);
}

template <class E>
void attend_weighted_sum(const float* p, const E* v, int64_t stride, int64_t n, int64_t hd, float* out) {
  for (int64_t c0 = 0; c0 < hd; c0 += 64) {
    switch (std::min<int64_t>(8, (hd - c0) / 8)) {
      case 1: weighted_block<1>(p, v + c0, stride, n, out + c0); break;
      case 2: weighted_block<2>(p, v + c0, stride, n, out + c0); break;
      case 3: weighted_block<3>(p, v + c0, stride, n, out + c0); break;
      case 4: weighted_block<4>(p, v + c0, stride, n, out + c0); break;
      case 5: weighted_block<5>(p, v + c0, stride, n, out + c0); break;
      case 6: weighted_block<6>(p, v + c0, stride, n, out + c0); break;
      case 7: weighted_block<7>(p, v + c0, stride, n, out + c0); break;
      default: weighted_block<8>(p, v + c0, stride, n, out + c0);
    }
  }
}

#include "ops/cpu/attention/attend_head.hpp"

// G (2 to 4) heads that share their K and V rows (grouped-query attention), as the AVX-512 file's
// grouped kernel: each K and V chunk loaded (and converted from F16) once for the G heads. With
// 16 registers the query chunks come from L1 (the columns in the outer loop) and P positions go
// at a time, P = 4 for two heads and 2 for three or four (G x P sums, P K chunks and a query
// chunk). Every score's chain (a multiply, then multiply-adds over the chunks in order) and its
// hsum4 tree, and every output's chain over the positions, are the one-head kernel's: the same
// bits.
template <int G, class E>
void group_scores(const float* q, const E* k, int64_t stride, int64_t n, int64_t hd, float scale, float* scores) {
  constexpr int P = G == 2 ? 4 : 2, S = G * P;
  const __m128 vscale = _mm_set1_ps(scale);
  const __m256 z = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + P <= n; j += P) {
    const E* kj = k + j * stride;
    __m256 acc[S], kc[P];  // acc[i * G + g]: position j + i, head g
    for (int i = 0; i < P; ++i) prefetch_kv_ahead(k, stride, j + i, n, hd);
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i) kc[i] = load8(kj + i * stride);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m256 qg = _mm256_loadu_ps(q + g * hd);
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i) acc[i * G + g] = _mm256_mul_ps(qg, kc[i]);
    }
    for (int64_t c = 8; c < hd; c += 8) {
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i) kc[i] = load8(kj + i * stride + c);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const __m256 qg = _mm256_loadu_ps(q + g * hd + c);
#pragma GCC unroll 4
        for (int i = 0; i < P; ++i) acc[i * G + g] = _mm256_fmadd_ps(qg, kc[i], acc[i * G + g]);
      }
    }
    alignas(16) float sc[(S + 3) / 4 * 4];
#pragma GCC unroll 4
    for (int f = 0; f < S; f += 4)  // four sums a tree (zeros past S): each sum's own tree as hsum1's
      _mm_store_ps(sc + f, _mm_mul_ps(hsum4(acc[f], f + 1 < S ? acc[f + 1] : z, f + 2 < S ? acc[f + 2] : z,
                                            f + 3 < S ? acc[f + 3] : z),
                                      vscale));
    for (int i = 0; i < P; ++i)
      for (int g = 0; g < G; ++g) scores[g * n + j + i] = sc[i * G + g];
  }
  for (; j < n; ++j)
    for (int g = 0; g < G; ++g) {
      const E* kj = k + j * stride;
      const float* qg = q + g * hd;
      __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qg), load8(kj));
      for (int64_t c = 8; c < hd; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qg + c), load8(kj + c), acc);
      scores[g * n + j] = hsum1(acc) * scale;
    }
}

// Columns [0, 8 R) of the G heads' outputs (head g's at out + g hd; p: head g's weights at p + g n),
// each value chunk loaded once for the G heads.
template <int G, int R, class E>
void group_weighted_block(const float* p, const E* v, int64_t stride, int64_t n, int64_t hd, float* out) {
  __m256 acc[G][R];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int c = 0; c < R; ++c) acc[g][c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const E* vj = v + j * stride;
    prefetch_kv_ahead(v, stride, j, n, 8 * R);
    __m256 vc[R];
#pragma GCC unroll 4
    for (int c = 0; c < R; ++c) vc[c] = load8(vj + 8 * c);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m256 pg = _mm256_set1_ps(p[g * n + j]);
#pragma GCC unroll 4
      for (int c = 0; c < R; ++c) acc[g][c] = _mm256_fmadd_ps(pg, vc[c], acc[g][c]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int c = 0; c < R; ++c) _mm256_storeu_ps(out + g * hd + 8 * c, acc[g][c]);
}

// All hd columns, as many chunks a pass over the positions as 16 registers hold (G R sums, R value
// chunks and a weight): 4 for two heads, 3 for three, 2 for four.
template <int G, class E>
void group_weighted_sum(const float* p, const E* v, int64_t stride, int64_t n, int64_t hd, float* out) {
  constexpr int R = G == 2 ? 4 : G == 3 ? 3 : 2;
  for (int64_t c0 = 0; c0 < hd; c0 += 8 * R) {
    switch (std::min<int64_t>(R, (hd - c0) / 8)) {
      case 1: group_weighted_block<G, 1>(p, v + c0, stride, n, hd, out + c0); break;
      case 2: group_weighted_block<G, 2>(p, v + c0, stride, n, hd, out + c0); break;
      case 3: group_weighted_block<G, 3>(p, v + c0, stride, n, hd, out + c0); break;
      default: group_weighted_block<G, R>(p, v + c0, stride, n, hd, out + c0);
    }
  }
}

template <int G, class E>
void attend_group(const AttentionShape& s, const float* q, const E* k, const E* v, int64_t stride, int64_t n,
                  float* out, float* scores, float* stat) {
  group_scores<G>(q, k, stride, n, s.head_dim, s.scale, scores);
  for (int g = 0; g < G; ++g) attend_softmax(s.softcap, n, scores + g * n, stat ? stat + 2 * g : nullptr);
  group_weighted_sum<G>(scores, v, stride, n, s.head_dim, out);
}

}  // namespace

void attend_group_avx2(const AttentionShape& s, int heads, const float* q, const void* k, const void* v,
                       int64_t kv_stride, int64_t n, float* out, float* scores, float* stat) {
  with_cache_type(s, k, v, [&](auto kt, auto vt) {
    switch (heads) {
      case 2: attend_group<2>(s, q, kt, vt, kv_stride, n, out, scores, stat); break;
      case 3: attend_group<3>(s, q, kt, vt, kv_stride, n, out, scores, stat); break;
      default: attend_group<4>(s, q, kt, vt, kv_stride, n, out, scores, stat); break;
    }
  });
}

void attend_one_avx2(const AttentionShape& s, const float* qh, const void* k, const void* v, int64_t kv_stride,
                     int64_t n, float* outh, float* scores, float* stat) {
  attend_head(s, qh, k, v, kv_stride, n, outh, scores, stat);
}

}  // namespace ember::cpu::detail
