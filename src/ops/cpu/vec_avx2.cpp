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

// transpose_f32 (vec.hpp) for rows [r0, r1): 8 x 8 tiles through unpack / shuffle / permute,
// the edges element by element.
void transpose_f32_avx2(const float* src, int64_t rows, int64_t cols, int64_t r0, int64_t r1, float* dst) {
  int64_t r = r0;
  for (; r + 8 <= r1; r += 8) {
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      __m256 v[8], t[8];
      for (int i = 0; i < 8; ++i) v[i] = _mm256_loadu_ps(src + (r + i) * cols + c);
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
      }
      for (int i = 0; i < 8; i += 4)
        for (int j = 0; j < 2; ++j) {
          v[i + j] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], _MM_SHUFFLE(1, 0, 1, 0));
          v[i + j + 2] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], _MM_SHUFFLE(3, 2, 3, 2));
        }
      // v[0..3]: columns 0, 2, 1, 3 of rows 0..3 (low half) and of columns 4, 6, 5, 7 (high half);
      // v[4..7] the same for rows 4..7.
      static constexpr int kCol[4] = {0, 2, 1, 3};
      for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(dst + (c + kCol[i]) * rows + r, _mm256_permute2f128_ps(v[i], v[i + 4], 0x20));
        _mm256_storeu_ps(dst + (c + 4 + kCol[i]) * rows + r, _mm256_permute2f128_ps(v[i], v[i + 4], 0x31));
      }
    }
    for (; c < cols; ++c)
      for (int64_t i = r; i < r + 8; ++i) dst[c * rows + i] = src[i * cols + c];
  }
  for (; r < r1; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

}  // namespace ember::cpu::detail
