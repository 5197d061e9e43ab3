// The neuron-major 4-bit axpy (ops/cpu/nm4.hpp) on 256- and 128-bit vectors: the AVX2 kernel,
// and the AVX-512 kernel's chunks narrower than 128 outputs. Include only inside an anonymous
// namespace of nm4_avx2.cpp / nm4_avx512.cpp: each ISA compiles its own copy.
//
// Per segment and 32-byte piece of a chunk: for each pair of the segment's rows, the two rows'
// bytes are interleaved (vpunpck{l,h}bw), then the low and high nibbles masked out (a code of each
// row for one output: the masks and the 16-bit shift act within each byte, so this is the same as
// masking each row first, in two instructions fewer), and vpmaddubsw multiplies them by the
// pair's int8 factors and adds the two products into one 16-bit lane per output. The lanes come
// out in output order by the copy's layout; a segment's sums (at most 16 x 127 x 15) stay in 16
// bits. Then per output: Q4_0 takes off 8 x the factors' sum, the sum is widened to 32 bits and a
// float, and scaled into the output as the scalar kernel does.

// The segment's rows (each pair's two, an odd count's last twice).
struct Nm4Rows {
  const uint8_t* p[kNm4Segment];
};
inline Nm4Rows nm4_rows(const TensorView& D, const Nm4Seg& s) {
  Nm4Rows r;
  for (int k = 0; k < 2 * s.pairs; ++k) r.p[k] = nm4_row(D, s.ids[k]);
  return r;
}

// What the entries of the group holding output c take (nm4.hpp): for fp16 tables the segment's
// e (and Q4_1's s) as they are; for narrow ones each times the group's scale, and times its base
// to add.
struct Nm4GroupFactors {
  float d_mul, d_add, m_mul, m_add;
};
template <bool kMin, bool kNarrow>
inline Nm4GroupFactors nm4_group_factors(const Nm4Tables& t, int64_t c, const Nm4Seg& s) {
  Nm4GroupFactors f{s.scale, 0.0f, s.sum, 0.0f};
  if constexpr (kNarrow) {
    const uint16_t* d = t.dsb + 2 * (c / kNm8Group);
    f.d_mul = _cvtsh_ss(d[0]) * s.scale, f.d_add = _cvtsh_ss(d[1]) * s.scale;
    if constexpr (kMin) {
      const uint16_t* m = t.msb + 2 * (c / kNm8Group);
      f.m_mul = _cvtsh_ss(m[0]) * s.sum, f.m_add = _cvtsh_ss(m[1]) * s.sum;
    }
  }
  return f;
}

// A table's entries at outputs [c, c + 8) as floats: the fp16 values, or a narrow table's codes.
template <bool kNarrow>
inline __m256 nm4_table8(const uint16_t* half, const uint8_t* code, int64_t c) {
  if constexpr (kNarrow)
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(code + c))));
  else
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(half + c)));
}

// o[0 .. 8) = fma(d * e, float(acc), Q4_1: o + m * s), for outputs [c, c + 8) of the tables, as
// nm4.hpp says for fp16 and narrow tables (f: nm4_group_factors').
template <bool kMin, bool kNarrow>
inline void nm4_scale8(float* o, const Nm4Tables& t, int64_t c, __m256i acc, const Nm4GroupFactors& f) {
  __m256 v = _mm256_loadu_ps(o);
  if constexpr (kMin) {
    const __m256 m = nm4_table8<kNarrow>(t.m, t.mc, c);
    if constexpr (kNarrow)
      v = _mm256_add_ps(v, _mm256_fmadd_ps(m, _mm256_set1_ps(f.m_mul), _mm256_set1_ps(f.m_add)));
    else
      v = _mm256_fmadd_ps(m, _mm256_set1_ps(f.m_mul), v);
  }
  const __m256 d = nm4_table8<kNarrow>(t.d, t.dc, c);
  const __m256 de = kNarrow ? _mm256_fmadd_ps(d, _mm256_set1_ps(f.d_mul), _mm256_set1_ps(f.d_add))
                            : _mm256_mul_ps(d, _mm256_set1_ps(f.d_mul));
  _mm256_storeu_ps(o, _mm256_fmadd_ps(de, _mm256_cvtepi32_ps(acc), v));
}

// Bytes [at, at + 32) of the rows, in a chunk `width` (64 or 128) wide whose first output is
// `start` (out: its output): the low nibbles are the chunk's outputs k * width / 4 + col + [0, 16)
// for k = 0, 1 (unpacklo, unpackhi), col = 16 x the piece, the high nibbles those plus width / 2.
template <bool kMin, bool kNarrow>
inline void nm4_piece32(const Nm4Seg& s, const Nm4Rows& rows, size_t at, int64_t width, int64_t col, float* out,
                        const Nm4Tables& t, int64_t start) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  for (int p = 0; p < s.pairs; ++p) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.p[2 * p] + at));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.p[2 * p + 1] + at));
    const __m256i f = _mm256_set1_epi16(s.pair_f[p]);
    const __m256i lo = _mm256_unpacklo_epi8(a, b), hi = _mm256_unpackhi_epi8(a, b);
    acc[0] = _mm256_add_epi16(acc[0], _mm256_maddubs_epi16(_mm256_and_si256(lo, mask), f));
    acc[1] = _mm256_add_epi16(acc[1], _mm256_maddubs_epi16(_mm256_and_si256(hi, mask), f));
    acc[2] = _mm256_add_epi16(acc[2], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(lo, 4), mask), f));
    acc[3] = _mm256_add_epi16(acc[3], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 4), mask), f));
  }
  const __m256i off = _mm256_set1_epi16(static_cast<int16_t>(s.offset));
  const Nm4GroupFactors whole = nm4_group_factors<kMin, false>(t, start, s);  // fp16 tables: once
  for (int k = 0; k < 4; ++k) {
    const __m256i a16 = kMin ? acc[k] : _mm256_sub_epi16(acc[k], off);
    const int64_t c = k * width / 4 + col;  // 16 outputs, in one group
    const Nm4GroupFactors f = kNarrow ? nm4_group_factors<kMin, kNarrow>(t, start + c, s) : whole;
    nm4_scale8<kMin, kNarrow>(out + c, t, start + c, _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a16)), f);
    nm4_scale8<kMin, kNarrow>(out + c + 8, t, start + c + 8, _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a16, 1)),
                              f);
  }
}

// A 32-wide chunk (16 bytes, one lane: a Q4_0 block's order).
template <bool kMin, bool kNarrow>
inline void nm4_piece16(const Nm4Seg& s, const Nm4Rows& rows, size_t at, float* out, const Nm4Tables& t,
                        int64_t start) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  __m128i acc[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
  for (int p = 0; p < s.pairs; ++p) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows.p[2 * p] + at));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows.p[2 * p + 1] + at));
    const __m128i f = _mm_set1_epi16(s.pair_f[p]);
    const __m128i lo = _mm_unpacklo_epi8(a, b), hi = _mm_unpackhi_epi8(a, b);
    acc[0] = _mm_add_epi16(acc[0], _mm_maddubs_epi16(_mm_and_si128(lo, mask), f));
    acc[1] = _mm_add_epi16(acc[1], _mm_maddubs_epi16(_mm_and_si128(hi, mask), f));
    acc[2] = _mm_add_epi16(acc[2], _mm_maddubs_epi16(_mm_and_si128(_mm_srli_epi16(lo, 4), mask), f));
    acc[3] = _mm_add_epi16(acc[3], _mm_maddubs_epi16(_mm_and_si128(_mm_srli_epi16(hi, 4), mask), f));
  }
  const Nm4GroupFactors f = nm4_group_factors<kMin, kNarrow>(t, start, s);  // the chunk is one group
  const __m128i off = _mm_set1_epi16(static_cast<int16_t>(s.offset));
  for (int k = 0; k < 4; ++k) {
    const __m128i a16 = kMin ? acc[k] : _mm_sub_epi16(acc[k], off);
    nm4_scale8<kMin, kNarrow>(out + 8 * k, t, start + 8 * k, _mm256_cvtepi16_epi32(a16), f);
  }
}

// Segment s over chunk c; `out` is the slice's output at output `col0`.
template <bool kMin, bool kNarrow>
inline void nm4_chunk256(const TensorView& D, const Nm4Seg& s, const Nm4Rows& rows, Nm4Chunk c, int64_t col0,
                         float* out) {
  const Nm4Tables t = nm4_tables(D, s.block);
  float* o = out + (c.start - col0);
  const size_t at = static_cast<size_t>(c.start / 2);
  if (c.width == 32) {
    nm4_piece16<kMin, kNarrow>(s, rows, at, o, t, c.start);
    return;
  }
  for (int64_t piece = 0; piece < c.width / 64; ++piece)
    nm4_piece32<kMin, kNarrow>(s, rows, at + 32 * static_cast<size_t>(piece), c.width, 16 * piece, o, t, c.start);
}
