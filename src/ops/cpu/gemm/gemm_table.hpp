// The GEMM kernels (gemm/gemm_kernels.hpp's GemmArgs: blocks of rows x tokens), one table keyed by weight
// type and ISA (a KernelTable, kernel_table.hpp). Each kernel file fills in its entries with an add_gemm_* function (below, one per
// file); matmul.cpp asks gemm_kernel() for the current SIMD level and nothing else; the kernel
// tests iterate gemm_weight_types() x every level against a double reference
// (tests/test_matmul.cpp), so a kernel added here is tested without a new test.
#pragma once
#include <vector>

#include "core/cpu_features.hpp"
#include "ops/cpu/kernel_table.hpp"
#include "ops/cpu/gemm/gemm_kernels.hpp"
#include "tensor/dtype.hpp"

namespace ember::cpu::detail {

struct GemmKernel {
  GemmFn fn = nullptr;
  // It takes its activations rearranged (the quad layout of gemm/gemm_kernels.hpp; R16Act blocks for the
  // 16-row types, r16/r16.hpp) rather than as quantized rows.
  bool quads = false;
  explicit operator bool() const { return fn != nullptr; }
};
using GemmTable = KernelTable<GemmKernel>;

// Who fills what (each in its own file):
void add_gemm_scalar(GemmTable& t);          // gemm/gemm_scalar.cpp: F32, F16, BF16, Q8_0, Q4_0, Q4_1
void add_gemm_avx2(GemmTable& t);            // gemm/gemm_avx2.cpp: the same
void add_gemm_avx512(GemmTable& t);          // gemm/gemm_avx512.cpp: the same (Q4_0 / Q4_1 on quads)
void add_gemm_q5_kquant_scalar(GemmTable& t);  // gemm/gemm_q5_kquant_scalar.cpp: Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
void add_gemm_q5_kquant_avx2(GemmTable& t);    // gemm/gemm_q5_kquant_avx2.cpp: the same
void add_gemm_q5_kquant_avx512(GemmTable& t);  // gemm/gemm_q5_kquant_avx512.cpp: the same (Q5_0 / Q5_1 on quads)
void add_gemm_r16_scalar(GemmTable& t);      // r16/r16_gemm.cpp: the 16-row types (r16/r16.hpp)
void add_gemm_r16_avx2(GemmTable& t);        // r16/r16_gemm.cpp: the same
void add_gemm_r16_avx_vnni(GemmTable& t);    // r16/r16_gemm.cpp: the types with vpdpbusd kernels on 256 bits
void add_gemm_r16_avx512(GemmTable& t);      // r16/r16_gemm.cpp: every one

// The kernel for weight type w at `level`: the level's own, else the next lower level's (AVX-512
// has every type AVX2 has, so that is the scalar one); fn is null when there is none at all. Each
// (type, level) is filled once.
const GemmKernel& gemm_kernel(DType w, SimdLevel level);
// Whether `level` has a kernel of its own for w (not the next lower level's).
bool gemm_has_own(DType w, SimdLevel level);
// Every weight type with a kernel (each has a scalar one), in the order added.
std::vector<DType> gemm_weight_types();

}  // namespace ember::cpu::detail
