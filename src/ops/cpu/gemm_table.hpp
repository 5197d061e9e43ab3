// The GEMM kernels (kernels.hpp's GemmArgs: blocks of rows x tokens), one table keyed by weight
// type and ISA. Each kernel file fills in its entries with an add_gemm_* function (below, one per
// file); matmul.cpp asks gemm_kernel() for the current SIMD level and nothing else; the kernel
// tests iterate gemm_weight_types() x every level against a double reference
// (tests/test_matmul.cpp), so a kernel added here is tested without a new test.
#pragma once
#include <vector>

#include "core/cpu_features.hpp"
#include "ops/cpu/kernels.hpp"
#include "tensor/dtype.hpp"

namespace ember::cpu::detail {

struct GemmKernel {
  GemmFn fn = nullptr;
  // It takes its activations rearranged (the quad layout of kernels.hpp; R16Act blocks for the
  // 16-row types, r16.hpp) rather than as quantized rows.
  bool quads = false;
};

// One ISA's kernels by weight type, as its files fill them in.
class GemmColumn {
 public:
  void add(DType w, GemmFn fn, bool quads = false);
  const GemmKernel* find(DType w) const;  // null: none at this level
  std::vector<DType> types() const;

 private:
  std::vector<std::pair<DType, GemmKernel>> entries_;
};

// Who fills what (each in its own file):
void add_gemm_scalar(GemmColumn& c);          // vec_dot_scalar.cpp: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q6_K
void add_gemm_avx2(GemmColumn& c);            // vec_dot_avx2.cpp: the same
void add_gemm_avx512(GemmColumn& c);          // vec_dot_avx512.cpp: the same (Q4_0 / Q4_1 on quads)
void add_gemm_q5_kquant_scalar(GemmColumn& c);  // kquant_scalar.cpp: Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K
void add_gemm_q5_kquant_avx2(GemmColumn& c);    // kquant_avx2.cpp: the same
void add_gemm_q5_kquant_avx512(GemmColumn& c);  // kquant_avx512.cpp: the same and Q6_K (Q5_0 / Q5_1 on quads)
void add_gemm_r16_scalar(GemmColumn& c);      // r16_gemm.cpp: the 16-row types (r16.hpp)
void add_gemm_r16_avx512(GemmColumn& c);      // r16_gemm.cpp: the same

// The kernel for weight type w at `level`: the level's own, else the scalar one; fn is null when
// there is none at all. A later filler of a column replaces an earlier one's entry (Q6_K).
const GemmKernel& gemm_kernel(DType w, SimdLevel level);
// Whether `level` has a kernel of its own for w (else it runs the scalar one).
bool gemm_has_own(DType w, SimdLevel level);
// Every weight type with a kernel, in the order of the scalar column.
std::vector<DType> gemm_weight_types();

}  // namespace ember::cpu::detail
