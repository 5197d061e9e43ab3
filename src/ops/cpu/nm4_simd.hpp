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

// o[0 .. 8) = fma(d * e, float(acc), Q4_1: fma(m, s, o)).
template <bool kMin>
inline void nm4_scale8(float* o, const uint16_t* d, const uint16_t* m, __m256i acc, __m256 e, __m256 s) {
  __m256 v = _mm256_loadu_ps(o);
  if constexpr (kMin) v = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m))), s, v);
  const __m256 de = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d))), e);
  _mm256_storeu_ps(o, _mm256_fmadd_ps(de, _mm256_cvtepi32_ps(acc), v));
}

// Bytes [at, at + 32) of the rows, in a chunk `width` (64 or 128) wide whose first output is at
// out / d / m: the low nibbles are the chunk's outputs k * width / 4 + col + [0, 16) for k = 0, 1
// (unpacklo, unpackhi), col = 16 x the piece, the high nibbles those plus width / 2.
template <bool kMin>
inline void nm4_piece32(const Nm4Seg& s, const Nm4Rows& rows, size_t at, int64_t width, int64_t col, float* out,
                        const uint16_t* d, const uint16_t* m) {
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
  const __m256 e = _mm256_set1_ps(s.scale), sum = _mm256_set1_ps(s.sum);
  const __m256i off = _mm256_set1_epi16(static_cast<int16_t>(s.offset));
  for (int k = 0; k < 4; ++k) {
    const __m256i a16 = kMin ? acc[k] : _mm256_sub_epi16(acc[k], off);
    const int64_t c = k * width / 4 + col;
    nm4_scale8<kMin>(out + c, d + c, m + c, _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a16)), e, sum);
    nm4_scale8<kMin>(out + c + 8, d + c + 8, m + c + 8, _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a16, 1)), e,
                     sum);
  }
}

// A 32-wide chunk (16 bytes, one lane: a Q4_0 block's order).
template <bool kMin>
inline void nm4_piece16(const Nm4Seg& s, const Nm4Rows& rows, size_t at, float* out, const uint16_t* d,
                        const uint16_t* m) {
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
  const __m256 e = _mm256_set1_ps(s.scale), sum = _mm256_set1_ps(s.sum);
  const __m128i off = _mm_set1_epi16(static_cast<int16_t>(s.offset));
  for (int k = 0; k < 4; ++k) {
    const __m128i a16 = kMin ? acc[k] : _mm_sub_epi16(acc[k], off);
    nm4_scale8<kMin>(out + 8 * k, d + 8 * k, m + 8 * k, _mm256_cvtepi16_epi32(a16), e, sum);
  }
}

// Segment s over chunk c; `out` is the slice's output at output `col0`.
template <bool kMin>
inline void nm4_chunk256(const TensorView& D, const Nm4Seg& s, const Nm4Rows& rows, Nm4Chunk c, int64_t col0,
                         float* out) {
  const uint16_t* d = nm4_scales(D, s.block) + c.start;
  const uint16_t* m = d + D.cols();
  float* o = out + (c.start - col0);
  const size_t at = static_cast<size_t>(c.start / 2);
  if (c.width == 32) {
    nm4_piece16<kMin>(s, rows, at, o, d, m);
    return;
  }
  for (int64_t piece = 0; piece < c.width / 64; ++piece)
    nm4_piece32<kMin>(s, rows, at + 32 * static_cast<size_t>(piece), c.width, 16 * piece, o, d, m);
}
