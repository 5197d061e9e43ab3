// The Q8_0_R16 kernel on AVX2 and AVX-VNNI (layout in r16/r16.hpp; the AVX-512 kernel,
// q8_r16_avx512.cpp, one 8-row half of each register at a time, r16/r16_avx2.hpp). The weights
// are stored biased (w + 128). On AVX-VNNI they meet the activation as they are, in vpdpbusd,
// the sum starting from the bias times the activation sum (R16Act::c), as on AVX-512. vpmaddubsw
// cannot take them against signed activations without saturating, so on AVX2 a tile takes |w|
// once (w, -127..127 as every Q8_0 quantizer writes them, from the stored bytes with the bias
// flipped off) and each token's 4-byte group meets it as vpmaddubsw(|w|, sign(x, stored byte)):
// the stored w + 128 reads as a negative byte where w >= 0 and a positive one where w < 0, so the
// products are -w x (where w is 0 |w| is), pair sums at most 2 x 127 x 127 = 32258, widened one
// chunk at a time, and the float step subtracts. Either way the exact sum of w x (negated, which
// rounds alike), so the same float steps follow. Include it
// inside an anonymous namespace of ember::cpu::detail, after r16/r16_avx2.hpp (q8_r16_avx2.cpp,
// q8_r16_avxvnni.cpp).
#pragma once

struct Q8Kernel {
  static constexpr size_t kGroupBlockBytes = kR16Q8BlockBytes, kQsAt = kR16Q8QsAt;
  // Tiles of eight tokens on AVX-VNNI (Matmul512/Q8_0_R16/2048x2048, one thread, Zen 5: 1.06x);
  // not on AVX2, whose sign step a product leaves no registers for them (0.95x).
  static constexpr bool kTile8 = kDots32;

  template <int T>
  static void tile(const GemmArgs& a, int64_t g, int64_t t0) {
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    r16_tile_avx2<R16Act, 32, kGroupBlockBytes, T>(a, g, t0, [&](const uint8_t* p, const R16Act* const* x, int64_t b, int h,
                                                                  __m256(&acc)[T], const R16Fetch& fetch) {
      fetch.all();
      const __m256 dw = half_ph(p, h);
      const uint8_t* q = p + kQsAt + 32 * h;
      const auto stored = [&](int c) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * c)); };
      __m256i w[8];  // AVX-VNNI: the stored bytes; AVX2: |w|
      for (int c = 0; c < 8; ++c) w[c] = kDots32 ? stored(c) : _mm256_abs_epi8(_mm256_xor_si256(stored(c), bias));
      for (int t = 0; t < T; ++t) {
        const R16Act& xa = x[t][b];
        const __m256 f = _mm256_mul_ps(dw, _mm256_set1_ps(xa.d));
        if constexpr (kDots32) {
          __m256i s = _mm256_set1_epi32(xa.c);
          for (int c = 0; c < 8; ++c) s = dots32(s, w[c], xa.qs + 4 * c);
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), f, acc[t]);
        } else {
          __m256i s = _mm256_setzero_si256();  // -(the block's dot product)
          for (int c = 0; c < 8; ++c) {
            const __m256i sx = _mm256_sign_epi8(bcast4_256(xa.qs + 4 * c), stored(c));
            s = _mm256_add_epi32(s, lane_sums(_mm256_maddubs_epi16(w[c], sx)));
          }
          acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(s), f, acc[t]);
        }
      }
    });
  }
};
