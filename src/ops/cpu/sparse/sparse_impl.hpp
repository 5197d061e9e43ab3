// Internal interface between sparse/sparse.cpp and its kernel files (sparse/sparse_avx2.cpp, sparse/sparse_avx512.cpp),
// whose kernels are found in tables keyed by weight type and ISA (kernel_table.hpp). Not part of
// the public API.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/cpu/kernel_table.hpp"
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
  explicit operator bool() const { return axpy || dequant; }
};

// One-token kernels over groups of scattered rows (sparse/sparse_avx512.cpp: eight, sparse/sparse_avx2.cpp:
// four); null where there is none for the type.
// y[i] = dot(row rows[i] of w, x) for i < n: 4-bit rows (Q4_0, Q4_1) of k elements, x one
// activation row as the level's dense row kernel takes it (AVX-512: the quad layout of
// gemm/gemm_kernels.hpp; AVX2: quantized blocks); bit-identical to that kernel's rows.
using GatherFn = void (*)(const uint8_t* w, size_t stride, const int32_t* rows, int64_t n, int64_t k,
                          const uint8_t* x, float* y);

// out[0..len) += h[i] * dequantized(row rows[i] + offset bytes)[0..len) for i < n in list order,
// skipping zero h; len a multiple of 32. Bit-identical to RowAxpyFn row by row.
using AxpyRowsFn = void (*)(const uint8_t* d, size_t stride, size_t offset, const int32_t* rows, const float* h,
                            int64_t n, float* out, int64_t len);

// For i < n in list order: h[i] = dot(up row rows[i], x) * g[i] (x as GatherFn takes it), then
// out[0..k) += h[i] * dequantized(down row rows[i]) (a neuron-major down of k columns), skipping
// zero h[i]. Bit-identical to GatherFn, the products and AxpyRowsFn in turn.
using UpDownFn = void (*)(const uint8_t* up, size_t up_stride, const uint8_t* down, size_t down_stride,
                          const int32_t* rows, const float* g, int64_t n, int64_t k, const uint8_t* x, float* h,
                          float* out);
// Keyed by two types (up's and down's), so not in a table: null where there is none.
UpDownFn sparse_up_down_avx512(DType up, DType down);

// The tables, filled once by the kernel files (AVX2's row kernels serve the AVX-512 level too).
struct SparseTables {
  KernelTable<SparseKernels> rows;    // one row's fused axpy and dequantization
  KernelTable<GatherFn> gather;       // one token's products with groups of scattered rows (quad layout)
  KernelTable<GatherFn> gather_blocks;  // the same against quantized blocks (AVX2's row kernel)
  KernelTable<AxpyRowsFn> axpy_rows;  // one token's axpy over groups of scattered rows
};
void add_sparse_avx2(SparseTables& t);    // sparse/sparse_avx2.cpp
void add_sparse_avx512(SparseTables& t);  // sparse/sparse_avx512.cpp
const SparseTables& sparse_tables();      // sparse/sparse.cpp

}  // namespace ember::cpu::detail
