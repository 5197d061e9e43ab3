#include <immintrin.h>

#include "ops/cpu/vec_impl.hpp"
#include "tensor/fp16.hpp"

EMBER_DEFINE_VEC_KERNELS(avx2)

namespace ember::cpu::detail {

void to_f16_avx2(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void from_f16_avx2(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

}  // namespace ember::cpu::detail
