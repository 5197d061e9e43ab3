// SIMD kernels for Q5_0, Q5_1 (x Q8_0 / Q8_1) and Q4_K, Q5_K (x Q8_K) on 256-bit vectors.
// Include only inside an anonymous namespace of kquant_avx2.cpp / kquant_avx512.cpp (after
// tile_driver.hpp): each ISA compiles its own copy. With AVX512-VNNI (the AVX-512 build) the
// 32-element block products use vpdpbusd, otherwise vpmaddubsw + vpmaddwd.
//
// Unsigned weights (0..15 or 0..31) enter the u8 x s8 products directly; Q5_0's offset of 16 is
// taken off as 16 * (sum of the activations), computed once per token and block. K-quant mins
// use the Q8_K group sums (bsums). Every output element is computed with the same operations
// whatever tile it falls in.

inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

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
    const WB* w[R];
    const XB* x[T];
    for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const WB*>(a.w + (r0 + r) * a.w_stride);
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const XB*>(a.x + (t0 + t) * a.x_stride);
    __m256 acc[R][T];
    [[maybe_unused]] float msum[R][T] = {};
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
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
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) {
        float s = hsum_ps(acc[r][t]);
        if constexpr (WT == DType::Q5_1) s += msum[r][t];
        a.y[(t0 + t) * a.y_stride + r0 + r] = s;
      }
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
    const WB* w[R];
    const BlockQ8_K* x[T];
    for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const WB*>(a.w + (r0 + r) * a.w_stride);
    for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const BlockQ8_K*>(a.x + (t0 + t) * a.x_stride);
    __m256 acc[R][T];
    float macc[R][T] = {};
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
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
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) a.y[(t0 + t) * a.y_stride + r0 + r] = hsum_ps(acc[r][t]) - macc[r][t];
  }
};

[[maybe_unused]] const KQuantSet& make_kquant_set() {
  static const KQuantSet set{&gemm<Q5Kernel<DType::Q5_0>>, &gemm<Q5Kernel<DType::Q5_1>>,
                             &gemm<K45Kernel<DType::Q4_K>>, &gemm<K45Kernel<DType::Q5_K>>};
  return set;
}
