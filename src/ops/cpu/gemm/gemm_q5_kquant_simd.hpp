// SIMD kernels for Q5_0, Q5_1 (x Q8_0 / Q8_1) and Q2_K, Q3_K, Q4_K, Q5_K (x Q8_K) on 256-bit vectors.
// Include only inside an anonymous namespace of gemm/gemm_q5_kquant_avx2.cpp / gemm/gemm_q5_kquant_avx512.cpp (after
// gemm/tile_driver.hpp): each ISA compiles its own copy. With AVX512-VNNI (the AVX-512 build) the
// 32-element block products use vpdpbusd, otherwise vpmaddubsw + vpmaddwd.
//
// Unsigned weights (0..15 or 0..31) enter the u8 x s8 products directly; Q5_0's offset of 16 is
// taken off as 16 * (sum of the activations), computed once per token and block. K-quant mins
// use the Q8_K group sums (bsums). Every output element is computed with the same operations
// whatever tile it falls in.

// 32 bits -> 32 bytes of 0x10 where the bit is set (bit j -> byte j), else 0.
inline __m256i bits_to_0x10(const uint8_t* p) {
  uint32_t bits;
  __builtin_memcpy(&bits, p, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_and_si256(_mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}

// Sum over groups of 4 of u8 x s8 products, as int32 lanes added to acc.
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// ---- Q5_0 / Q5_1 ------------------------------------------------------------------------

template <DType WT>
struct Q5Kernel {
  static constexpr int kRows = 2, kTokens = 4;
  using WB = std::conditional_t<WT == DType::Q5_0, BlockQ5_0, BlockQ5_1>;
  using XB = std::conditional_t<WT == DType::Q5_0, BlockQ8_0, BlockQ8_1>;

  static __m256i decode(const WB& b) {  // 32 unsigned 5-bit values, element j in byte j
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    const __m256i lo = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
    return _mm256_or_si256(lo, bits_to_0x10(b.qh));
  }

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    const int64_t nb = a.k / kQK;
    TileOperands<WB, XB, 8, R, T> tl(a, r0, t0);
    auto& [w, x, acc] = tl;
    [[maybe_unused]] float msum[R][T] = {};
    const __m256i sixteen = _mm256_set1_epi8(16);
    for (int64_t b = 0; b < nb; ++b) {
      __m256i q[R];
      float dw[R];
      for (int r = 0; r < R; ++r) {
        q[r] = decode(w[r][b]);
        dw[r] = _cvtsh_ss(w[r][b].d);
      }
      for (int t = 0; t < T; ++t) {
        const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].qs));
        const float da = _cvtsh_ss(x[t][b].d);
        __m256i base = _mm256_setzero_si256();
        if constexpr (WT == DType::Q5_0) base = _mm256_sub_epi32(base, dot_u8s8(_mm256_setzero_si256(), sixteen, xa));
        for (int r = 0; r < R; ++r) {
          const __m256i p = dot_u8s8(base, q[r], xa);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw[r] * da), acc[r][t]);
          if constexpr (WT == DType::Q5_1) msum[r][t] += _cvtsh_ss(w[r][b].m) * _cvtsh_ss(x[t][b].s);
        }
      }
    }
    tl.store(a, r0, t0, [&](__m256 v, int r, int t) {
      float s = F32Lanes<8>::reduce_add(v);
      if constexpr (WT == DType::Q5_1) s += msum[r][t];
      return s;
    });
  }
};

// ---- Q4_K / Q5_K ------------------------------------------------------------------------

template <DType WT>
struct K45Kernel {
  static constexpr int kRows = 2, kTokens = 2;
  using WB = std::conditional_t<WT == DType::Q4_K, BlockQ4_K, BlockQ5_K>;

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    const int64_t nb = a.k / kQK_K;
    TileOperands<WB, BlockQ8_K, 8, R, T> tl(a, r0, t0);
    auto& [w, x, acc] = tl;
    float macc[R][T] = {};
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t sc[R][8], mn[R][8];
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < 8; ++j) kquant_scale_min(w[r][b].scales, j, sc[r][j], mn[r][j]);
      __m256i isum[R][T];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) isum[r][t] = _mm256_setzero_si256();
      [[maybe_unused]] __m256i qh[R];
      if constexpr (WT == DType::Q5_K)
        for (int r = 0; r < R; ++r) qh[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][b].qh));
      for (int c = 0; c < 4; ++c) {
        __m256i lo[R], hi[R], slo[R], shi[R];
        for (int r = 0; r < R; ++r) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][b].qs + 32 * c));
          lo[r] = _mm256_and_si256(raw, m4);
          hi[r] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
          if constexpr (WT == DType::Q5_K) {
            const __m256i one = _mm256_set1_epi8(1);
            const __m256i hl = _mm256_and_si256(_mm256_srl_epi16(qh[r], _mm_cvtsi32_si128(2 * c)), one);
            const __m256i hh = _mm256_and_si256(_mm256_srl_epi16(qh[r], _mm_cvtsi32_si128(2 * c + 1)), one);
            lo[r] = _mm256_or_si256(lo[r], _mm256_slli_epi16(hl, 4));
            hi[r] = _mm256_or_si256(hi[r], _mm256_slli_epi16(hh, 4));
          }
          slo[r] = _mm256_set1_epi16(sc[r][2 * c]);
          shi[r] = _mm256_set1_epi16(sc[r][2 * c + 1]);
        }
        for (int t = 0; t < T; ++t) {
          const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].qs + 64 * c));
          const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].qs + 64 * c + 32));
          for (int r = 0; r < R; ++r) {
            const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[r], xl), slo[r]);
            const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[r], xh), shi[r]);
            isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_add_epi32(pl, ph));
          }
        }
      }
      for (int t = 0; t < T; ++t) {
        int bs[8];
        for (int j = 0; j < 8; ++j) bs[j] = x[t][b].bsums[2 * j] + x[t][b].bsums[2 * j + 1];
        for (int r = 0; r < R; ++r) {
          int msum = 0;
          for (int j = 0; j < 8; ++j) msum += mn[r][j] * bs[j];
          const float xd = x[t][b].d;
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][t]), _mm256_set1_ps(_cvtsh_ss(w[r][b].d) * xd),
                                      acc[r][t]);
          macc[r][t] += _cvtsh_ss(w[r][b].dmin) * xd * static_cast<float>(msum);
        }
      }
    }
    tl.store(a, r0, t0, [&](__m256 v, int r, int t) { return F32Lanes<8>::reduce_add(v) - macc[r][t]; });
  }
};

// ---- Q2_K / Q3_K ------------------------------------------------------------------------
// 32-element steps (two sub-blocks of 16): unsigned weights (Q2_K q, Q3_K q + 4) enter
// vpmaddubsw, vpmaddwd multiplies the pair sums by the sub-block scales. Q3_K's offset of 4 and
// Q2_K's mins are taken off per super-block with the Q8_K bsums.

// pshufb controls, one 32-byte row per step s mod 4: the words of 128-bit lane 0 <- word 2s mod 8,
// of lane 1 <- word 2s + 1 mod 8, of a register holding one half of the 16 scales in each lane.
alignas(32) constexpr auto kG16ScaleCtl = [] {
  std::array<uint8_t, 128> c{};
  for (int s = 0; s < 4; ++s)
    for (int i = 0; i < 32; ++i) c[32 * s + i] = static_cast<uint8_t>(2 * ((2 * s + i / 16) % 8) + i % 2);
  return c;
}();

// The 16 signed 6-bit scales of a Q3_K super-block (see q3_k_scale) as bytes.
inline __m128i q3_k_scales(const uint8_t* s) {
  uint32_t a0, a1, a2;
  __builtin_memcpy(&a0, s, 4);
  __builtin_memcpy(&a1, s + 4, 4);
  __builtin_memcpy(&a2, s + 8, 4);
  const uint32_t s0 = (a0 & 0x0f0f0f0fu) | (a2 & 0x03030303u) << 4;
  const uint32_t s1 = (a1 & 0x0f0f0f0fu) | ((a2 >> 2) & 0x03030303u) << 4;
  const uint32_t s2 = ((a0 >> 4) & 0x0f0f0f0fu) | ((a2 >> 4) & 0x03030303u) << 4;
  const uint32_t s3 = ((a1 >> 4) & 0x0f0f0f0fu) | ((a2 >> 6) & 0x03030303u) << 4;
  const __m128i u = _mm_set_epi32(static_cast<int>(s3), static_cast<int>(s2), static_cast<int>(s1), static_cast<int>(s0));
  return _mm_sub_epi8(u, _mm_set1_epi8(32));
}

template <DType WT>
struct Q23Kernel {
  static constexpr int kRows = 2, kTokens = 2;
  static constexpr bool kQ3 = WT == DType::Q3_K;
  using WB = std::conditional_t<kQ3, BlockQ3_K, BlockQ2_K>;

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    const int64_t nb = a.k / kQK_K;
    TileOperands<WB, BlockQ8_K, 8, R, T> tl(a, r0, t0);
    auto& [w, x, acc] = tl;
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; ++b) {
      __m256i s16[R], shalf[R][2];
      [[maybe_unused]] __m256i m16[R], hm[R];
      float d[R];
      [[maybe_unused]] float dmin[R];
      for (int r = 0; r < R; ++r) {
        if constexpr (kQ3) {
          s16[r] = _mm256_cvtepi8_epi16(q3_k_scales(w[r][b].scales));
          hm[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][b].hmask));
        } else {
          const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[r][b].scales));
          s16[r] = _mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(0x0F)));
          m16[r] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
          dmin[r] = _cvtsh_ss(w[r][b].dmin);
        }
        d[r] = _cvtsh_ss(w[r][b].d);
        shalf[r][0] = _mm256_permute2x128_si256(s16[r], s16[r], 0x00);  // scales 0..7 in both lanes
        shalf[r][1] = _mm256_permute2x128_si256(s16[r], s16[r], 0x11);  // scales 8..15
      }
      __m256i isum[R][T];
      for (int t = 0; t < T; ++t) {
        const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].bsums));
        for (int r = 0; r < R; ++r) {
          if constexpr (kQ3)  // -4 * sum of scale x bsum
            isum[r][t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(bsums, s16[r]), 2));
          else
            isum[r][t] = _mm256_setzero_si256();
        }
      }
      for (int st = 0; st < 8; ++st) {  // elements 32 st .. 32 st + 31: n = st / 4, j = st % 4
        const __m256i ctl = _mm256_load_si256(reinterpret_cast<const __m256i*>(kG16ScaleCtl.data() + 32 * (st % 4)));
        __m256i y[R], sc[R];
        for (int r = 0; r < R; ++r) {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][b].qs + 32 * (st / 4)));
          y[r] = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * (st % 4))), m3);
          if constexpr (kQ3) {  // bit st of hmask -> bit 2
            const __m256i hb = st >= 2 ? _mm256_srl_epi16(hm[r], _mm_cvtsi32_si128(st - 2))
                                       : _mm256_sll_epi16(hm[r], _mm_cvtsi32_si128(2 - st));
            y[r] = _mm256_or_si256(y[r], _mm256_and_si256(hb, _mm256_set1_epi8(4)));
          }
          sc[r] = _mm256_shuffle_epi8(shalf[r][st / 4], ctl);
        }
        for (int t = 0; t < T; ++t) {
          const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].qs + 32 * st));
          for (int r = 0; r < R; ++r)
            isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(y[r], xa), sc[r]));
        }
      }
      for (int t = 0; t < T; ++t) {
        [[maybe_unused]] const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].bsums));
        const float xd = x[t][b].d;
        for (int r = 0; r < R; ++r) {
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][t]), _mm256_set1_ps(d[r] * xd), acc[r][t]);
          if constexpr (!kQ3)
            acc[r][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bsums, m16[r])),
                                         _mm256_set1_ps(dmin[r] * xd), acc[r][t]);
        }
      }
    }
    tl.store(a, r0, t0);
  }
};

[[maybe_unused]] void add_q5_kquant_kernels(GemmTable& t, SimdLevel level) {
  t.add(level, DType::Q5_0, {&gemm<Q5Kernel<DType::Q5_0>>});
  t.add(level, DType::Q5_1, {&gemm<Q5Kernel<DType::Q5_1>>});
  t.add(level, DType::Q4_K, {&gemm<K45Kernel<DType::Q4_K>>});
  t.add(level, DType::Q5_K, {&gemm<K45Kernel<DType::Q5_K>>});
  t.add(level, DType::Q2_K, {&gemm<Q23Kernel<DType::Q2_K>>});
  t.add(level, DType::Q3_K, {&gemm<Q23Kernel<DType::Q3_K>>});
}
