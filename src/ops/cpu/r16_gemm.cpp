// The 16-row types' entries in the GEMM table (gemm_table.hpp; r16.hpp for the layout): every one
// takes R16Act blocks but the K-quants, which read Q8_K rows.
#include "ops/cpu/gemm_table.hpp"
#include "ops/cpu/r16_kernels.hpp"

namespace ember::cpu::detail {

void add_gemm_r16_scalar(GemmColumn& c) {
  c.add(DType::Q4_0_R16, &gemm_q4_0_r16_scalar, true);
  c.add(DType::Q4_1_R16, &gemm_q4_1_r16_scalar, true);
  c.add(DType::Q5_0_R16, &gemm_q5_0_r16_scalar, true);
  c.add(DType::Q8_0_R16, &gemm_q8_0_r16_scalar, true);
  c.add(DType::Q6_K_R16, &gemm_q6_k_r16_scalar);
  c.add(DType::Q4_K_R16, &gemm_q4_k_r16_scalar);
  c.add(DType::Q5_K_R16, &gemm_q5_k_r16_scalar);
}

void add_gemm_r16_avx512(GemmColumn& c) {
  c.add(DType::Q4_0_R16, &gemm_q4_0_r16_avx512, true);
  c.add(DType::Q4_1_R16, &gemm_q4_1_r16_avx512, true);
  c.add(DType::Q5_0_R16, &gemm_q5_0_r16_avx512, true);
  c.add(DType::Q8_0_R16, &gemm_q8_0_r16_avx512, true);
  c.add(DType::Q6_K_R16, &gemm_q6_k_r16_avx512);
  c.add(DType::Q4_K_R16, &gemm_q4_k_r16_avx512);
  c.add(DType::Q5_K_R16, &gemm_q5_k_r16_avx512);
}

}  // namespace ember::cpu::detail
