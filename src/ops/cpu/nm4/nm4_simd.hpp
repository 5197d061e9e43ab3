// The neuron-major 4-bit axpy (ops/cpu/nm4/nm4.hpp) on 256-bit vectors: the AVX2 and AVX-VNNI
// kernels, and the AVX-512 kernel's chunks narrower than 128 outputs (a 32-wide chunk's 16 bytes
// in the low lane); and the segment loop with its prefetches, which every SIMD kernel runs.
// Include only inside an anonymous namespace of nm4/nm4_avx2.cpp / nm4_avxvnni.cpp /
// nm4_avx512.cpp: each ISA compiles its own copy. Needs ops/cpu/simd_f32.hpp, included before it.
//
// Per segment and 32-byte piece of a chunk, each output's sum over the segment's rows of code x
// int8 factor, exact in integers, then per output the sum converted to a float and scaled into the
// output as the scalar kernel does. Two ways to the sums, the same integers:
// - with VNNI (vpdpbusd), fours of rows: their bytes interleaved (vpunpck{l,h}bw of two pairs,
//   then vpunpck{l,h}wd), so that each 32-bit lane holds a byte of each row at one position; the
//   low and high nibbles masked out (four codes of one output: the masks and the 16-bit shift act
//   within each byte, so this is the same as masking each row first, in fewer instructions), and
//   vpdpbusd multiplies them by the four's factors and adds the four products into the output's
//   32-bit lane. Eight accumulators of 8 outputs.
// - without (AVX2), pairs of rows: their bytes interleaved once (vpunpck{l,h}bw), so that each
//   16-bit lane holds a byte of each row; the nibbles masked out as above, and vpmaddubsw
//   multiplies the two codes of an output by the pair's factors and adds them into 16 bits, summed
//   over the segment in 16 bits (a segment's sum fits: at most 16 x 127 x 15) and sign-extended to
//   32 bits once. Four accumulators of 16 outputs: with the fours' eight accumulators and their
//   interleaves, AVX2's 16 registers spilled in the loop.
// The lanes come out in output order by the copy's layout. Q4_0's 8 x the factors' sum starts the
// sums off.

// The segment's rows (in fours, the last four padded with the last row).
struct Nm4Rows {
  const uint8_t* p[kNm4Segment];
};
inline Nm4Rows nm4_rows(const TensorView& D, const Nm4Seg& s) {
  Nm4Rows r;
  for (int k = 0; k < 4 * s.quads; ++k) r.p[k] = nm4_row(D, s.ids[k]);
  return r;
}

static_assert(kNm4Segment * 127 * 15 < 32768, "a segment's sums must fit in 16 bits");

// Bytes [at, at + 32) of a row (kHalf: [at, at + 16), the upper lane zero).
template <bool kHalf>
inline __m256i nm4_load(const uint8_t* row, size_t at) {
  if constexpr (kHalf) return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + at)));
  else return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + at));
}

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
inline __m256i nm4_dpbusd(__m256i acc, __m256i u, __m256i f) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, f);
#else
  return _mm256_dpbusd_avx_epi32(acc, u, f);
#endif
}

// A segment's sums over bytes [at, at + 32) of its rows (kHalf: [at, at + 16)), each 32-bit lane
// one output's, from `init`: acc[m] from the low nibbles of interleaved vector m, acc[4 + m] from
// its high nibbles. For a full piece of a chunk `width` wide, lanes 2 P and 2 P + 1 of it,
// acc[k] holds outputs k / 4 * width / 2 + k % 4 * width / 8 + 8 P + [0, 8); for a half one (a
// 32-wide chunk) the low lane of acc[m] holds outputs 4 m + [0, 4) and of acc[4 + m] those plus 16.
template <bool kHalf>
inline void nm4_sums(const Nm4Seg& s, const Nm4Rows& rows, size_t at, int32_t init, __m256i acc[8]) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int k = 0; k < 8; ++k) acc[k] = _mm256_set1_epi32(init);
  for (int q = 0; q < s.quads; ++q) {
    const __m256i a = nm4_load<kHalf>(rows.p[4 * q], at), b = nm4_load<kHalf>(rows.p[4 * q + 1], at);
    const __m256i c = nm4_load<kHalf>(rows.p[4 * q + 2], at), d = nm4_load<kHalf>(rows.p[4 * q + 3], at);
    const __m256i f = _mm256_set1_epi32(s.quad_f[q]);
    const __m256i xl = _mm256_unpacklo_epi8(a, b), xh = _mm256_unpackhi_epi8(a, b);
    const __m256i yl = _mm256_unpacklo_epi8(c, d), yh = _mm256_unpackhi_epi8(c, d);
    const __m256i z[4] = {_mm256_unpacklo_epi16(xl, yl), _mm256_unpackhi_epi16(xl, yl), _mm256_unpacklo_epi16(xh, yh),
                          _mm256_unpackhi_epi16(xh, yh)};
    for (int m = 0; m < 4; ++m) {
      acc[m] = nm4_dpbusd(acc[m], _mm256_and_si256(z[m], mask), f);
      acc[4 + m] = nm4_dpbusd(acc[4 + m], _mm256_and_si256(_mm256_srli_epi16(z[m], 4), mask), f);
    }
  }
}
#else
// The same sums, in the same accumulators and lanes, by pairs of rows (see the top of the file).
// `init` (Q4_0's - 8 x the factors' sum, or 0) starts the 16-bit sums: a partial sum is then the
// sum of f (q - 8) over the rows taken so far and of - 8 f over the rest, at most 16 x 127 x 8 in
// magnitude (Q4_1: of f q, at most 16 x 127 x 15), so 16 bits hold every one.
template <bool kHalf>
inline void nm4_sums(const Nm4Seg& s, const Nm4Rows& rows, size_t at, int32_t init, __m256i acc[8]) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  // v[0]: outputs of bytes 0-7 of each lane, low nibbles; v[1]: their high nibbles; v[2], v[3]:
  // bytes 8-15. Each 128-bit half of a v holds two runs of 4 outputs (m = 2 n, 2 n + 1).
  __m256i v0 = _mm256_set1_epi16(static_cast<int16_t>(init)), v1 = v0, v2 = v0, v3 = v0;
  // Pairs up to the last row with a factor (the fours' padding rows have factors of 0, so a pair
  // made only of them adds nothing).
  for (int p = 0; p < (s.count + 1) / 2; ++p) {
    const __m256i a = nm4_load<kHalf>(rows.p[2 * p], at), b = nm4_load<kHalf>(rows.p[2 * p + 1], at);
    int16_t pair_f;  // the pair's two factors: bytes 2 p, 2 p + 1 of the fours' lanes
    std::memcpy(&pair_f, reinterpret_cast<const uint8_t*>(s.quad_f) + 2 * p, sizeof pair_f);
    const __m256i f = _mm256_set1_epi16(pair_f);
    const __m256i xl = _mm256_unpacklo_epi8(a, b), xh = _mm256_unpackhi_epi8(a, b);
    v0 = _mm256_add_epi16(v0, _mm256_maddubs_epi16(_mm256_and_si256(xl, mask), f));
    v1 = _mm256_add_epi16(v1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(xl, 4), mask), f));
    v2 = _mm256_add_epi16(v2, _mm256_maddubs_epi16(_mm256_and_si256(xh, mask), f));
    v3 = _mm256_add_epi16(v3, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(xh, 4), mask), f));
  }
  // Widened to the fours' lanes: acc[m] gets run m (low nibbles, m = 0 .. 3), acc[4 + m] its high
  // nibbles. Each lane of a v holds runs 2 n and 2 n + 1 of 4 outputs; interleaving v with its
  // sign (vpunpck{l,h}wd, within lanes) sign-extends run 2 n of both lanes into lo and run 2 n + 1
  // into hi, in output order (a half piece's upper lane is zero).
  const auto widen = [](__m256i v, __m256i& lo, __m256i& hi) {
    const __m256i sign = _mm256_srai_epi16(v, 15);
    lo = _mm256_unpacklo_epi16(v, sign);
    hi = _mm256_unpackhi_epi16(v, sign);
  };
  widen(v0, acc[0], acc[1]);
  widen(v2, acc[2], acc[3]);
  widen(v1, acc[4], acc[5]);
  widen(v3, acc[6], acc[7]);
}
#endif

// What the entries of the group holding output c take (nm4/nm4.hpp): for fp16 tables the segment's
// e (and Q4_1's s) as they are; for narrow ones each times the group's scale, and times its base
// to add.
struct Nm4GroupFactors {
  float d_mul, d_add, m_mul, m_add;
};

static_assert(kNm8Group == 32, "a narrow group's index is the output's >> 5");

// A segment's group factors over the outputs [c0, c0 + len) it runs over (c0 a multiple of
// kNm8Group). For narrow tables they are computed once per segment, eight products at a time (the
// same products nm4.hpp names: the group's fp16 scale and base times e, and times s), into `buf`;
// fp16 tables take e and s as they are.
struct Nm4SliceFactors {
  const float* d = nullptr;  // narrow: (scale e, base e) of group c0 / 32 + g at 2 g
  const float* m = nullptr;  // Q4_1: (scale s, base s) of m's table, the same
  int64_t g0 = 0;
  float e = 0.0f, sum = 0.0f;

  // The factors of group `group` (an output's / kNm8Group), or of the group holding output c.
  template <bool kMin, bool kNarrow>
  Nm4GroupFactors group(int64_t group) const {
    if constexpr (!kNarrow) {
      return {e, 0.0f, sum, 0.0f};
    } else {
      const int64_t g = 2 * (group - g0);
      return {d[g], d[g + 1], kMin ? m[g] : 0.0f, kMin ? m[g + 1] : 0.0f};
    }
  }
  template <bool kMin, bool kNarrow>
  Nm4GroupFactors at(int64_t c) const {
    return group<kMin, kNarrow>(c >> 5);
  }
};

// dst[k] = fp16 h[k] x x for k < n.
inline void nm4_times(const uint16_t* h, int64_t n, float x, float* dst) {
  const __m256 v = _mm256_set1_ps(x);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    _mm256_storeu_ps(dst + k, _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + k))), v));
  for (; k < n; ++k) dst[k] = _cvtsh_ss(h[k]) * x;
}

template <bool kMin, bool kNarrow>
inline Nm4SliceFactors nm4_slice_factors(const Nm4Tables& t, const Nm4Seg& s, int64_t c0, int64_t len,
                                         std::vector<float>& buf) {
  Nm4SliceFactors f;
  f.e = s.scale, f.sum = s.sum, f.g0 = c0 / kNm8Group;
  if constexpr (kNarrow) {
    const int64_t n = 2 * ((len + kNm8Group - 1) / kNm8Group);  // floats: a (scale, base) pair a group
    if (buf.size() < static_cast<size_t>(2 * n)) buf.resize(static_cast<size_t>(2 * n));
    nm4_times(t.dsb + 2 * f.g0, n, s.scale, buf.data());
    f.d = buf.data();
    if constexpr (kMin) {
      nm4_times(t.msb + 2 * f.g0, n, s.sum, buf.data() + n);
      f.m = buf.data() + n;
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
// tables, as nm4/nm4.hpp says for fp16 and narrow tables (f: the group's, Nm4SliceFactors::at).
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

// Bytes [at, at + 32) of the rows, lanes 2 P and 2 P + 1 of a chunk kWidth (64 or 128) wide
// whose first output is `start` (out: its output): after the interleave, vector m's low nibbles
// are the chunk's outputs m * kWidth / 8 + 8 P + [0, 8), its high nibbles those plus kWidth / 2.
template <bool kMin, bool kNarrow, int kWidth>
inline void nm4_piece32(const Nm4Seg& s, const Nm4Rows& rows, size_t at, int P, float* out, const Nm4Tables& t,
                        int64_t start, const Nm4SliceFactors& sf) {
  __m256i acc[8];
  nm4_sums<false>(s, rows, at, kMin ? 0 : -s.offset, acc);
  // Accumulators k and k + 1 (kWidth 128: k even; 64: k < 4 and k >= 4) share a group.
  constexpr int kPerGroup = kWidth == kNm4Chunk ? 2 : 4;
  const int64_t g0 = start / kNm8Group;
  for (int k = 0; k < 8; k += kPerGroup) {
    const Nm4GroupFactors f = sf.group<kMin, kNarrow>(g0 + k / kPerGroup);
    for (int i = k; i < k + kPerGroup; ++i) {
      const int64_t c = i / 4 * (kWidth / 2) + i % 4 * (kWidth / 8) + 8 * P;  // 8 outputs
      nm4_scale<__m256, kMin, kNarrow>(out + c, t, start + c, acc[i], f);
    }
  }
}

// A 32-wide chunk (16 bytes, one lane: a Q4_0 block's order): the low lane of vector m's low
// nibbles are outputs 4 m + [0, 4), of its high nibbles those plus 16.
template <bool kMin, bool kNarrow>
inline void nm4_piece16(const Nm4Seg& s, const Nm4Rows& rows, size_t at, float* out, const Nm4Tables& t,
                        int64_t start, const Nm4SliceFactors& sf) {
  __m256i acc[8];
  nm4_sums<true>(s, rows, at, kMin ? 0 : -s.offset, acc);
  const Nm4GroupFactors f = sf.at<kMin, kNarrow>(start);  // the chunk is one group
  for (int k = 0; k < 4; ++k)  // outputs 8 k .. 8 k + 8: the low lanes of vectors 2 k and 2 k + 1
    nm4_scale<__m256, kMin, kNarrow>(
        out + 8 * k, t, start + 8 * k,
        _mm256_set_m128i(_mm256_castsi256_si128(acc[2 * k + 1]), _mm256_castsi256_si128(acc[2 * k])), f);
}

// Segment s over chunk c (tables t, o: the chunk's first output).
template <bool kMin, bool kNarrow>
inline void nm4_chunk256(const Nm4Seg& s, const Nm4Rows& rows, const Nm4Tables& t, Nm4Chunk c, float* o,
                         const Nm4SliceFactors& sf) {
  const size_t at = static_cast<size_t>(c.start / 2);
  if (c.width == kNm4Chunk) {
    nm4_piece32<kMin, kNarrow, kNm4Chunk>(s, rows, at, 0, o, t, c.start, sf);
    nm4_piece32<kMin, kNarrow, kNm4Chunk>(s, rows, at + 32, 1, o, t, c.start, sf);
  } else if (c.width == 64) {
    nm4_piece32<kMin, kNarrow, 64>(s, rows, at, 0, o, t, c.start, sf);
  } else {
    nm4_piece16<kMin, kNarrow>(s, rows, at, o, t, c.start, sf);
  }
}

constexpr int kNm4PrefetchSegments = 2;  // measured best of 1-3 (bench_sparse, SparseAxpy/Q4_0_NM)

// The lines of a chunk of up to 128 outputs from j on in the tables (fp16: 4 lines a table;
// narrow: 2 of codes and the one holding the chunk's 4 scale and base pairs).
template <bool kMin, bool kNarrow>
inline void nm4_prefetch_tables(const Nm4Tables& t, int64_t j) {
  const auto line = [](const void* p, int l) { _mm_prefetch(static_cast<const char*>(p) + 64 * l, _MM_HINT_T1); };
  if constexpr (kNarrow) {
    for (int l = 0; l < kNm4Chunk / 64; ++l) {
      line(t.dc + j, l);
      if constexpr (kMin) line(t.mc + j, l);
    }
    line(t.dsb + 2 * (j / kNm8Group), 0);
    if constexpr (kMin) line(t.msb + 2 * (j / kNm8Group), 0);
  } else {
    for (int l = 0; l < kNm4Chunk * 2 / 64; ++l) {
      line(t.d + j, l);
      if constexpr (kMin) line(t.m + j, l);
    }
  }
}

// The axpy's loop, the same at every level: segment by segment, chunk by chunk of outputs
// [col0, col0 + len), chunk(s, rows, t, c, o, sf) adds segment s into chunk c (o: the chunk's first
// output; sf: the segment's group factors over the slice). On the way, the rows and tables of the
// segment kNm4PrefetchSegments on are prefetched, the chunk's line of each (measured 0.93-0.96x the
// time at AVX-512, docs/benchmarks.md).
template <bool kMin, bool kNarrow, class Chunk>
inline void nm4_axpy_segments(const TensorView& D, const Nm4Seg* segs, int64_t n_segs, int64_t col0, int64_t len,
                              float* out, Chunk&& chunk) {
  thread_local std::vector<float> factors;
  const int64_t full = col0 + len / kNm4Chunk * kNm4Chunk;  // whole chunks up to here (col0 starts one)
  for (int64_t g = 0; g < n_segs; ++g) {
    const Nm4Seg& s = segs[g];
    const Nm4Rows rows = nm4_rows(D, s);
    const Nm4Tables t = nm4_tables(D, s.block);
    const Nm4SliceFactors sf = nm4_slice_factors<kMin, kNarrow>(t, s, col0, len, factors);
    const bool ahead = g + kNm4PrefetchSegments < n_segs;
    Nm4Rows next;
    Nm4Tables next_t;
    int next_rows = 0;
    if (ahead) {
      const Nm4Seg& n = segs[g + kNm4PrefetchSegments];
      next = nm4_rows(D, n);
      next_t = nm4_tables(D, n.block);
      next_rows = 4 * n.quads;  // the rows nm4_rows set
    }
    for (int64_t j = col0; j < col0 + len;) {
      const Nm4Chunk c = j < full ? Nm4Chunk{j, kNm4Chunk} : nm4_chunk_at(D.cols(), j);
      if (ahead) {
        for (int r = 0; r < next_rows; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(next.p[r] + j / 2), _MM_HINT_T1);
        nm4_prefetch_tables<kMin, kNarrow>(next_t, j);
      }
      chunk(s, rows, t, c, out + (j - col0), sf);
      j += c.width;
    }
  }
}

// The kernel of the 256-bit levels (AVX2, AVX-VNNI).
template <bool kMin, bool kNarrow>
void nm4_axpy256(const TensorView& D, const Nm4Seg* segs, int64_t n_segs, int64_t col0, int64_t len, float* out) {
  nm4_axpy_segments<kMin, kNarrow>(
      D, segs, n_segs, col0, len, out,
      [](const Nm4Seg& s, const Nm4Rows& rows, const Nm4Tables& t, Nm4Chunk c, float* o, const Nm4SliceFactors& sf) {
        nm4_chunk256<kMin, kNarrow>(s, rows, t, c, o, sf);
      });
}
