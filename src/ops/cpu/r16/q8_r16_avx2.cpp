// The Q8_0_R16 kernel on AVX2 (layout in r16/r16.hpp; the AVX-512 kernel, q8_r16_avx512.cpp, on
// the two 8-row halves of each register, r16/r16_avx2.hpp). The weights are stored biased
// (w + 128), which vpmaddubsw cannot take against signed activations without saturating; so the
// bias is flipped off (w, -127..127 as every Q8_0 quantizer writes them) and each 4-byte group
// meets the activation as vpmaddubsw(|x|, sign(w, x)), pair sums at most 2 x 127 x 127 = 32258,
// widened one chunk at a time: the exact sum of w x, the integer the AVX-512 kernel gets from
// the biased weights and the offset term, so the same float steps follow.
#include <immintrin.h>

#include "ops/cpu/r16/r16_avx2.hpp"

namespace ember::cpu::detail {
namespace {

struct Q8Kernel {
  static constexpr size_t kGroupBlockBytes = kR16Q8BlockBytes, kQsAt = kR16Q8QsAt;

  template <int T>
  static void tile(const GemmArgs& a, int64_t g, int64_t t0) {
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    r16_tile_avx2<R16Act, 32, kGroupBlockBytes, T>(a, g, t0, [&](const uint8_t* p, const R16Act* const* x, int64_t b, int h,
                                                                  __m256(&acc)[T]) {
      const __m256 dw = half_ph(p, h);
      __m256i w[8];
      for (int c = 0; c < 8; ++c)
        w[c] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kQsAt + 64 * c + 32 * h)), bias);
      for (int t = 0; t < T; ++t) {
        const R16Act& xa = x[t][b];
        __m256i s = _mm256_setzero_si256();
        for (int c = 0; c < 8; ++c) {
          const __m256i xv = bcast4_256(xa.qs + 4 * (c % 4) + 16 * (c / 4));
          s = _mm256_add_epi32(s, lane_sums(_mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(w[c], xv))));
        }
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xa.d)), acc[t]);
      }
    });
  }
};

}  // namespace

void gemm_q8_0_r16_avx2(const GemmArgs& a) { run_r16_tiles<Q8Kernel>(a); }

}  // namespace ember::cpu::detail
