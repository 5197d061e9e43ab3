// Internal: the Q4_0_R16 product kernels (q4_0_r16.cpp, q4_0_r16_avx512.cpp), called by matmul.cpp.
// Both take activations as R16Act rows and nrows a multiple of 16 (rows w_stride bytes apart,
// so group g starts at w + 16 g w_stride).
#pragma once
#include "ops/cpu/kernels.hpp"
#include "ops/cpu/q4_0_r16.hpp"

namespace ember::cpu::detail {

void gemm_q4_0_r16_scalar(const GemmArgs& a);
void gemm_q4_0_r16_avx512(const GemmArgs& a);

}  // namespace ember::cpu::detail
