// Shared parts of the AVX-512 kernels of the 16-row repacked types (r16.hpp): the activation
// broadcast and the tile frame (one group of 16 rows against T tokens). For AVX-512 translation
// units only.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "ops/cpu/r16_kernels.hpp"

namespace ember::cpu::detail {

// 4 activation bytes broadcast to every 32-bit lane (the lanes are the 16 rows).
inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Group g of a.w against tokens t0 .. t0 + T - 1 (activation rows of type Act, one Act per
// block of kBlock elements): block(p, x, b, acc) adds block b (at p, kGroupBytes bytes per
// block) of the 16 rows into acc[t] (lane r: row 16 g + r); the sums are stored to a.y.
template <class Act, int64_t kBlock, size_t kGroupBytes, int T, class F>
inline void r16_tile(const GemmArgs& a, int64_t g, int64_t t0, const F& block) {
  const int64_t nb = a.k / kBlock;
  const uint8_t* wg = a.w + g * kR16Rows * a.w_stride;
  const Act* x[T];
  __m512 acc[T];
  for (int t = 0; t < T; ++t) {
    x[t] = reinterpret_cast<const Act*>(a.x + (t0 + t) * a.x_stride);
    acc[t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) block(wg + b * kGroupBytes, x, b, acc);
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(a.y + (t0 + t) * a.y_stride + g * kR16Rows, acc[t]);
}

}  // namespace ember::cpu::detail
