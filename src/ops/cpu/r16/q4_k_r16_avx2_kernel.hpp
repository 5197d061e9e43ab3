// The Q4_K_R16 / Q5_K_R16 kernels on AVX2 and AVX-VNNI (layout in r16/r16.hpp; the AVX-512
// kernel's integers, q4_k_r16_avx512.cpp, one 8-row half of each register at a time,
// r16/r16_avx2.hpp). Per half and sub-block of 32 elements: four 32-byte loads hold the 4-bit
// weights of 8 rows; each chunk's low and high nibbles meet their 4 activation bytes broadcast
// (scaled_nibble_dots: on AVX2 vpmaddubsw, the pair sums added in 16 bits, at most 8 x 2 x 15 x
// 127 = 30480 for four chunks, Q5_K: 4 x 2 x 31 x 127 = 31496 for two, and widened by vpmaddwd
// against the 6-bit sub-block scale; on AVX-VNNI vpdpbusd, then times the scale, except Q4_K's
// tiles of several tokens, which take AVX2's arithmetic: kVnni); the mins times
// the activation's sub-block sums, and once per super-block the floats, in the order of the
// scalar reference. The scales and mins come unpacked from r16/k_scale_table.hpp, spread to the
// half's lanes by one vpshufb each. Include it inside an anonymous namespace of
// ember::cpu::detail, after r16/k_scale_table.hpp and r16/r16_avx2.hpp (q4_k_r16_avx2.cpp,
// q4_k_r16_avxvnni.cpp).
#pragma once

constexpr size_t kQhAt = kR16Q4KQhAt;

// vpshufb indices that spread 16 bytes (rows 0..15) to half h's 8 rows as 32-bit lanes: the byte
// alone (wide[h]), in both 16-bit halves of the lane (pair[h], as vpmaddwd takes a multiplier),
// or alone in the high 16-bit half (high[h]).
struct ScaleSpread {
  __m256i wide[2], pair[2], high[2];
  ScaleSpread() {
    alignas(32) uint8_t w[2][32], pr[2][32], hi[2][32];
    for (int h = 0; h < 2; ++h)
      for (int b = 0; b < 32; ++b) {
        const uint8_t row = static_cast<uint8_t>(8 * h + b / 4), none = 0x80;
        w[h][b] = b % 4 == 0 ? row : none;
        pr[h][b] = b % 2 == 0 ? row : none;
        hi[h][b] = b % 4 == 2 ? row : none;
      }
    for (int h = 0; h < 2; ++h) {
      wide[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(w[h]));
      pair[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(pr[h]));
      high[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi[h]));
    }
  }
};
inline const ScaleSpread& scale_spread() {
  static const ScaleSpread s;
  return s;
}
// The 16 bytes at t, spread by the indices ix.
inline __m256i spread16(const uint8_t* t, __m256i ix) {
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t))), ix);
}

template <bool kQh>
struct Kernel {
  static constexpr size_t kGroupBlockBytes = r16_q4k_block_bytes(kQh), kSubBlocksAt = r16_q4k_sub_blocks_at(kQh),
                          kSubBlockBytes = r16_q4k_sub_block_bytes(kQh);
  // The arithmetic of a tile of T tokens: vpdpbusd on AVX-VNNI, except for Q4_K's tiles of
  // several tokens, which take AVX2's vpmaddubsw (they need a vpmulld a token and sub-block to
  // scale vpdpbusd's 32-bit sums, where vpmaddwd scales AVX2's 16-bit ones as it widens them:
  // Matmul512/Q4_K_R16/5632x2048 at AVX-VNNI 1.08x on Zen 5, one thread; the 1.1B synth's pp256
  // 1.09-1.12x).
  template <int T>
  static constexpr bool kVnni = kDots32 && (T == 1 || kQh);
  // A single token's Q4_K on AVX-VNNI uses its high nibbles where they lie, as 16 x their value
  // (no shift), as in the AVX-512 kernel: total holds kTotalScale x the integer sum, and the float
  // scale takes the power of two back out, which changes no rounding.
  template <int T>
  static constexpr bool kHighInPlace = kVnni<T> && !kQh;
  template <int T>
  static constexpr int kTotalScale = kHighInPlace<T> ? 16 : 1;
  // Tiles of eight tokens (Matmul512/*_R16/2048x2048, one thread, Zen 5): AVX2 Q4_K 1.10x, Q5_K
  // 1.15x, AVX-VNNI Q5_K 1.19x.
  static constexpr bool kTile8 = true;

  static void prepare_group(const GemmArgs& a, int64_t g) { prepare_k_scale_tables(a, g, kGroupBlockBytes); }

  // Where the mins are summed: after the sub-blocks (kMinsAfter), which frees the T registers of
  // their sums inside the loop, pays for tiles of several tokens in AVX2's arithmetic, whose 16-bit
  // sums and scales otherwise spill (Matmul512 Q4_K 1.04-1.06x); a single token's product (decode)
  // and vpdpbusd's tiles measured 3-8 % slower that way, so they sum each sub-block's mins in the loop.
  template <int T>
  static constexpr bool kMinsAfter = T > 1 && !kVnni<T>;

  // The mins of block b's half h summed after its sub-blocks: sub-blocks 2i and 2i + 1's mins in the
  // 16-bit halves of a lane against the activation's two sub-block sums (each at most 32 x 127),
  // four vpmaddwd a token.
  template <int T>
  static void sum_mins(const uint8_t* tab, const ScaleSpread& spread, int h, const BlockQ8_K* const* x, int64_t b,
                       __m256i (&mins)[T]) {
    __m256i mp[4];
    for (int i = 0; i < 4; ++i)
      mp[i] = _mm256_or_si256(spread16(tab + 64 * i + 16, spread.wide[h]), spread16(tab + 64 * i + 48, spread.high[h]));
    const __m256i ones = _mm256_set1_epi16(1);
    for (int t = 0; t < T; ++t) {
      const __m256i s32 = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].bsums)), ones);
      // 32-bit elements 0, 1, 4, 5: the sub-block sums (s0, s1), (s2, s3), (s4, s5), (s6, s7).
      const __m256i s16 = _mm256_packs_epi32(s32, s32);
      __m256i m = _mm256_madd_epi16(mp[0], _mm256_permutevar8x32_epi32(s16, _mm256_set1_epi32(0)));
      m = _mm256_add_epi32(m, _mm256_madd_epi16(mp[1], _mm256_permutevar8x32_epi32(s16, _mm256_set1_epi32(1))));
      m = _mm256_add_epi32(m, _mm256_madd_epi16(mp[2], _mm256_permutevar8x32_epi32(s16, _mm256_set1_epi32(4))));
      mins[t] = _mm256_add_epi32(m, _mm256_madd_epi16(mp[3], _mm256_permutevar8x32_epi32(s16, _mm256_set1_epi32(5))));
    }
  }

  template <int T>
  static void tile(const GemmArgs& a, int64_t g, int64_t t0) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const ScaleSpread& spread = scale_spread();
    uint8_t* const tables = scale_tables(a.k / kQK_K);
    const bool unpack = k_scale_tables_inline(a);
    r16_tile_avx2<BlockQ8_K, kQK_K, kGroupBlockBytes, T>(a, g, t0, [&](const uint8_t* p, const BlockQ8_K* const* x,
                                                                        int64_t b, int h, __m256(&acc)[T], const R16Fetch& fetch) {
      // The frame visits a block's half 0 before its half 1.
      uint8_t* const tab = tables + kKScaleTableBytes * b;
      if (unpack && h == 0) k_scale_table(p, tab);
      __m256i total[T], mins[T];
      for (int t = 0; t < T; ++t) total[t] = mins[t] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        fetch.share<8>(j);
        // The scale in both 16-bit halves of its lane, as vpmaddwd takes it (exact: at most 2 x 31496 x
        // 63); alone for vpdpbusd's 32-bit sums.
        const __m256i sc = spread16(tab + 32 * j, kVnni<T> ? spread.wide[h] : spread.pair[h]);
        [[maybe_unused]] __m256i m2;
        if constexpr (!kMinsAfter<T>) m2 = spread16(tab + 32 * j + 16, spread.pair[h]);
        const uint8_t* q = p + kSubBlocksAt + kSubBlockBytes * j;
        [[maybe_unused]] __m256i H;
        if constexpr (kQh) H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kQhAt + kSubBlockBytes * j + 32 * h));
        __m256i wl[4], wh[4];
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * c + 32 * h));
          wl[c] = _mm256_and_si256(v, m4);
          wh[c] = kHighInPlace<T> ? _mm256_andnot_si256(m4, v) : _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
          if constexpr (kQh) add_fifth_bits256(H, c, wl[c], wh[c]);
        }
        for (int t = 0; t < T; ++t) {
          const int8_t* xq = x[t][b].qs + 32 * j;
          if constexpr (kHighInPlace<T>) {
            __m256i slo = _mm256_setzero_si256(), shi = _mm256_setzero_si256();
            for (int c = 0; c < 4; ++c) {
              slo = dots32(slo, wl[c], xq + 4 * c);
              shi = dots32(shi, wh[c], xq + 16 + 4 * c);
            }
            // 16 x the sub-block's dot product (|16 x 8 x 61440 x 63| < 2^31 over the super-block).
            total[t] = _mm256_add_epi32(total[t], _mm256_mullo_epi32(_mm256_add_epi32(_mm256_slli_epi32(slo, 4), shi), sc));
          } else {
            total[t] = scaled_nibble_dots<kQh ? 2 : 4, kVnni<T>>(total[t], wl, wh, xq, sc, sc);
          }
          // m in both 16-bit halves against the sub-block's two 16-element sums (one 4-byte broadcast).
          if constexpr (!kMinsAfter<T>)
            mins[t] = _mm256_add_epi32(mins[t], _mm256_madd_epi16(m2, bcast4_256(reinterpret_cast<const int8_t*>(x[t][b].bsums + 2 * j))));
        }
      }
      if constexpr (kMinsAfter<T>) sum_mins<T>(tab, spread, h, x, b, mins);
      const __m256 dw = _mm256_mul_ps(half_ph(p, h), _mm256_set1_ps(1.0f / kTotalScale<T>)), dm = half_ph(p + 32, h);
      for (int t = 0; t < T; ++t) {
        const __m256 dx = _mm256_set1_ps(x[t][b].d);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[t]), _mm256_mul_ps(dw, dx), acc[t]);
        acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins[t]), _mm256_mul_ps(dm, dx), acc[t]);
      }
    });
  }
};
