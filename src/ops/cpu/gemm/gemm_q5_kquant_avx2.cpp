// AVX2 + FMA + F16C kernels for Q5_0, Q5_1, Q4_K, Q5_K: see gemm/gemm_q5_kquant_simd.hpp.
#include <immintrin.h>

#include <array>
#include <type_traits>

#include "ops/cpu/gemm/gemm_table.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/gemm/tile_driver.hpp"
#include "ops/cpu/gemm/gemm_q5_kquant_simd.hpp"

}  // namespace

void add_gemm_q5_kquant_avx2(GemmTable& t) { add_q5_kquant_kernels(t, SimdLevel::avx2); }

}  // namespace ember::cpu::detail
