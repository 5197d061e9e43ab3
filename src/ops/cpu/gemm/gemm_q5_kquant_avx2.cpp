// AVX2 + FMA + F16C kernels for Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K (gemm/gemm_q5_kquant_simd.hpp) and Q6_K.
#include <immintrin.h>

#include <array>
#include <type_traits>

#include "ops/cpu/gemm/gemm_table.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/gemm/tile_driver.hpp"
#include "ops/cpu/gemm/gemm_q5_kquant_simd.hpp"

// ---- Q6_K x Q8_K ------------------------------------------------------------------------

struct Q6KKernel {
  static constexpr int kRows = 2, kTokens = 2;

  // Elements 32j .. 32j+31 of the super-block as unsigned q + 32.
  static __m256i decode(const BlockQ6_K& blk, int j) {
    const int h = j >> 2, qq = j & 3;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.ql + 64 * h + 32 * (qq & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * h));
    const __m256i lo = _mm256_and_si256(qq < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(0x0F));
    __m256i hb;
    switch (qq) {  // bring bits 2qq, 2qq+1 of qh to bits 4, 5
      case 0: hb = _mm256_slli_epi16(qh, 4); break;
      case 1: hb = _mm256_slli_epi16(qh, 2); break;
      case 2: hb = qh; break;
      default: hb = _mm256_srli_epi16(qh, 2); break;
    }
    return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
  }

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    const int64_t nb = a.k / kQK_K;
    TileOperands<BlockQ6_K, BlockQ8_K, 8, R, T> tl(a, r0, t0);
    auto& [w, x, acc] = tl;
    const __m256i k32 = _mm256_set1_epi8(32);
    for (int64_t b = 0; b < nb; ++b) {
      __m256i isum[R][T];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) isum[r][t] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        __m256i q[R], sc[R];
        for (int r = 0; r < R; ++r) {
          q[r] = decode(w[r][b], j);
          sc[r] = _mm256_set_m128i(_mm_set1_epi16(w[r][b].scales[2 * j + 1]), _mm_set1_epi16(w[r][b].scales[2 * j]));
        }
        for (int t = 0; t < T; ++t) {
          const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].qs + 32 * j));
          const __m256i off = _mm256_maddubs_epi16(k32, xa);
          for (int r = 0; r < R; ++r) {
            const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q[r], xa), off);
            isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_madd_epi16(p, sc[r]));
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        const float dw = _cvtsh_ss(w[r][b].d);
        for (int t = 0; t < T; ++t)
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][t]), _mm256_set1_ps(dw * x[t][b].d), acc[r][t]);
      }
    }
    tl.store(a, r0, t0);
  }
};

}  // namespace

void add_gemm_q5_kquant_avx2(GemmTable& t) {
  add_q5_kquant_kernels(t, SimdLevel::avx2);
  t.add(SimdLevel::avx2, DType::Q6_K, {&gemm<Q6KKernel>});
}

}  // namespace ember::cpu::detail
