// Internal: kernels for the weight types added after the first kernel set (Q5_0, Q5_1 against
// Q8_0 / Q8_1 activations; Q2_K, Q3_K, Q4_K, Q5_K and a faster Q6_K against Q8_K), one table per ISA in kquant_scalar.cpp,
// kquant_avx2.cpp and kquant_avx512.cpp. Kept apart from the KernelSet files so that work on
// either does not collide; matmul.cpp picks from both tables of the current ISA.
#pragma once
#include "ops/cpu/kernels.hpp"

namespace ember::cpu::detail {

struct KQuantSet {
  GemmFn q5_0, q5_1, q4_k, q5_k;
  GemmFn q2_k, q3_k;
  GemmFn q6_k = nullptr;  // when null, the KernelSet's q6_k
  bool q5_quads = false;   // q5_0 / q5_1 take activations in the quad layout (kernels.hpp)
};

const KQuantSet& kquant_scalar();
const KQuantSet& kquant_avx2();
const KQuantSet& kquant_avx512();

}  // namespace ember::cpu::detail
