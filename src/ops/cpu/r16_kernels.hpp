// Internal: the kernels of the 16-row repacked types (r16.hpp), called by
// matmul.cpp. All take nrows a multiple of 16 (rows w_stride bytes apart, so group g starts at
// w + 16 g w_stride). Q4_0_R16 and Q4_1_R16 take R16Act activation rows, Q6_K_R16 plain Q8_K rows.
#pragma once
#include "ops/cpu/kernels.hpp"
#include "ops/cpu/r16.hpp"

namespace ember::cpu::detail {

// rows x k Q6_K (rows a multiple of 16, k of 256) into Q6_K_R16 (repack_r16 dispatches here).
void repack_q6_k_r16(const void* src, int64_t rows, int64_t k, void* dst);

void gemm_q4_0_r16_scalar(const GemmArgs& a);
void gemm_q4_0_r16_avx512(const GemmArgs& a);
void gemm_q4_1_r16_scalar(const GemmArgs& a);
void gemm_q4_1_r16_avx512(const GemmArgs& a);
void gemm_q6_k_r16_scalar(const GemmArgs& a);
void gemm_q6_k_r16_avx512(const GemmArgs& a);

// Runs K::tile<T>(a, group, first token) over every 16-row group and the tokens in tiles of
// four (then one tile of the 1..3 left).
template <class K>
void run_r16_tiles(const GemmArgs& a) {
  for (int64_t g = 0; g < a.nrows / kR16Rows; ++g) {
    int64_t t = 0;
    for (; t + 4 <= a.ntok; t += 4) K::template tile<4>(a, g, t);
    switch (a.ntok - t) {
      case 3: K::template tile<3>(a, g, t); break;
      case 2: K::template tile<2>(a, g, t); break;
      case 1: K::template tile<1>(a, g, t); break;
      default: break;
    }
  }
}

}  // namespace ember::cpu::detail
