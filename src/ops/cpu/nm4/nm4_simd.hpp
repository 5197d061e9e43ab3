// The neuron-major 4-bit axpy (ops/cpu/nm4/nm4.hpp) on 256-bit vectors: the AVX2 kernel, and the
// AVX-512 kernel's chunks narrower than 128 outputs (a 32-wide chunk's 16 bytes in the low lane).
// Include only inside an anonymous namespace of nm4/nm4_avx2.cpp / nm4/nm4_avx512.cpp: each ISA compiles
// its own copy. Needs ops/cpu/simd_f32.hpp, included before it.
//
// Per segment and 32-byte piece of a chunk: for each four of the segment's rows, the rows' bytes
// are interleaved (vpunpck{l,h}bw of two pairs, then vpunpck{l,h}wd), so that each 32-bit lane
// holds a byte of each row at one position; then the low and high nibbles are masked out (four
// codes of one output: the masks and the 16-bit shift act within each byte, so this is the same
// as masking each row first, in fewer instructions), and vpdpbusd multiplies them by the four's
// int8 factors and adds the four products into the output's 32-bit lane (without VNNI: vpmaddubsw
// into 16-bit half-sums, summed into the lane once per segment: nm4_acc_add). The lanes come out
// in output order by the copy's layout. Q4_0's 8 x the factors' sum starts the sums off. Then per
// output the sum is converted to a float and scaled into the output as the scalar kernel does.

// The segment's rows (in fours, the last four padded with the last row).
struct Nm4Rows {
  const uint8_t* p[kNm4Segment];
};
inline Nm4Rows nm4_rows(const TensorView& D, const Nm4Seg& s) {
  Nm4Rows r;
  for (int k = 0; k < 4 * s.quads; ++k) r.p[k] = nm4_row(D, s.ids[k]);
  return r;
}

// Each output's sum over a segment's fours of rows: u (the four rows' codes of an output in a
// 32-bit lane, unsigned) times f (the four's factors, signed). With VNNI, vpdpbusd adds the four
// products into the lane, which starts at `init`; without, vpmaddubsw's two sums of two products
// are added in 16 bits (each half of a lane takes two rows a four: at most 8 x 127 x 15 over a
// segment) and the halves summed into 32 bits once, at the end (vpmaddwd by ones). The
// same exact integers either way.
static_assert(kNm4Segment / 2 * 127 * 15 < 32768, "a segment's 16-bit half-sums must not overflow");
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
inline __m256i nm4_acc_start(__m256i init) { return init; }
inline __m256i nm4_acc_add(__m256i acc, __m256i u, __m256i f) { return _mm256_dpbusd_epi32(acc, u, f); }
inline __m256i nm4_acc_end(__m256i acc, __m256i) { return acc; }
#else
inline __m256i nm4_acc_start(__m256i) { return _mm256_setzero_si256(); }
inline __m256i nm4_acc_add(__m256i acc, __m256i u, __m256i f) {
  return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, f));
}
inline __m256i nm4_acc_end(__m256i acc, __m256i init) {
  return _mm256_add_epi32(init, _mm256_madd_epi16(acc, _mm256_set1_epi16(1)));
}
#endif

// What the entries of the group holding output c take (nm4/nm4.hpp): for fp16 tables the segment's
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

// A table's entries at outputs [c, c + lanes) as floats: the fp16 values, or a narrow table's codes.
template <class V, bool kNarrow>
inline V nm4_table(const uint16_t* half, const uint8_t* code, int64_t c) {
  if constexpr (kNarrow) return F32<V>::from_u8(code + c);
  else return F32<V>::from_f16(half + c);
}

// o[0 .. lanes) = fma(d * e, float(acc), Q4_1: o + m * s), for outputs [c, c + lanes) of the
// tables, as nm4/nm4.hpp says for fp16 and narrow tables (f: nm4_group_factors').
template <class V, bool kMin, bool kNarrow>
inline void nm4_scale(float* o, const Nm4Tables& t, int64_t c, typename F32<V>::I acc, const Nm4GroupFactors& f) {
  using S = F32<V>;
  V v = S::load(o);
  if constexpr (kMin) {
    const V m = nm4_table<V, kNarrow>(t.m, t.mc, c);
    if constexpr (kNarrow)
      v = S::add(v, S::fmadd(m, S::set1(f.m_mul), S::set1(f.m_add)));
    else
      v = S::fmadd(m, S::set1(f.m_mul), v);
  }
  const V d = nm4_table<V, kNarrow>(t.d, t.dc, c);
  const V de = kNarrow ? S::fmadd(d, S::set1(f.d_mul), S::set1(f.d_add)) : S::mul(d, S::set1(f.d_mul));
  S::store(o, S::fmadd(de, S::from_i32(acc), v));
}

// A segment's sums over bytes [at, at + 32) of its rows (kHalf: [at, at + 16), the upper lane
// zero), each 32-bit lane one output's, from `init`: acc[m] from the low nibbles of interleaved
// vector m, acc[4 + m] from its high nibbles.
template <bool kHalf>
inline void nm4_quad_sums(const Nm4Seg& s, const Nm4Rows& rows, size_t at, __m256i init, __m256i acc[8]) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int k = 0; k < 8; ++k) acc[k] = nm4_acc_start(init);
  for (int q = 0; q < s.quads; ++q) {
    const auto load = [&](int r) {
      const uint8_t* p = rows.p[4 * q + r] + at;
      if constexpr (kHalf) return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      else return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    };
    const __m256i a = load(0), b = load(1), c = load(2), d = load(3);
    const __m256i f = _mm256_set1_epi32(s.quad_f[q]);
    const __m256i xl = _mm256_unpacklo_epi8(a, b), xh = _mm256_unpackhi_epi8(a, b);
    const __m256i yl = _mm256_unpacklo_epi8(c, d), yh = _mm256_unpackhi_epi8(c, d);
    const __m256i z[4] = {_mm256_unpacklo_epi16(xl, yl), _mm256_unpackhi_epi16(xl, yl), _mm256_unpacklo_epi16(xh, yh),
                          _mm256_unpackhi_epi16(xh, yh)};
    for (int m = 0; m < 4; ++m) {
      acc[m] = nm4_acc_add(acc[m], _mm256_and_si256(z[m], mask), f);
      acc[4 + m] = nm4_acc_add(acc[4 + m], _mm256_and_si256(_mm256_srli_epi16(z[m], 4), mask), f);
    }
  }
  for (int k = 0; k < 8; ++k) acc[k] = nm4_acc_end(acc[k], init);
}

// Bytes [at, at + 32) of the rows, lanes 2 P and 2 P + 1 of a chunk `width` (64 or 128) wide
// whose first output is `start` (out: its output): after the interleave, vector m's low nibbles
// are the chunk's outputs m * width / 8 + 8 P + [0, 8), its high nibbles those plus width / 2.
template <bool kMin, bool kNarrow>
inline void nm4_piece32(const Nm4Seg& s, const Nm4Rows& rows, size_t at, int64_t width, int64_t P, float* out,
                        const Nm4Tables& t, int64_t start) {
  __m256i acc[8];
  nm4_quad_sums<false>(s, rows, at, _mm256_set1_epi32(kMin ? 0 : -s.offset), acc);
  Nm4GroupFactors f = nm4_group_factors<kMin, false>(t, start, s);  // fp16 tables: once
  int64_t group = -1;
  for (int k = 0; k < 8; ++k) {
    const int64_t c = k / 4 * (width / 2) + k % 4 * (width / 8) + 8 * P;  // 8 outputs, in one group
    if (kNarrow && (start + c) / kNm8Group != group) {  // a narrow table's group: its factors once
      group = (start + c) / kNm8Group;
      f = nm4_group_factors<kMin, kNarrow>(t, start + c, s);
    }
    nm4_scale<__m256, kMin, kNarrow>(out + c, t, start + c, acc[k], f);
  }
}

// A 32-wide chunk (16 bytes, one lane: a Q4_0 block's order): the low lane of vector m's low
// nibbles are outputs 4 m + [0, 4), of its high nibbles those plus 16.
template <bool kMin, bool kNarrow>
inline void nm4_piece16(const Nm4Seg& s, const Nm4Rows& rows, size_t at, float* out, const Nm4Tables& t,
                        int64_t start) {
  __m256i acc[8];
  nm4_quad_sums<true>(s, rows, at, _mm256_set1_epi32(kMin ? 0 : -s.offset), acc);
  const Nm4GroupFactors f = nm4_group_factors<kMin, kNarrow>(t, start, s);  // the chunk is one group
  for (int k = 0; k < 4; ++k)  // outputs 8 k .. 8 k + 8: the low lanes of vectors 2 k and 2 k + 1
    nm4_scale<__m256, kMin, kNarrow>(
        out + 8 * k, t, start + 8 * k,
        _mm256_set_m128i(_mm256_castsi256_si128(acc[2 * k + 1]), _mm256_castsi256_si128(acc[2 * k])), f);
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
    nm4_piece32<kMin, kNarrow>(s, rows, at + 32 * static_cast<size_t>(piece), c.width, piece, o, t, c.start);
}
