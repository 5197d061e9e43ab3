// AVX-512 kernel of the neuron-major 4-bit axpy (ops/cpu/nm4/nm4.hpp). Per segment, 128 outputs (one
// 64-byte line of each row) at a time: fours of rows' bytes interleaved so that each 32-bit lane
// holds one output's four codes, multiplied by the four's int8 factors and summed with vpdpbusd
// into eight 32-bit accumulators (outputs in order, by the copy's layout), then scaled into the
// output once. 28 instructions per 512 weights, where pairs of rows with vpmaddubsw into 16-bit
// sums took 32 and widened the sums before scaling them (in cache, one thread: 0.93-0.95x the
// time at 25-50 % of the rows kept, 0.88x at all; bench_sparse, docs/benchmarks.md). Chunks
// narrower than 128 at a row's end take the 256-bit code, and the segment loop with its prefetches is
// every level's (nm4/nm4_simd.hpp). fp16 or narrow (8-bit) tables: a template parameter. Same operations per
// output as the scalar kernel, so the same bits.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "ops/cpu/nm4/nm4.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/simd_f32.hpp"
#include "ops/cpu/nm4/nm4_simd.hpp"

// a_k += vpdpbusd(u_k, f) for eight accumulators, in place. (GCC 12 copies the intrinsic's
// accumulators through other registers every iteration of the loop: 16 zmm moves per four rows with
// _mm512_dpbusd_epi32, and still 4 with one asm statement per accumulator.)
inline void dpbusd8(__m512i& a0, __m512i& a1, __m512i& a2, __m512i& a3, __m512i& a4, __m512i& a5, __m512i& a6,
                    __m512i& a7, __m512i u0, __m512i u1, __m512i u2, __m512i u3, __m512i u4, __m512i u5, __m512i u6,
                    __m512i u7, __m512i f) {
  asm("vpdpbusd %16, %8, %0\n\tvpdpbusd %16, %9, %1\n\tvpdpbusd %16, %10, %2\n\tvpdpbusd %16, %11, %3\n\t"
      "vpdpbusd %16, %12, %4\n\tvpdpbusd %16, %13, %5\n\tvpdpbusd %16, %14, %6\n\tvpdpbusd %16, %15, %7"
      : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7)
      : "v"(u0), "v"(u1), "v"(u2), "v"(u3), "v"(u4), "v"(u5), "v"(u6), "v"(u7), "v"(f));
}

// Segment s over the 128 outputs from j (o: their output).
template <bool kMin, bool kNarrow>
void chunk128(const Nm4Seg& s, const Nm4Rows& rows, int64_t j, const Nm4Tables& t, float* o,
              const Nm4SliceFactors& sf) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const size_t at = static_cast<size_t>(j / 2);
  const __m512i init = _mm512_set1_epi32(kMin ? 0 : -s.offset);  // Q4_0: the sums start at - 8 x sum(hq)
  __m512i a0 = init, a1 = init, a2 = init, a3 = init, a4 = init, a5 = init, a6 = init, a7 = init;
  for (int q = 0; q < s.quads; ++q) {
    const __m512i a = _mm512_loadu_si512(rows.p[4 * q] + at), b = _mm512_loadu_si512(rows.p[4 * q + 1] + at);
    const __m512i c = _mm512_loadu_si512(rows.p[4 * q + 2] + at), d = _mm512_loadu_si512(rows.p[4 * q + 3] + at);
    const __m512i f = _mm512_set1_epi32(s.quad_f[q]);
    // Interleaved first, masked after: the same bytes as masking each row (the masks and shifts
    // act within each byte of a 16-bit word), in fewer instructions.
    const __m512i xl = _mm512_unpacklo_epi8(a, b), xh = _mm512_unpackhi_epi8(a, b);
    const __m512i yl = _mm512_unpacklo_epi8(c, d), yh = _mm512_unpackhi_epi8(c, d);
    // z m: outputs 16 m + [0, 16) (low nibbles: accumulator m), + 64 (high: accumulator 4 + m)
    const __m512i z0 = _mm512_unpacklo_epi16(xl, yl), z1 = _mm512_unpackhi_epi16(xl, yl);
    const __m512i z2 = _mm512_unpacklo_epi16(xh, yh), z3 = _mm512_unpackhi_epi16(xh, yh);
    const __m512i u0 = _mm512_and_si512(z0, mask), u1 = _mm512_and_si512(z1, mask);
    const __m512i u2 = _mm512_and_si512(z2, mask), u3 = _mm512_and_si512(z3, mask);
    const __m512i u4 = _mm512_and_si512(_mm512_srli_epi16(z0, 4), mask);
    const __m512i u5 = _mm512_and_si512(_mm512_srli_epi16(z1, 4), mask);
    const __m512i u6 = _mm512_and_si512(_mm512_srli_epi16(z2, 4), mask);
    const __m512i u7 = _mm512_and_si512(_mm512_srli_epi16(z3, 4), mask);
    dpbusd8(a0, a1, a2, a3, a4, a5, a6, a7, u0, u1, u2, u3, u4, u5, u6, u7, f);
  }
  const __m512i acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
  for (int g = 0; g < 4; ++g) {  // accumulator k holds outputs 16 k (k / 4 * 64 + k % 4 * 16)
    const int64_t c = j + 32 * g;  // a group of 32 outputs: accumulators 2 g and 2 g + 1
    const Nm4GroupFactors f = sf.at<kMin, kNarrow>(c);
    nm4_scale<__m512, kMin, kNarrow>(o + 32 * g, t, c, acc[2 * g], f);
    nm4_scale<__m512, kMin, kNarrow>(o + 32 * g + 16, t, c + 16, acc[2 * g + 1], f);
  }
}

template <bool kMin, bool kNarrow>
void axpy(const TensorView& D, const Nm4Seg* segs, int64_t n_segs, int64_t col0, int64_t len, float* out) {
  nm4_axpy_segments<kMin, kNarrow>(
      D, segs, n_segs, col0, len, out,
      [](const Nm4Seg& s, const Nm4Rows& rows, const Nm4Tables& t, Nm4Chunk c, float* o, const Nm4SliceFactors& sf) {
        if (c.width == kNm4Chunk)
          chunk128<kMin, kNarrow>(s, rows, c.start, t, o, sf);
        else
          nm4_chunk256<kMin, kNarrow>(s, rows, t, c, o, sf);  // a row's end: 64 and / or 32 outputs
      });
}

}  // namespace

void add_nm4_axpy_avx512(KernelTable<Nm4AxpyFn>& t) {
  add_nm4_axpys(t, SimdLevel::avx512, {&axpy<false, false>, &axpy<true, false>, &axpy<false, true>, &axpy<true, true>});
}

}  // namespace ember::cpu::detail
