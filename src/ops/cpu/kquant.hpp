// Internal: kernels for the weight types added after the first kernel set (Q5_0, Q5_1 against
// Q8_0 / Q8_1 activations; Q4_K, Q5_K against Q8_K), one table per ISA in kquant_scalar.cpp,
// kquant_avx2.cpp and kquant_avx512.cpp. Kept apart from the KernelSet files so that work on
// either does not collide; matmul.cpp reaches them through kquant_pick.
#pragma once
#include "ops/cpu/kernels.hpp"

namespace ember::cpu::detail {

struct KQuantSet {
  GemmFn q5_0, q5_1, q4_k, q5_k;
};

const KQuantSet& kquant_scalar();
const KQuantSet& kquant_avx2();
const KQuantSet& kquant_avx512();

// The kernel for weight type w from the table of the same ISA as kernel set s (one of
// kernels_scalar / _avx2 / _avx512); null when there is none.
GemmFn kquant_pick(const KernelSet& s, DType w);

}  // namespace ember::cpu::detail
