// The Q4_K_R16 / Q5_K_R16 kernels built for AVX-VNNI (r16/q4_k_r16_avx2_kernel.hpp).
#include <immintrin.h>

#include "ops/cpu/r16/k_scale_table.hpp"
#include "ops/cpu/r16/r16_avx2.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {
#include "ops/cpu/r16/q4_k_r16_avx2_kernel.hpp"
}  // namespace

void gemm_q4_k_r16_avxvnni(const GemmArgs& a) { run_r16_tiles<Kernel<false>>(a); }
void gemm_q5_k_r16_avxvnni(const GemmArgs& a) { run_r16_tiles<Kernel<true>>(a); }

}  // namespace ember::cpu::detail
