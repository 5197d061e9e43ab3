// Shared parts of the AVX2 and AVX-VNNI kernels of the 16-row repacked types (r16/r16.hpp): the
// layouts are the AVX-512 ones, read as two 256-bit halves (rows 0..7 in the first 32 bytes of
// every 64-byte chunk, rows 8..15 in the second; a group's 16-entry tables likewise). The 8-bit dot
// products are vpmaddubsw then vpmaddwd on AVX2 and vpdpbusd where the translation unit is built
// for AVX-VNNI (*_avxvnni.cpp): the same exact integer sums either way, so the same float steps
// give the AVX-512 kernels' results bit for bit. Everything here is in an anonymous namespace:
// each translation unit keeps its own copy, compiled for its own target.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/cpu_features.hpp"
#include "ops/cpu/r16/r16_kernels.hpp"

namespace ember::cpu::detail {
namespace {

// 4 activation bytes broadcast to every 32-bit lane (the lanes are 8 of the rows).
inline __m256i bcast4_256(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// 32-bit lane sums of a vpmaddubsw result (pairs of 16-bit products added).
inline __m256i lane_sums(__m256i pairs) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); }

// The 16-bit pair sums of chunks c0 .. c0 + n - 1 of a block's nibbles: lo[c] (unsigned bytes)
// against activation bytes 4c .. 4c + 3 broadcast to every lane, hi[c] against 16 + 4c .. 16 + 4c + 3.
// The caller keeps n within int16: n x 2 x 2 x (largest weight) x 127 <= 32767.
inline __m256i pair_sums16(const __m256i* lo, const __m256i* hi, const int8_t* xq, int c0, int n) {
  __m256i s16 = _mm256_setzero_si256();
  for (int c = c0; c < c0 + n; ++c) {
    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[c], bcast4_256(xq + 4 * c)));
    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[c], bcast4_256(xq + 16 + 4 * c)));
  }
  return s16;
}

// acc plus the 32-bit lane dot products of all four chunks (as pair_sums16), kPerSum chunks to a
// 16-bit sum on AVX2; scaled_: times the lane's scale (sc: the scale, < 2^15; sc2: the same in
// both 16-bit halves of the lane, which vpmaddwd multiplies by while it widens).
template <int kPerSum, bool kScaled>
inline __m256i nibble_dots_impl(__m256i acc, const __m256i* lo, const __m256i* hi, const int8_t* xq,
                                [[maybe_unused]] __m256i sc, [[maybe_unused]] __m256i sc2) {
#ifdef __AVXVNNI__
  __m256i s = kScaled ? _mm256_setzero_si256() : acc;
  for (int c = 0; c < 4; ++c) {
    s = _mm256_dpbusd_avx_epi32(s, lo[c], bcast4_256(xq + 4 * c));
    s = _mm256_dpbusd_avx_epi32(s, hi[c], bcast4_256(xq + 16 + 4 * c));
  }
  return kScaled ? _mm256_add_epi32(acc, _mm256_mullo_epi32(s, sc)) : s;
#else
  for (int c0 = 0; c0 < 4; c0 += kPerSum) {
    const __m256i s16 = pair_sums16(lo, hi, xq, c0, kPerSum);
    acc = _mm256_add_epi32(acc, kScaled ? _mm256_madd_epi16(s16, sc2) : lane_sums(s16));
  }
  return acc;
#endif
}
template <int kPerSum>
inline __m256i nibble_dots(__m256i acc, const __m256i* lo, const __m256i* hi, const int8_t* xq) {
  return nibble_dots_impl<kPerSum, false>(acc, lo, hi, xq, _mm256_setzero_si256(), _mm256_setzero_si256());
}
template <int kPerSum>
inline __m256i scaled_nibble_dots(__m256i acc, const __m256i* lo, const __m256i* hi, const int8_t* xq, __m256i sc,
                                  __m256i sc2) {
  return nibble_dots_impl<kPerSum, true>(acc, lo, hi, xq, sc, sc2);
}

// Software prefetch as the AVX-512 kernels do it (r16_avx512.hpp): on Intel, 3 KB ahead.
constexpr size_t kR16PrefetchAhead256 = 3072;
inline bool r16_prefetch_avx2() {
  static const bool on = cpu_features().intel;
  return on;
}

// Group g of a.w against tokens t0 .. t0 + T - 1, as r16_tile (r16_avx512.hpp) with the 16 rows'
// sums in two registers a token: acc[t][h] holds rows 8h .. 8h + 7.
template <class Act, int64_t kBlock, size_t kGroupBytes, int T, class F>
inline void r16_tile_avx2(const GemmArgs& a, int64_t g, int64_t t0, const F& block) {
  const int64_t nb = a.k / kBlock;
  const uint8_t* wg = a.w + g * kR16Rows * a.w_stride;
  const Act* x[T];
  __m256 acc[T][2];
  for (int t = 0; t < T; ++t) {
    x[t] = reinterpret_cast<const Act*>(a.x + (t0 + t) * a.x_stride);
    acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  }
  const bool prefetch = r16_prefetch_avx2();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = wg + b * kGroupBytes;
    if (prefetch)
      for (size_t o = 0; o < kGroupBytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + kR16PrefetchAhead256 + o), _MM_HINT_T1);
    block(p, x, b, acc);
  }
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(a.y + (t0 + t) * a.y_stride + g * kR16Rows + 8 * h, acc[t][h]);
}

// 8 fp16 values (half h of a 16-entry table at p) as floats.
inline __m256 half_ph(const uint8_t* p, int h) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
}

// Q5_0_R16 / Q5_K_R16's fifth bits on 256 bits (add_fifth_bits of r16_avx512.hpp): the vpshufb
// indices that copy byte c of each 32-bit lane to its four bytes, and each byte's bit.
struct QhTables256 {
  __m256i copy[4], low_bit, high_bit;
  QhTables256() {
    alignas(32) uint8_t idx[4][32], lb[32], hb[32];
    for (int p = 0; p < 32; ++p) {
      for (int c = 0; c < 4; ++c) idx[c][p] = static_cast<uint8_t>(4 * ((p % 16) / 4) + c);
      lb[p] = static_cast<uint8_t>(1 << (p % 4));
      hb[p] = static_cast<uint8_t>(16 << (p % 4));
    }
    for (int c = 0; c < 4; ++c) copy[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(idx[c]));
    low_bit = _mm256_load_si256(reinterpret_cast<const __m256i*>(lb));
    high_bit = _mm256_load_si256(reinterpret_cast<const __m256i*>(hb));
  }
};
inline const QhTables256& qh_tables256() {
  static const QhTables256 qt;
  return qt;
}
// Adds 16 to the nibbles of chunk c whose fifth bit is set (H: 8 lanes' 4-byte qh words).
inline void add_fifth_bits256(const QhTables256& qt, __m256i H, int c, __m256i& lo, __m256i& hi) {
  const __m256i sixteen = _mm256_set1_epi8(16);
  const __m256i h = _mm256_shuffle_epi8(H, qt.copy[c]);
  lo = _mm256_add_epi8(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, qt.low_bit), qt.low_bit), sixteen));
  hi = _mm256_add_epi8(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, qt.high_bit), qt.high_bit), sixteen));
}

}  // namespace
}  // namespace ember::cpu::detail
