// The Q6_K_R16 kernel built for AVX-VNNI (r16/q6_k_r16_avx2_kernel.hpp).
#include <immintrin.h>

#include "ops/cpu/r16/r16_avx2.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {
#include "ops/cpu/r16/q6_k_r16_avx2_kernel.hpp"
}  // namespace

void gemm_q6_k_r16_avxvnni(const GemmArgs& a) { run_r16_tiles<Kernel>(a); }

}  // namespace ember::cpu::detail
