// The Q8_0_R16 kernel built for AVX2 (r16/q8_r16_avx2_kernel.hpp).
#include <immintrin.h>

#include "ops/cpu/r16/r16_avx2.hpp"

namespace ember::cpu::detail {
namespace {
#include "ops/cpu/r16/q8_r16_avx2_kernel.hpp"
}  // namespace

void gemm_q8_0_r16_avx2(const GemmArgs& a) { run_r16_tiles<Q8Kernel>(a); }

}  // namespace ember::cpu::detail
