// Internal interface between sparse.cpp and sparse_avx2.cpp. Not part of the public API.
#pragma once
#include <cstdint>

#include "tensor/dtype.hpp"

namespace ember::cpu::detail {

// out[0..n) += h * dequantized(src[0..n)), src starting at a block boundary of `type`;
// n is a multiple of the block size. Null where the ISA has no fused kernel for the type.
using RowAxpyFn = void (*)(float h, const uint8_t* src, float* out, int64_t n);
// dst[0..n) = dequantized(src[0..n)), bit-identical to dequantize_row.
using DequantFn = void (*)(const uint8_t* src, float* dst, int64_t n);

struct SparseKernels {
  RowAxpyFn axpy = nullptr;
  DequantFn dequant = nullptr;
};

// AVX2+FMA+F16C kernels (also used at the AVX-512 level). Null members: no kernel.
SparseKernels sparse_kernels_avx2(DType type);

}  // namespace ember::cpu::detail
