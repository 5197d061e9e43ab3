// Internal interface between matmul.cpp and the per-ISA kernel files (vec_dot_scalar.cpp,
// vec_dot_avx2.cpp, vec_dot_avx512.cpp). Not part of the public API.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/cpu_features.hpp"
#include "tensor/dtype.hpp"

namespace ember::cpu::detail {

// A block of the product: y[t * y_stride + r] = dot(w row r, x row t) for r < nrows, t < ntok.
// Rows of w are w_stride bytes apart, activation rows x_stride bytes apart; x holds rows of
// activation_type(weight type), k elements each.
struct GemmArgs {
  int64_t k;
  const uint8_t* w;
  size_t w_stride;
  int64_t nrows;
  const uint8_t* x;
  size_t x_stride;
  int64_t ntok;
  float* y;
  int64_t y_stride;
};
using GemmFn = void (*)(const GemmArgs&);

// One entry per weight type with a kernel; null where the ISA has none (falls back to scalar).
struct KernelSet {
  GemmFn f32, f16, bf16, q8_0, q4_0, q4_1, q6_k;
  // Activation quantizers, bit-identical to quantize_row (null: use quantize_row).
  void (*quantize_q8_0)(const float* x, void* out, int64_t k) = nullptr;
  void (*quantize_q8_1)(const float* x, void* out, int64_t k) = nullptr;
};

const KernelSet& kernels_scalar();
const KernelSet& kernels_avx2();
const KernelSet& kernels_avx512();

// Every kernel computes each output element with the same sequence of operations whatever the
// tile it falls in, so results do not depend on how rows and tokens are split over threads.

}  // namespace ember::cpu::detail
