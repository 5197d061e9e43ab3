// The token half of a quad-layout step (gemm/gemm_kernels.hpp), shared by the 4-bit (Q4_0 / Q4_1) and
// 5-bit (Q5_0 / Q5_1) AVX-512 kernels: R rows' decoded unsigned weights of four blocks (lo:
// elements 0..15, hi: 16..31 of each block, one block per 128-bit lane) and their fp16 scales
// (and mins, kHasMin) against T tokens' quads at quad q. For AVX-512 translation units only.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "ops/cpu/gemm/gemm_kernels.hpp"

namespace ember::cpu::detail {

template <int R, int T, bool kHasMin>
inline void quad_dot_tokens(const uint8_t* const* x, int64_t q, const __m512i (&lo)[R], const __m512i (&hi)[R],
                            const __m512 (&dw)[R], const __m512 (&mw)[R], __m512 (&acc)[R][T]) {
  for (int t = 0; t < T; ++t) {
    const uint8_t* xq = x[t] + q * kQuadBytes;
    const __m512i xlo = _mm512_load_si512(xq), xhi = _mm512_load_si512(xq + 64);
    const __m512 dx = _mm512_load_ps(xq + 128);
    for (int r = 0; r < R; ++r) {
      // Q4_0 / Q5_0: the quad's c lanes start the sum with the offset taken off in integers.
      __m512i p = kHasMin ? _mm512_setzero_si512() : _mm512_load_si512(xq + 192);
      p = _mm512_dpbusd_epi32(p, lo[r], xlo);
      p = _mm512_dpbusd_epi32(p, hi[r], xhi);
      if constexpr (kHasMin) {
        // The min term first, off the accumulator's dependency chain: one add per step on it.
        const __m512 m = _mm512_mul_ps(mw[r], _mm512_load_ps(xq + 192));
        acc[r][t] = _mm512_add_ps(acc[r][t], _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[r], dx), m));
      } else {
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[r], dx), acc[r][t]);
      }
    }
  }
}

}  // namespace ember::cpu::detail
