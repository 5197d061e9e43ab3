// AVX2 + FMA + F16C kernel of the neuron-major 4-bit axpy (ops/cpu/nm4.hpp): a segment's
// products are summed in registers 32 outputs at a time, then scaled once into the output.
// The same operations per output as the scalar kernel, so the same bits.
#include <immintrin.h>

#include "ops/cpu/nm4.hpp"

namespace ember::cpu::detail {
namespace {

// The 32 codes of one chunk as four vectors of 8 floats (outputs 0-7, 8-15, 16-23, 24-31),
// q - 8 for Q4_0 (kMin false) or q for Q4_1.
template <bool kMin>
inline void codes(const uint8_t* p, __m256 (&f)[4]) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
  if constexpr (!kMin) {
    const __m128i eight = _mm_set1_epi8(8);
    lo = _mm_sub_epi8(lo, eight);
    hi = _mm_sub_epi8(hi, eight);
  }
  f[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  f[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  f[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  f[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

template <bool kMin>
void axpy(const TensorView& D, const int32_t* rows, const float* h, int64_t n, int64_t col0, int64_t len,
          float* out) {
  const int64_t n_embd = D.cols();
  const size_t stride = D.row_stride();
  const uint8_t* codes_at = D.data + col0 / 2;
  nm4_segments(rows, h, n, [&](const int32_t* ids, const float* hs, int c, int64_t block, int64_t) {
    const uint16_t* d = nm4_scales(D, block) + col0;
    const __m256 s = _mm256_set1_ps(nm4_factor_sum(hs, c));
    for (int64_t j = 0; j < len; j += 32) {
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int r = 0; r < c; ++r) {
        __m256 f[4];
        codes<kMin>(codes_at + static_cast<size_t>(ids[r]) * stride + j / 2, f);
        const __m256 hv = _mm256_set1_ps(hs[r]);
        for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(hv, f[k], acc[k]);
      }
      for (int k = 0; k < 4; ++k) {
        float* o = out + j + 8 * k;
        __m256 v = _mm256_loadu_ps(o);
        if constexpr (kMin)
          v = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + n_embd + j + 8 * k))),
                              s, v);
        v = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + j + 8 * k))), acc[k],
                            v);
        _mm256_storeu_ps(o, v);
      }
    }
  });
}

}  // namespace

Nm4AxpyFn nm4_axpy_avx2(DType t) {
  if (t == DType::Q4_0_NM) return &axpy<false>;
  if (t == DType::Q4_1_NM) return &axpy<true>;
  return nullptr;
}

}  // namespace ember::cpu::detail
