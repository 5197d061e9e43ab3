#include <immintrin.h>

#include "ops/cpu/vec_impl.hpp"

EMBER_DEFINE_VEC_KERNELS(avx512)

namespace ember::cpu::detail {

void to_f16_avx512(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(y + i, m,
                             _mm512_maskz_cvtps_ph(m, _mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

void from_f16_avx512(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_maskz_cvtph_ps(m, _mm256_maskz_loadu_epi16(m, x + i)));
  }
}

}  // namespace ember::cpu::detail
