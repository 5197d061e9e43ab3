// The Q4_0_R16 / Q4_1_R16 / Q5_0_R16 kernels on AVX2 and AVX-VNNI (layout in r16/r16.hpp; the
// AVX-512 kernel's steps, q4_q5_r16_avx512.cpp, on the two 8-row halves of each register,
// r16/r16_avx2.hpp). Per 32-element block and half: four 32-byte loads give 8 rows x 32 nibbles,
// split into low and high nibbles; each meets the activation's matching 4 bytes broadcast
// (nibble_dots: vpmaddubsw with the pair sums added in 16 bits, 4-bit weights all eight chunks at
// a time, at most 8 x 2 x 15 x 127 = 30480, Q5_0's 5-bit ones two, 4 x 2 x 31 x 127 = 31496,
// widened by vpmaddwd; on AVX-VNNI vpdpbusd), from the activation's offset term (Q4_0, Q5_0);
// scaled once per block (Q4_1: plus m * s). Include it inside an anonymous namespace of
// ember::cpu::detail, after r16/r16_avx2.hpp (q4_q5_r16_avx2.cpp, q4_q5_r16_avxvnni.cpp).
#pragma once

template <bool kHasMin, bool kHasQh = false>
struct Kernel {
  static constexpr size_t kGroupBlockBytes = r16_q4_block_bytes(kHasMin, kHasQh), kQsAt = kGroupBlockBytes - 256;
  // Tiles of eight tokens (Matmul512/*_R16/2048x2048, one thread, Zen 5): AVX2 Q4_0 1.13x, Q4_1
  // 1.12x, Q5_0 1.18x; AVX-VNNI level, 1.02x, 1.11x.
  static constexpr bool kTile8 = true;

  template <int T>
  static void tile(const GemmArgs& a, int64_t g, int64_t t0) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    r16_tile_avx2<R16Act, 32, kGroupBlockBytes, T>(a, g, t0, [&](const uint8_t* p, const R16Act* const* x, int64_t b, int h,
                                                                  __m256(&acc)[T], const R16Fetch& fetch) {
      fetch.all();
      const __m256 dw = half_ph(p, h);
      [[maybe_unused]] __m256 mw;
      if constexpr (kHasMin) mw = half_ph(p + 32, h);
      __m256i lo[4], hi[4];
      [[maybe_unused]] __m256i H;
      if constexpr (kHasQh) H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * h));
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kQsAt + 64 * c + 32 * h));
        lo[c] = _mm256_and_si256(v, m4);
        hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if constexpr (kHasQh) add_fifth_bits256(H, c, lo[c], hi[c]);
      }
      for (int t = 0; t < T; ++t) {
        const R16Act& xa = x[t][b];
        const __m256i s = nibble_dots<kHasQh ? 2 : 4>(
            kHasMin ? _mm256_setzero_si256() : _mm256_set1_epi32(xa.c), lo, hi, xa.qs);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xa.d)), acc[t]);
        if constexpr (kHasMin) acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xa.s), acc[t]);
      }
    });
  }
};
