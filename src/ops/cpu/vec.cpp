#include "ops/cpu/vec.hpp"

#include "core/cpu_features.hpp"
#include "ops/cpu/vec_impl.hpp"
#include "tensor/fp16.hpp"

EMBER_DEFINE_VEC_KERNELS(baseline)

namespace ember::cpu::detail {
void to_f16_avx2(const float* x, uint16_t* y, int64_t n);
void to_f16_avx512(const float* x, uint16_t* y, int64_t n);
void from_f16_avx2(const uint16_t* x, float* y, int64_t n);
void from_f16_avx512(const uint16_t* x, float* y, int64_t n);
void transpose_f32_avx2(const float* src, int64_t rows, int64_t cols, int64_t r0, int64_t r1, float* dst);
}  // namespace ember::cpu::detail

namespace ember::cpu {
namespace {

const detail::VecKernels& kernels() {
  switch (vector_level()) {
    case SimdLevel::avx512: return detail::vec_kernels_avx512();
    case SimdLevel::avx2: return detail::vec_kernels_avx2();
    default: return detail::vec_kernels_baseline();
  }
}

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) { return kernels().dot(a, b, n); }
void axpy_f32(float a, const float* x, float* y, int64_t n) { kernels().axpy(a, x, y, n); }
void scale_f32(float a, float* y, int64_t n) { kernels().scale(a, y, n); }
void add_f32(const float* x, float* y, int64_t n) { kernels().add(x, y, n); }
void scale_mul_f32(const float* x, float a, const float* w, float* y, int64_t n) {
  kernels().scale_mul(x, a, w, y, n);
}
float sum_squares_f32(const float* x, int64_t n) { return kernels().sum_squares(x, n); }
float max_f32(const float* x, int64_t n) { return kernels().max(x, n); }

int64_t argmax_f32(const float* x, int64_t n) {
  if (n <= 0) return -1;
  const float m = max_f32(x, n);
  // The chunk that holds it (vector maxima), then the index inside.
  constexpr int64_t kChunk = 256;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = n - i < kChunk ? n - i : kChunk;
    if (max_f32(x + i, len) != m) continue;
    for (int64_t j = 0; j < len; ++j)
      if (x[i + j] == m) return i + j;
  }
  return 0;
}

void transpose_f32(const float* src, int64_t rows, int64_t cols, int64_t r0, int64_t r1, float* dst) {
  if (vector_level() != SimdLevel::scalar) return detail::transpose_f32_avx2(src, rows, cols, r0, r1, dst);
  // Tiles of 8 x 8: 8 source and 8 destination lines at a time.
  for (int64_t t0 = r0; t0 < r1; t0 += 8)
    for (int64_t c0 = 0; c0 < cols; c0 += 8)
      for (int64_t c = c0; c < cols && c < c0 + 8; ++c)
        for (int64_t r = t0; r < r1 && r < t0 + 8; ++r) dst[c * rows + r] = src[r * cols + c];
}

// An F16 row conversion: the AVX-512 or F16C kernel, else the scalar function per value.
template <class From, class To>
void convert(const From* x, To* y, int64_t n, void (*avx512)(const From*, To*, int64_t),
             void (*avx2)(const From*, To*, int64_t), To (*one)(From)) {
  switch (vector_level()) {
    case SimdLevel::avx512: return avx512(x, y, n);
    case SimdLevel::avx2: return avx2(x, y, n);
    default:
      for (int64_t i = 0; i < n; ++i) y[i] = one(x[i]);
  }
}

void to_f16(const float* x, uint16_t* y, int64_t n) {
  convert(x, y, n, &detail::to_f16_avx512, &detail::to_f16_avx2, &fp32_to_fp16);
}

void from_f16(const uint16_t* x, float* y, int64_t n) {
  convert(x, y, n, &detail::from_f16_avx512, &detail::from_f16_avx2, &fp16_to_fp32);
}

}  // namespace ember::cpu
