// The 16-row types' entries in the GEMM table (gemm/gemm_table.hpp; r16/r16.hpp for the layout), one row
// each: its kernels per ISA, and whether it takes R16Act blocks (all but the K-quants, which read
// Q8_K rows).
#include "ops/cpu/gemm/gemm_table.hpp"
#include "ops/cpu/r16/r16_kernels.hpp"

namespace ember::cpu::detail {
namespace {

struct R16Gemm {
  DType w;
  GemmFn scalar, avx2, avx_vnni, avx512;  // avx_vnni null: the AVX2 kernel runs there
  bool r16_act;
};

constexpr R16Gemm kR16Gemms[] = {
    {DType::Q4_0_R16, &gemm_q4_0_r16_scalar, &gemm_q4_0_r16_avx2, &gemm_q4_0_r16_avxvnni, &gemm_q4_0_r16_avx512, true},
    {DType::Q4_1_R16, &gemm_q4_1_r16_scalar, &gemm_q4_1_r16_avx2, &gemm_q4_1_r16_avxvnni, &gemm_q4_1_r16_avx512, true},
    {DType::Q5_0_R16, &gemm_q5_0_r16_scalar, &gemm_q5_0_r16_avx2, &gemm_q5_0_r16_avxvnni, &gemm_q5_0_r16_avx512, true},
    {DType::Q8_0_R16, &gemm_q8_0_r16_scalar, &gemm_q8_0_r16_avx2, &gemm_q8_0_r16_avxvnni, &gemm_q8_0_r16_avx512, true},
    {DType::Q6_K_R16, &gemm_q6_k_r16_scalar, &gemm_q6_k_r16_avx2, &gemm_q6_k_r16_avxvnni, &gemm_q6_k_r16_avx512, false},
    {DType::Q4_K_R16, &gemm_q4_k_r16_scalar, &gemm_q4_k_r16_avx2, &gemm_q4_k_r16_avxvnni, &gemm_q4_k_r16_avx512, false},
    {DType::Q5_K_R16, &gemm_q5_k_r16_scalar, &gemm_q5_k_r16_avx2, &gemm_q5_k_r16_avxvnni, &gemm_q5_k_r16_avx512, false},
};

}  // namespace

void add_gemm_r16_scalar(GemmTable& t) {
  for (const R16Gemm& g : kR16Gemms) t.add(SimdLevel::scalar, g.w, {g.scalar, g.r16_act});
}

void add_gemm_r16_avx2(GemmTable& t) {
  for (const R16Gemm& g : kR16Gemms)
    if (g.avx2) t.add(SimdLevel::avx2, g.w, {g.avx2, g.r16_act});
}

void add_gemm_r16_avx_vnni(GemmTable& t) {
  for (const R16Gemm& g : kR16Gemms)
    if (g.avx_vnni) t.add(SimdLevel::avx_vnni, g.w, {g.avx_vnni, g.r16_act});
}

void add_gemm_r16_avx512(GemmTable& t) {
  for (const R16Gemm& g : kR16Gemms) t.add(SimdLevel::avx512, g.w, {g.avx512, g.r16_act});
}

}  // namespace ember::cpu::detail
