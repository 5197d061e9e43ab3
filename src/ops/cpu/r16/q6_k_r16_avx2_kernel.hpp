// The Q6_K_R16 kernel on 256-bit vectors (layout in r16/r16.hpp; the AVX-512 kernel's steps,
// q6_k_r16_avx512.cpp, on the two 8-row halves of each register, r16/r16_avx2.hpp), one text for
// AVX2 (q6_k_r16_avx2.cpp) and AVX-VNNI (q6_k_r16_avxvnni.cpp). Per sub-block of 16 elements and
// half: three 32-byte loads unpack into four registers of 6-bit weights of 8 rows; each meets its 4
// activation bytes broadcast: on AVX2 in vpmaddubsw, two pair sums added in 16 bits (at most 2 x 2
// x 63 x 127 = 32004) and widened by vpmaddwd against the sub-block scale; on AVX-VNNI in
// vpdpbusd, the four into one 32-bit sum times the scale. After the sub-blocks, less 32 x the sum
// of scale x the sub-block's activation sum (the offset, two sub-blocks a vpmaddwd); once per
// super-block the floats. The same exact integers either way. Include inside an anonymous
// namespace, after r16/r16_avx2.hpp and tensor/quant.hpp.

constexpr size_t kGroupBlockBytes = kR16Q6KBlockBytes, kScalesAt = kR16Q6KScalesAt, kSubBlocksAt = kR16Q6KSubBlocksAt,
                 kSubBlockBytes = kR16Q6KSubBlockBytes;

struct Kernel {
  // Tiles of eight tokens on AVX2 (Matmul512/Q6_K_R16/2048x2048, one thread, Zen 5: 1.08x); level
  // on AVX-VNNI.
  static constexpr bool kTile8 = !kDots32;
  template <int T>
  static void tile(const GemmArgs& a, int64_t g, int64_t t0) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    r16_tile_avx2<BlockQ8_K, kQK_K, kGroupBlockBytes, T>(a, g, t0, [&](const uint8_t* p, const BlockQ8_K* const* x,
                                                                        int64_t b, int h, __m256(&acc)[T], const R16Fetch& fetch) {
      __m256i total[T];
      for (int t = 0; t < T; ++t) total[t] = _mm256_setzero_si256();
      for (int j = 0; j < 16; ++j) {
        fetch.share<16>(j);
        const __m256i sc = _mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + kScalesAt + 16 * j + 8 * h)));
        // The signed scale in both 16-bit halves of its lane: vpmaddwd with the 16-bit pair sums
        // gives their sum times the scale (exact: at most 2 x 32004 x 128).
        const __m256i sc2 = _mm256_blend_epi16(sc, _mm256_slli_epi32(sc, 16), 0xAA);
        const uint8_t* q = p + kSubBlocksAt + kSubBlockBytes * j + 32 * h;
        const __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
        const __m256i B = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64));
        const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 128));
        const __m256i w0 = _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
        const __m256i w1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4),
                                           _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
        const __m256i w2 = _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(H, m30));
        const __m256i w3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
        for (int t = 0; t < T; ++t) {
          const BlockQ8_K& xb = x[t][b];
          const int8_t* xq = xb.qs + 16 * j;
          if constexpr (kDots32) {  // the sub-block's 32-bit lane sums (at most 16 x 63 x 127) times the scale
            const __m256i s = dots32(dots32(dots32(dots32(_mm256_setzero_si256(), w0, xq), w1, xq + 4), w2, xq + 8),
                                     w3, xq + 12);
            total[t] = _mm256_add_epi32(total[t], _mm256_mullo_epi32(s, sc));
          } else {
            const __m256i s01 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, bcast4_256(xq)),
                                                 _mm256_maddubs_epi16(w1, bcast4_256(xq + 4)));
            const __m256i s23 = _mm256_add_epi16(_mm256_maddubs_epi16(w2, bcast4_256(xq + 8)),
                                                 _mm256_maddubs_epi16(w3, bcast4_256(xq + 12)));
            total[t] = _mm256_add_epi32(total[t], _mm256_add_epi32(_mm256_madd_epi16(s01, sc2), _mm256_madd_epi16(s23, sc2)));
          }
        }
      }
      // The offset: sub-blocks 2i and 2i + 1's scales in the 16-bit halves of a lane against the
      // activation's two sums (adjacent in bsums), each product at most 128 x 16 x 127.
      __m256i offset[T];
      for (int t = 0; t < T; ++t) offset[t] = _mm256_setzero_si256();
      for (int i = 0; i < 8; ++i) {
        const auto scales = [&](int j) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + kScalesAt + 16 * j + 8 * h)); };
        const __m256i sp = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(scales(2 * i), scales(2 * i + 1)));
        for (int t = 0; t < T; ++t)
          offset[t] = _mm256_add_epi32(offset[t], _mm256_madd_epi16(sp, bcast4_256(reinterpret_cast<const int8_t*>(x[t][b].bsums + 2 * i))));
      }
      for (int t = 0; t < T; ++t) total[t] = _mm256_sub_epi32(total[t], _mm256_slli_epi32(offset[t], 5));
      const __m256 dw = half_ph(p, h);
      for (int t = 0; t < T; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total[t]), _mm256_mul_ps(dw, _mm256_set1_ps(x[t][b].d)), acc[t]);
    });
  }
};

