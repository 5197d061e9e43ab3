// AVX-512 kernel of the neuron-major 4-bit axpy (ops/cpu/nm4.hpp). Per segment, 128 outputs (one
// 64-byte line of each row) at a time: pairs of rows' nibbles interleaved and multiplied by the
// pair's int8 factors with vpmaddubsw into four 16-bit accumulators (outputs in order, by the
// copy's layout), then widened and scaled into the output once. 18 instructions per 256 weights
// where widening codes to floats took 12 per 64 (the bytes are interleaved before the nibbles are
// masked, as in nm4_simd.hpp). Chunks narrower than 128 at a row's end take the 256-bit code
// (nm4_simd.hpp). The rows two segments on are prefetched on the way, a line of each per chunk,
// as in the other grouped sparse kernels (sparse_avx512.cpp), with their part of the scale
// table(s) (measured 0.93-0.96x the time, docs/benchmarks.md). Same operations per output as the
// scalar kernel, so the same bits.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "ops/cpu/nm4.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/nm4_simd.hpp"

constexpr int kPrefetchSegments = 2;  // measured best of 1-3 (bench_sparse, SparseAxpy/Q4_0_NM)

// out[0 .. 16) = fma(d * e, float(acc), Q4_1: fma(m, s, out)).
template <bool kMin>
inline void scale16(float* o, const uint16_t* d, const uint16_t* m, __m512i acc, __m512 e, __m512 s) {
  __m512 v = _mm512_loadu_ps(o);
  if constexpr (kMin) v = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m))), s, v);
  const __m512 de = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d))), e);
  _mm512_storeu_ps(o, _mm512_fmadd_ps(de, _mm512_cvtepi32_ps(acc), v));
}

template <bool kMin>
void chunk128(const TensorView& D, const Nm4Seg& s, const Nm4Rows& rows, const Nm4Rows* next, int next_rows,
              const uint16_t* next_d, size_t at, const uint16_t* d, const uint16_t* m, float* o) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  if (next) {
    for (int r = 0; r < next_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(next->p[r] + at), _MM_HINT_T1);
    for (int l = 0; l < kNm4Chunk * 2 / 64; ++l) {  // the chunk's part of the segment's scale table(s)
      _mm_prefetch(reinterpret_cast<const char*>(next_d) + 64 * l, _MM_HINT_T1);
      if constexpr (kMin) _mm_prefetch(reinterpret_cast<const char*>(next_d + D.cols()) + 64 * l, _MM_HINT_T1);
    }
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
  const __m512 e = _mm512_set1_ps(s.scale), sum = _mm512_set1_ps(s.sum);
  const __m512i off = _mm512_set1_epi16(static_cast<int16_t>(s.offset));
  for (int k = 0; k < 4; ++k) {
    const __m512i a16 = kMin ? acc[k] : _mm512_sub_epi16(acc[k], off);
    scale16<kMin>(o + 32 * k, d + 32 * k, m + 32 * k, _mm512_cvtepi16_epi32(_mm512_castsi512_si256(a16)), e, sum);
    scale16<kMin>(o + 32 * k + 16, d + 32 * k + 16, m + 32 * k + 16,
                  _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(a16, 1)), e, sum);
  }
}

template <bool kMin>
void axpy(const TensorView& D, const Nm4Seg* segs, int64_t n_segs, int64_t col0, int64_t len, float* out) {
  for (int64_t g = 0; g < n_segs; ++g) {
    const Nm4Seg& s = segs[g];
    const Nm4Rows rows = nm4_rows(D, s);
    Nm4Rows next;
    const bool ahead = g + kPrefetchSegments < n_segs;
    if (ahead) next = nm4_rows(D, segs[g + kPrefetchSegments]);
    const int next_rows = ahead ? 2 * segs[g + kPrefetchSegments].pairs : 0;  // the rows nm4_rows set
    const uint16_t* d = nm4_scales(D, s.block);
    const uint16_t* next_d = ahead ? nm4_scales(D, segs[g + kPrefetchSegments].block) : nullptr;
    for (int64_t j = col0; j < col0 + len;) {
      const Nm4Chunk c = nm4_chunk_at(D.cols(), j);
      if (c.width == kNm4Chunk)
        chunk128<kMin>(D, s, rows, ahead ? &next : nullptr, next_rows, ahead ? next_d + j : nullptr,
                       static_cast<size_t>(j / 2), d + j,
                       d + D.cols() + j, out + (j - col0));
      else
        nm4_chunk256<kMin>(D, s, rows, c, col0, out);  // a row's end: 64 and / or 32 outputs
      j += c.width;
    }
  }
}

}  // namespace

Nm4AxpyFn nm4_axpy_avx512(DType t) {
  if (t == DType::Q4_0_NM) return &axpy<false>;
  if (t == DType::Q4_1_NM) return &axpy<true>;
  return nullptr;
}

}  // namespace ember::cpu::detail
