// AVX-512 kernel of the neuron-major 4-bit axpy (ops/cpu/nm4.hpp). Per segment, 128 outputs (one
// 64-byte line of each row) at a time: pairs of rows' nibbles interleaved and multiplied by the
// pair's int8 factors with vpmaddubsw into four 16-bit accumulators (outputs in order, by the
// copy's layout), then widened and scaled into the output once. 18 instructions per 256 weights
// where widening codes to floats took 12 per 64 (the bytes are interleaved before the nibbles are
// masked, as in nm4_simd.hpp). Chunks narrower than 128 at a row's end take the 256-bit code
// (nm4_simd.hpp). The rows two segments on are prefetched on the way, a line of each per chunk,
// as in the other grouped sparse kernels (sparse_avx512.cpp), with their part of the scale
// table(s) (measured 0.93-0.96x the time, docs/benchmarks.md). fp16 or narrow (8-bit) tables: a
// template parameter. Same operations per output as the scalar kernel, so the same bits.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "ops/cpu/nm4.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/nm4_simd.hpp"

constexpr int kPrefetchSegments = 2;  // measured best of 1-3 (bench_sparse, SparseAxpy/Q4_0_NM)

// A table's entries at outputs [c, c + 16), as nm4_table8.
template <bool kNarrow>
inline __m512 table16(const uint16_t* half, const uint8_t* code, int64_t c) {
  if constexpr (kNarrow)
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(code + c))));
  else
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(half + c)));
}

// out[0 .. 16), as nm4_scale8.
template <bool kMin, bool kNarrow>
inline void scale16(float* o, const Nm4Tables& t, int64_t c, __m512i acc, const Nm4GroupFactors& f) {
  __m512 v = _mm512_loadu_ps(o);
  if constexpr (kMin) {
    const __m512 m = table16<kNarrow>(t.m, t.mc, c);
    if constexpr (kNarrow)
      v = _mm512_add_ps(v, _mm512_fmadd_ps(m, _mm512_set1_ps(f.m_mul), _mm512_set1_ps(f.m_add)));
    else
      v = _mm512_fmadd_ps(m, _mm512_set1_ps(f.m_mul), v);
  }
  const __m512 d = table16<kNarrow>(t.d, t.dc, c);
  const __m512 de = kNarrow ? _mm512_fmadd_ps(d, _mm512_set1_ps(f.d_mul), _mm512_set1_ps(f.d_add))
                            : _mm512_mul_ps(d, _mm512_set1_ps(f.d_mul));
  _mm512_storeu_ps(o, _mm512_fmadd_ps(de, _mm512_cvtepi32_ps(acc), v));
}

// The lines of a chunk of 128 outputs from j on in the tables (fp16: 4 lines a table; narrow: 2
// of codes and the one holding the chunk's 4 scale and base pairs).
template <bool kMin, bool kNarrow>
inline void prefetch_tables(const Nm4Tables& t, int64_t j) {
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

// Segment s over the 128 outputs from j (o: their output); the next segment's rows and tables
// (`next`, when there is one) prefetched on the way.
template <bool kMin, bool kNarrow>
void chunk128(const Nm4Seg& s, const Nm4Rows& rows, const Nm4Rows* next, int next_rows, const Nm4Tables& next_t,
              int64_t j, const Nm4Tables& t, float* o) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const size_t at = static_cast<size_t>(j / 2);
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  if (next) {
    for (int r = 0; r < next_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(next->p[r] + at), _MM_HINT_T1);
    prefetch_tables<kMin, kNarrow>(next_t, j);
  }
  for (int p = 0; p < s.pairs; ++p) {
    const __m512i a = _mm512_loadu_si512(rows.p[2 * p] + at);
    const __m512i b = _mm512_loadu_si512(rows.p[2 * p + 1] + at);
    const __m512i f = _mm512_set1_epi16(s.pair_f[p]);
    // Interleaved first, masked after: the same bytes as masking each row (the masks and shifts
    // act within each byte of a 16-bit word), two instructions fewer.
    const __m512i lo = _mm512_unpacklo_epi8(a, b), hi = _mm512_unpackhi_epi8(a, b);
    acc[0] = _mm512_add_epi16(acc[0], _mm512_maddubs_epi16(_mm512_and_si512(lo, mask), f));
    acc[1] = _mm512_add_epi16(acc[1], _mm512_maddubs_epi16(_mm512_and_si512(hi, mask), f));
    acc[2] = _mm512_add_epi16(acc[2], _mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(lo, 4), mask), f));
    acc[3] = _mm512_add_epi16(acc[3], _mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(hi, 4), mask), f));
  }
  const __m512i off = _mm512_set1_epi16(static_cast<int16_t>(s.offset));
  const Nm4GroupFactors whole = nm4_group_factors<kMin, false>(t, j, s);  // fp16 tables: once (not reloaded)
  for (int k = 0; k < 4; ++k) {
    const __m512i a16 = kMin ? acc[k] : _mm512_sub_epi16(acc[k], off);
    const int64_t c = j + 32 * k;  // 32 outputs: one group
    const Nm4GroupFactors f = kNarrow ? nm4_group_factors<kMin, kNarrow>(t, c, s) : whole;
    scale16<kMin, kNarrow>(o + 32 * k, t, c, _mm512_cvtepi16_epi32(_mm512_castsi512_si256(a16)), f);
    scale16<kMin, kNarrow>(o + 32 * k + 16, t, c + 16, _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(a16, 1)), f);
  }
}

template <bool kMin, bool kNarrow>
void axpy(const TensorView& D, const Nm4Seg* segs, int64_t n_segs, int64_t col0, int64_t len, float* out) {
  for (int64_t g = 0; g < n_segs; ++g) {
    const Nm4Seg& s = segs[g];
    const Nm4Rows rows = nm4_rows(D, s);
    Nm4Rows next;
    Nm4Tables next_t;
    const bool ahead = g + kPrefetchSegments < n_segs;
    if (ahead) {
      next = nm4_rows(D, segs[g + kPrefetchSegments]);
      next_t = nm4_tables(D, segs[g + kPrefetchSegments].block);
    }
    const int next_rows = ahead ? 2 * segs[g + kPrefetchSegments].pairs : 0;  // the rows nm4_rows set
    const Nm4Tables t = nm4_tables(D, s.block);
    for (int64_t j = col0; j < col0 + len;) {
      const Nm4Chunk c = nm4_chunk_at(D.cols(), j);
      if (c.width == kNm4Chunk)
        chunk128<kMin, kNarrow>(s, rows, ahead ? &next : nullptr, next_rows, next_t, j, t, out + (j - col0));
      else
        nm4_chunk256<kMin, kNarrow>(D, s, rows, c, col0, out);  // a row's end: 64 and / or 32 outputs
      j += c.width;
    }
  }
}

}  // namespace

Nm4AxpyFn nm4_axpy_avx512(DType t) {
  if (t == DType::Q4_0_NM) return &axpy<false, false>;
  if (t == DType::Q4_1_NM) return &axpy<true, false>;
  if (t == DType::Q4_0_NM8) return &axpy<false, true>;
  if (t == DType::Q4_1_NM8) return &axpy<true, true>;
  return nullptr;
}

}  // namespace ember::cpu::detail
