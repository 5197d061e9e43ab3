// Internal interface between sparse.cpp and sparse_avx2.cpp. Not part of the public API.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tensor/dtype.hpp"

namespace ember::cpu::detail {

// out[0..n) += h * dequantized(src[0..n)), src starting at a block boundary of `type`;
// n is a multiple of the block size. Q8_0 and Q4_0 round it as (h * d) * q (the block scale
// in the factor), the other types as h * w. Null where the ISA has no fused kernel for the type.
using RowAxpyFn = void (*)(float h, const uint8_t* src, float* out, int64_t n);
// dst[0..n) = dequantized(src[0..n)), bit-identical to dequantize_row.
using DequantFn = void (*)(const uint8_t* src, float* dst, int64_t n);

struct SparseKernels {
  RowAxpyFn axpy = nullptr;
  DequantFn dequant = nullptr;
};

// AVX2+FMA+F16C kernels (also used at the AVX-512 level). Null members: no kernel.
SparseKernels sparse_kernels_avx2(DType type);

// AVX-512 one-token kernels over groups of (eight) scattered rows (sparse_avx512.cpp); null where there
// is none for the type.
// y[i] = dot(row rows[i] of w, x) for i < n: 4-bit rows (Q4_0, Q4_1) of k elements, x one
// activation row in the quad layout (kernels.hpp); bit-identical to the dense kernel's rows.
using GatherFn = void (*)(const uint8_t* w, size_t stride, const int32_t* rows, int64_t n, int64_t k,
                          const uint8_t* x, float* y);
GatherFn sparse_gather_avx512(DType type);
// out[0..len) += h[i] * dequantized(row rows[i] + offset bytes)[0..len) for i < n in list order,
// skipping zero h; len a multiple of 32. Bit-identical to RowAxpyFn row by row.
using AxpyRowsFn = void (*)(const uint8_t* d, size_t stride, size_t offset, const int32_t* rows, const float* h,
                            int64_t n, float* out, int64_t len);
AxpyRowsFn sparse_axpy_rows_avx512(DType type);
// For i < n in list order: h[i] = dot(up row rows[i], x) * g[i] (x as GatherFn takes it), then
// out[0..k) += h[i] * dequantized(down row rows[i]) (a neuron-major down of k columns), skipping
// zero h[i]. Bit-identical to GatherFn, the products and AxpyRowsFn in turn.
using UpDownFn = void (*)(const uint8_t* up, size_t up_stride, const uint8_t* down, size_t down_stride,
                          const int32_t* rows, const float* g, int64_t n, int64_t k, const uint8_t* x, float* h,
                          float* out);
UpDownFn sparse_up_down_avx512(DType up, DType down);

}  // namespace ember::cpu::detail
