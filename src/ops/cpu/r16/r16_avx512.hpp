// Shared parts of the AVX-512 kernels of the 16-row repacked types (r16/r16.hpp): the activation
// broadcast and the tile frame (one group of 16 rows against T tokens). For AVX-512 translation
// units only.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/cpu_features.hpp"
#include "ops/cpu/r16/r16_kernels.hpp"

namespace ember::cpu::detail {

// 4 activation bytes broadcast to every 32-bit lane (the lanes are the 16 rows).
inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Software prefetch of the weight stream, kR16PrefetchAhead bytes ahead of the reads (into L2),
// where it pays: on Intel Xeon (the 2026-11-24 box) the hardware prefetchers alone held a
// core's stream to about 12.5 GB/s with both cores reading, and decode of the 1.1B Q4_0 synth
// went 43.6 -> 53.4 tok/s with it (2.5 to 3.5 KB ahead measured alike, 4 KB and more a little
// slower); on AMD Zen 4 the K-quant kernels measured slower with software prefetches, so none.
constexpr size_t kR16PrefetchAhead = 3072;
inline bool r16_prefetch() {
  static const bool on = cpu_features().intel;
  return on;
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
  const bool prefetch = r16_prefetch();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = wg + b * kGroupBytes;
    if (prefetch)
      for (size_t o = 0; o < kGroupBytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + kR16PrefetchAhead + o), _MM_HINT_T1);
    block(p, x, b, acc);
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(a.y + (t0 + t) * a.y_stride + g * kR16Rows, acc[t]);
}

// Per 64-byte register: vpshufb indices that copy byte c of each 32-bit lane to its four bytes,
// and the bit of a lane's byte i that belongs to its low (high) nibble i.
struct QhTables {
  __m512i copy[4], low_bit, high_bit;
  QhTables() {
    alignas(64) uint8_t idx[4][64], lb[64], hb[64];
    for (int p = 0; p < 64; ++p) {
      for (int c = 0; c < 4; ++c) idx[c][p] = static_cast<uint8_t>(4 * ((p % 16) / 4) + c);
      lb[p] = static_cast<uint8_t>(1 << (p % 4));
      hb[p] = static_cast<uint8_t>(16 << (p % 4));
    }
    for (int c = 0; c < 4; ++c) copy[c] = _mm512_load_si512(idx[c]);
    low_bit = _mm512_load_si512(lb);
    high_bit = _mm512_load_si512(hb);
  }
};

// The tables, built once (take a reference outside the kernels' loops).
inline const QhTables& qh_tables() {
  static const QhTables qt;
  return qt;
}

// Q5_0_R16 / Q5_K_R16: adds 16 to the nibbles of chunk c whose fifth bit is set, from the
// 16 lanes' 4-byte qh words H (byte c of a lane: the bits of the chunk's low nibbles 0..3, of
// its high nibbles 4..7).
inline void add_fifth_bits(const QhTables& qt, __m512i H, int c, __m512i& lo, __m512i& hi) {
  const __m512i sixteen = _mm512_set1_epi8(16);
  const __m512i h = _mm512_shuffle_epi8(H, qt.copy[c]);
  lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(h, qt.low_bit), lo, sixteen);
  hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(h, qt.high_bit), hi, sixteen);
}

}  // namespace ember::cpu::detail
