// Shared parts of the AVX-512 kernels of the 16-row repacked types (r16/r16.hpp): the activation
// broadcast and the tile frame (one group of 16 rows against T tokens). For AVX-512 translation
// units only.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "ops/cpu/r16/r16_fetch.hpp"
#include "ops/cpu/r16/r16_kernels.hpp"

namespace ember::cpu::detail {

// 4 activation bytes broadcast to every 32-bit lane (the lanes are the 16 rows).
inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Group g of a.w against tokens t0 .. t0 + T - 1 (activation rows of type Act, one Act per
// block of kBlock elements): block(p, x, b, acc, fetch) adds block b (at p, kGroupBytes bytes per
// block) of the 16 rows into acc[t] (lane r: row 16 g + r) and prefetches the lines `fetch` names
// (the block's, kR16PrefetchAhead on: r16/r16_fetch.hpp); the sums are stored to a.y.
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
  const bool prefetch = r16_prefetch<T>() && t0 == 0;  // later tiles find the group in cache
  constexpr size_t kAll = kR16FetchBytes<kGroupBytes>;
  // A tile of several tokens computes a group for longer than the group takes to arrive: the
  // first tile fetches the next group's blocks as it goes (the call's first group also its own,
  // ahead), so the stream does not stall at each group's start (the Qwen3-MoE prompt, whose
  // experts see a few tokens each, 1.04-1.07x; the Mixtral shape's 1.07-1.10x; Zen 5). A single
  // token (decode) fetches its own stream ahead. The two loops keep the per-block test out of
  // the kernel's path (a short row's blocks felt it: Gemma-3-270M's prompt 0.98x).
  constexpr bool kStream = T > 1;
  const bool fetched = g > 0;
  const int64_t next = g + 1 < a.nrows / kR16Rows ? kR16Rows * a.w_stride : 0;
  if (kStream && prefetch) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = wg + b * kGroupBytes;
      block(p, x, b, acc, r16_fetch(!fetched, p, 0, kAll));
      if (next) R16Fetch{p + next, kAll}.all();
    }
  } else {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = wg + b * kGroupBytes;
      block(p, x, b, acc, r16_fetch(prefetch, p, 0, kAll));
    }
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(a.y + (t0 + t) * a.y_stride + g * kR16Rows, acc[t]);
}

// Q5_0_R16 / Q5_K_R16: adds 16 to the nibbles of chunk c whose fifth bit is set, from the 16
// lanes' 4-byte qh words H (bit r16_qh_bit(c, s) of each byte: its low (s = 0) or high nibble's).
inline void add_fifth_bits(__m512i H, int c, __m512i& lo, __m512i& hi) {
  const __m512i sixteen = _mm512_set1_epi8(16);
  lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(H, _mm512_set1_epi8(static_cast<char>(1 << r16_qh_bit(c, 0)))), lo, sixteen);
  hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(H, _mm512_set1_epi8(static_cast<char>(1 << r16_qh_bit(c, 1)))), hi, sixteen);
}

}  // namespace ember::cpu::detail
