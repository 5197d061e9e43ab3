// AVX2 activation quantizers: the 8-bit rows quantize_row writes (Q8_0, Q8_1, Q8_K), bit for bit,
// eight lanes at a time: d = amax / 127, q = x * (127 / amax) rounded to nearest even, a NaN
// scale and zero levels for a block holding a NaN or infinity (quant_sym8 in tensor/quant.cpp).
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "ops/cpu/gemm/gemm_kernels.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/simd_f32.hpp"

inline int reduce_add(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// The scale and 1 / scale of n = 8 * nv values (nv vectors at x), or false for a block holding a
// NaN or infinity: a sum of (v - v) is NaN exactly then.
inline bool block_scale(const float* x, int nv, float& d, __m256& id) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 m = _mm256_setzero_ps(), probe = _mm256_setzero_ps();
  for (int j = 0; j < nv; ++j) {
    const __m256 v = _mm256_loadu_ps(x + 8 * j);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
    probe = _mm256_add_ps(probe, _mm256_sub_ps(v, v));
  }
  if (_mm256_movemask_ps(_mm256_cmp_ps(probe, probe, _CMP_UNORD_Q)) != 0) {
    d = std::numeric_limits<float>::quiet_NaN();
    return false;
  }
  const float amax = F32Lanes<8>::reduce_max(m);
  d = amax / 127.f;
  id = _mm256_set1_ps(amax != 0.f ? 127.f / amax : 0.f);
  return true;
}

// 32 values at x to int8 levels at qs (|x * id| <= 127, so the saturating packs only narrow);
// returns their four 8-lane int32 vectors' sum vector.
inline __m256i quantize32(const float* x, __m256 id, int8_t* qs) {
  __m256i q[4];
  for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), id));  // nearest-even
  // packs work within 128-bit halves: the 32-bit groups come out as q0a q1a q2a q3a q0b q1b q2b q3b.
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i in_order = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), in_order);
  return _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
}

template <bool kWithSum>
void quantize_q8(const float* x, void* out, int64_t k) {
  using XB = std::conditional_t<kWithSum, BlockQ8_1, BlockQ8_0>;
  auto* b = static_cast<XB*>(out);
  for (int64_t i = 0; i < k / kQK; ++i, x += kQK) {
    float d;
    __m256 id;
    int sum = 0;
    if (block_scale(x, 4, d, id)) sum = reduce_add(quantize32(x, id, b[i].qs));
    else std::memset(b[i].qs, 0, sizeof b[i].qs);
    b[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    if constexpr (kWithSum) b[i].s = _cvtss_sh(d * static_cast<float>(sum), _MM_FROUND_TO_NEAREST_INT);
  }
}

// Q8_K: one scale per 256 values, and the sums of each 16 levels.
void quantize_q8_k(const float* x, void* out, int64_t k) {
  auto* b = static_cast<BlockQ8_K*>(out);
  for (int64_t i = 0; i < k / kQK_K; ++i, x += kQK_K) {
    __m256 id;
    if (!block_scale(x, kQK_K / 8, b[i].d, id)) {
      std::memset(b[i].qs, 0, sizeof b[i].qs);
      std::memset(b[i].bsums, 0, sizeof b[i].bsums);
      continue;
    }
    for (int j = 0; j < kQK_K / 32; ++j) {
      quantize32(x + 32 * j, id, b[i].qs + 32 * j);
      for (int h = 0; h < 2; ++h) {  // the two groups of 16, from the stored levels
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 32 * j + 16 * h));
        const __m256i s = _mm256_madd_epi16(_mm256_cvtepi8_epi16(q), _mm256_set1_epi16(1));
        b[i].bsums[2 * j + h] = static_cast<int16_t>(reduce_add(s));
      }
    }
  }
}

}  // namespace

const ActQuantizers& act_quantizers_avx2() {
  static const ActQuantizers q{.q8_0 = &quantize_q8<false>, .q8_1 = &quantize_q8<true>, .q8_k = &quantize_q8_k};
  return q;
}

}  // namespace ember::cpu::detail
