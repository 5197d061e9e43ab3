// Bodies of the float vector routines. Included by vec.cpp, vec_avx2.cpp and vec_avx512.cpp,
// each compiled for its instruction set (the loops are written so the compiler vectorizes
// them); vec.cpp picks one table at run time. Plain runtime dispatch rather than ifunc
// (target_clones) keeps the library usable under the sanitizers.
#pragma once
#include <cmath>
#include <cstdint>

namespace ember::cpu::detail {

struct VecKernels {
  float (*dot)(const float*, const float*, int64_t);
  void (*axpy)(float, const float*, float*, int64_t);
  void (*scale)(float, float*, int64_t);
  void (*add)(const float*, float*, int64_t);
  void (*scale_mul)(const float*, float, const float*, float*, int64_t);
  float (*sum_squares)(const float*, int64_t);
  float (*max)(const float*, int64_t);
};

const VecKernels& vec_kernels_baseline();
const VecKernels& vec_kernels_avx2();
const VecKernels& vec_kernels_avx512();

}  // namespace ember::cpu::detail

// Defines the table `vec_kernels_<SUFFIX>()` in the including file.
#define EMBER_DEFINE_VEC_KERNELS(SUFFIX)                                                        \
  namespace ember::cpu::detail {                                                                \
  namespace {                                                                                   \
  /* Sixteen independent accumulators: vectorizable without reassociating the sum. */           \
  float dot(const float* a, const float* b, int64_t n) {                                        \
    float acc[16] = {};                                                                         \
    int64_t i = 0;                                                                              \
    for (; i + 16 <= n; i += 16)                                                                \
      for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];                               \
    float s = 0;                                                                                \
    for (; i < n; ++i) s += a[i] * b[i];                                                        \
    for (int j = 0; j < 16; ++j) s += acc[j];                                                   \
    return s;                                                                                   \
  }                                                                                             \
  void axpy(float a, const float* x, float* y, int64_t n) {                                     \
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];                                           \
  }                                                                                             \
  void scale(float a, float* y, int64_t n) {                                                    \
    for (int64_t i = 0; i < n; ++i) y[i] *= a;                                                  \
  }                                                                                             \
  void add(const float* x, float* y, int64_t n) {                                               \
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];                                               \
  }                                                                                             \
  void scale_mul(const float* x, float a, const float* w, float* y, int64_t n) {                \
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * a * w[i];                                     \
  }                                                                                             \
  float sum_squares(const float* x, int64_t n) { return dot(x, x, n); }                          \
  /* Sixteen running maxima (vectorizable); NaNs never win a comparison, so they are skipped. */ \
  float max(const float* x, int64_t n) {                                                        \
    float acc[16];                                                                              \
    for (int j = 0; j < 16; ++j) acc[j] = -INFINITY;                                            \
    int64_t i = 0;                                                                              \
    for (; i + 16 <= n; i += 16)                                                                \
      for (int j = 0; j < 16; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];              \
    float m = -INFINITY;                                                                        \
    for (; i < n; ++i) m = x[i] > m ? x[i] : m;                                                 \
    for (int j = 0; j < 16; ++j) m = acc[j] > m ? acc[j] : m;                                   \
    return m;                                                                                   \
  }                                                                                             \
  }                                                                                             \
  const VecKernels& vec_kernels_##SUFFIX() {                                                    \
    static const VecKernels k{.dot = &dot, .axpy = &axpy, .scale = &scale, .add = &add,          \
                              .scale_mul = &scale_mul, .sum_squares = &sum_squares, .max = &max};  \
    return k;                                                                                   \
  }                                                                                             \
  }
