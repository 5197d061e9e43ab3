// Small float vector routines used by norms, attention and activations. Each is compiled for
// AVX-512, AVX2 and baseline and picked at load time (GCC target_clones), so the library
// stays runnable on any x86-64 CPU.
#pragma once
#include <cstdint>

namespace ember::cpu {

float dot_f32(const float* a, const float* b, int64_t n);
// y += a * x
void axpy_f32(float a, const float* x, float* y, int64_t n);
// y *= a
void scale_f32(float a, float* y, int64_t n);
// y += x
void add_f32(const float* x, float* y, int64_t n);
// y = (x * a) * w, element by element
void scale_mul_f32(const float* x, float a, const float* w, float* y, int64_t n);
float sum_squares_f32(const float* x, int64_t n);
float max_f32(const float* x, int64_t n);
// The first index of the largest value (std::max_element's answer; NaNs are never the largest,
// all-NaN gives 0), -1 when n <= 0. Vectorized: a greedy step over a 262k vocabulary.
int64_t argmax_f32(const float* x, int64_t n);
// dst[c * rows + r] = src[r * cols + c] for the source rows r in [r0, r1) of src [rows x cols]
// (a caller splits the rows among threads): 8 x 8 tiles transposed in registers on AVX2 and up.
void transpose_f32(const float* src, int64_t rows, int64_t cols, int64_t r0, int64_t r1, float* dst);
// y = x rounded to F16 (nearest even), as quantize_row(DType::F16) (F16C / AVX-512 conversions)
void to_f16(const float* x, uint16_t* y, int64_t n);
// y = x widened from F16 (exact)
void from_f16(const uint16_t* x, float* y, int64_t n);

}  // namespace ember::cpu
