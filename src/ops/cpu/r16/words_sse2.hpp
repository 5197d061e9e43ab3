// The 4-byte words of four rows' 16 bytes transposed, w[c] = word c of rows 0..3 in order: how the
// R16 layouts (r16/r16.hpp) interleave 16 rows 4 bytes at a time, for the repacking code
// (SSE2, every x86-64).
#pragma once
#include <emmintrin.h>

namespace ember::cpu::detail {

inline void transpose_words4(const __m128i x[4], __m128i w[4]) {
  const __m128i t0 = _mm_unpacklo_epi32(x[0], x[1]), t1 = _mm_unpacklo_epi32(x[2], x[3]);
  const __m128i t2 = _mm_unpackhi_epi32(x[0], x[1]), t3 = _mm_unpackhi_epi32(x[2], x[3]);
  w[0] = _mm_unpacklo_epi64(t0, t1);
  w[1] = _mm_unpackhi_epi64(t0, t1);
  w[2] = _mm_unpacklo_epi64(t2, t3);
  w[3] = _mm_unpackhi_epi64(t2, t3);
}

}  // namespace ember::cpu::detail
