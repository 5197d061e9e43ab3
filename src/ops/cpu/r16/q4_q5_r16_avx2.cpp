// The Q4_0_R16 / Q4_1_R16 / Q5_0_R16 kernels built for AVX2 (r16/q4_q5_r16_avx2_kernel.hpp).
#include <immintrin.h>

#include "ops/cpu/r16/r16_avx2.hpp"

namespace ember::cpu::detail {
namespace {
#include "ops/cpu/r16/q4_q5_r16_avx2_kernel.hpp"
}  // namespace

void gemm_q4_0_r16_avx2(const GemmArgs& a) { run_r16_tiles<Kernel<false>>(a); }
void gemm_q4_1_r16_avx2(const GemmArgs& a) { run_r16_tiles<Kernel<true>>(a); }
void gemm_q5_0_r16_avx2(const GemmArgs& a) { run_r16_tiles<Kernel<false, true>>(a); }

}  // namespace ember::cpu::detail
