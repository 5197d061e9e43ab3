// Internal interface between matmul.cpp and the kernel files: the arguments of a GEMM kernel
// (the kernels themselves are found in gemm/gemm_table.hpp), the activation quantizers, and the quad
// layout of the 4- and 5-bit kernels' activations. Not part of the public API.
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

// The scalar reference kernels' frame: y[t][r] = dot(k, row r, token t's activations), one
// dot product of a row and a token at a time.
using DotFn = float (*)(int64_t k, const uint8_t* w, const uint8_t* x);
template <DotFn dot>
void gemm_by_dot(const GemmArgs& a) {
  for (int64_t t = 0; t < a.ntok; ++t)
    for (int64_t r = 0; r < a.nrows; ++r)
      a.y[t * a.y_stride + r] = dot(a.k, a.w + r * a.w_stride, a.x + t * a.x_stride);
}

// Activation quantizers of an ISA, each bit-identical to quantize_row (null: use quantize_row);
// the quads_* write one float row straight to the quad layout below of the Q4_0 (Q8_0
// quantization) or Q4_1 (Q8_1) kernels: the bytes prepare_quads gives for quantize_row's output.
struct ActQuantizers {
  void (*q8_0)(const float* x, void* out, int64_t k) = nullptr;
  void (*q8_1)(const float* x, void* out, int64_t k) = nullptr;
  void (*q8_k)(const float* x, void* out, int64_t k) = nullptr;
  void (*quads_q8_0)(const float* x, void* out, int64_t k) = nullptr;
  void (*quads_q8_1)(const float* x, void* out, int64_t k) = nullptr;
};
const ActQuantizers& act_quantizers_avx2();    // gemm/act_quant_avx2.cpp (rows only: no quad kernels)
const ActQuantizers& act_quantizers_avx512();  // gemm/gemm_avx512.cpp
// Those of the current SIMD level (all null at the scalar level).
const ActQuantizers& act_quantizers();

// Quad layout of one activation row for the 4-bit kernels: the row's 32-element blocks in groups
// of four ("quads", the last one zero-padded), kQuadBytes each, 64-byte aligned:
//   lo[64]  int8   elements 0..15 of blocks 0, 1, 2, 3 (16 bytes each)
//   hi[64]  int8   elements 16..31 of blocks 0..3
//   d[16]   float  block scale, block i in lanes 4i..4i+3
//   c[16]   Q4_0 / Q5_0 (Q8_0 rows): int32 -8 / -16 * (sum of the 4 lo and 4 hi bytes that
//                  share the lane) so that vpdpbusd of the unsigned weights starting from c gives
//                  the exact integer dot of (q - 8) or (q - 16) and x lane by lane;
//           Q4_1 / Q5_1 (Q8_1 rows): float s (= d * sum, from the Q8_1 block) in lane 4i, 0 elsewhere.
// A 32-bit lane j of lo/hi/d/c belongs to block j / 4, so the lanes of a vpdpbusd line up with
// the scales without any shuffling of the activations in the kernels.
constexpr size_t kQuadBytes = 256;
inline size_t quad_row_bytes(int64_t k) { return static_cast<size_t>((k / 32 + 3) / 4) * kQuadBytes; }
// k elements of one Q8_0 (weight Q4_0, Q5_0) or Q8_1 (weight Q4_1, Q5_1) row to the quad layout.
void prepare_quads(DType weight_type, const void* xq_row, void* out, int64_t k);


// Every kernel computes each output element with the same sequence of operations whatever the
// tile it falls in, so results do not depend on how rows and tokens are split over threads.

}  // namespace ember::cpu::detail
