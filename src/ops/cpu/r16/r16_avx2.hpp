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

#include "ops/cpu/r16/r16_fetch.hpp"
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

#ifdef __AVXVNNI__
constexpr bool kDots32 = true;  // chunk_dots' sums are 32-bit: no flush, no widening
#else
constexpr bool kDots32 = false;
#endif
// s plus the 32-bit lane dot products of w (unsigned bytes, any size) with activation bytes xq ..
// xq + 3 broadcast: vpdpbusd, so AVX-VNNI kernels only (vpmaddubsw would saturate on weights past
// 15); a call reached in an AVX2 build fails to compile.
template <bool kVnni = kDots32>
inline __m256i dots32([[maybe_unused]] __m256i s, [[maybe_unused]] __m256i w, [[maybe_unused]] const int8_t* xq) {
  static_assert(kVnni, "dots32 is vpdpbusd: for kernels built for AVX-VNNI");
#ifdef __AVXVNNI__
  return _mm256_dpbusd_avx_epi32(s, w, bcast4_256(xq));
#else
  return s;
#endif
}
// One chunk c of a block's nibbles: lo (unsigned bytes) against activation bytes 4c .. 4c + 3
// broadcast to every lane, hi against 16 + 4c .. 16 + 4c + 3, added to s: on AVX2 as 16-bit
// vpmaddubsw pair sums (the caller keeps the chunks summed into one s within int16: n x 2 x 2 x
// (largest weight) x 127 <= 32767), on AVX-VNNI as 32-bit lane sums (dots32). kVnni: which of
// the two (an AVX-VNNI kernel may take the AVX2 arithmetic where that is faster).
template <bool kVnni = kDots32>
inline __m256i chunk_dots(__m256i s, __m256i lo, __m256i hi, const int8_t* xq, int c) {
  if constexpr (kVnni) return dots32(dots32(s, lo, xq + 4 * c), hi, xq + 16 + 4 * c);
  s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo, bcast4_256(xq + 4 * c)));
  return _mm256_add_epi16(s, _mm256_maddubs_epi16(hi, bcast4_256(xq + 16 + 4 * c)));
}
// chunk_dots' sums s as 32-bit lane sums times the lane's scale (sc: the scale, < 2^15; sc2: the
// same in both 16-bit halves of the lane, which vpmaddwd multiplies by while it widens).
template <bool kVnni = kDots32>
inline __m256i scaled_lane_sums([[maybe_unused]] __m256i s, [[maybe_unused]] __m256i sc, [[maybe_unused]] __m256i sc2) {
  if constexpr (kVnni) return _mm256_mullo_epi32(s, sc);
  else return _mm256_madd_epi16(s, sc2);
}

// acc plus the 32-bit lane dot products of all four chunks (chunk_dots), kPerSum chunks to a
// 16-bit sum on AVX2.
template <int kPerSum>
inline __m256i nibble_dots(__m256i acc, const __m256i* lo, const __m256i* hi, const int8_t* xq) {
  if constexpr (kDots32) {
    for (int c = 0; c < 4; ++c) acc = chunk_dots(acc, lo[c], hi[c], xq, c);
  } else {
    for (int c0 = 0; c0 < 4; c0 += kPerSum) {
      __m256i s = _mm256_setzero_si256();
      for (int c = c0; c < c0 + kPerSum; ++c) s = chunk_dots(s, lo[c], hi[c], xq, c);
      acc = _mm256_add_epi32(acc, lane_sums(s));
    }
  }
  return acc;
}

// acc plus the four chunks' lane dot products times the lane's scale (scaled_lane_sums), kPerSum
// chunks to a 16-bit sum on AVX2.
template <int kPerSum, bool kVnni = kDots32>
inline __m256i scaled_nibble_dots(__m256i acc, const __m256i* lo, const __m256i* hi, const int8_t* xq, __m256i sc,
                                  __m256i sc2) {
  constexpr int kStep = kVnni ? 4 : kPerSum;
  for (int c0 = 0; c0 < 4; c0 += kStep) {
    __m256i s = _mm256_setzero_si256();
    for (int c = c0; c < c0 + kStep; ++c) s = chunk_dots<kVnni>(s, lo[c], hi[c], xq, c);
    acc = _mm256_add_epi32(acc, scaled_lane_sums<kVnni>(s, sc, sc2));
  }
  return acc;
}

// Group g of a.w against tokens t0 .. t0 + T - 1, as r16_tile (r16_avx512.hpp), by 8-row halves:
// block(p, x, b, h, acc, fetch) adds block b of rows 8h .. 8h + 7 to acc[t] and prefetches the
// lines `fetch` names. A tile of several tokens runs the halves in turn, so its sums take T
// registers, not 2T, which is what lets four tokens' working values fit AVX2's 16 registers (the
// second half reads the group's blocks again, from cache: prompts 1.15x); its passes fetch the
// next group's blocks. One token (decode, bound by memory) runs both halves of each block, so the
// group's bytes stream past once (halves in turn cost decode 13 %), each half fetching half the
// block's lines ahead.
template <class Act, int64_t kBlock, size_t kGroupBytes, int T, class F>
inline void r16_tile_avx2(const GemmArgs& a, int64_t g, int64_t t0, const F& block) {
  constexpr size_t kAll = kR16FetchBytes<kGroupBytes>, kHalf = kR16FetchHalf<kGroupBytes>;
  const int64_t nb = a.k / kBlock;
  const uint8_t* wg = a.w + g * kR16Rows * a.w_stride;
  const Act* x[T];
  for (int t = 0; t < T; ++t) x[t] = reinterpret_cast<const Act*>(a.x + (t0 + t) * a.x_stride);
  const bool prefetch = r16_prefetch<T>() && t0 == 0;  // later tiles find the group in cache
  const auto store = [&](int h, const __m256* acc) {
    for (int t = 0; t < T; ++t) _mm256_storeu_ps(a.y + (t0 + t) * a.y_stride + g * kR16Rows + 8 * h, acc[t]);
  };
  if constexpr (T == 1) {
    __m256 lo[1] = {_mm256_setzero_ps()}, hi[1] = {_mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = wg + b * kGroupBytes;
      block(p, x, b, 0, lo, r16_fetch(prefetch, p, 0, kHalf));
      block(p, x, b, 1, hi, r16_fetch(prefetch, p, kHalf, kAll));
    }
    store(0, lo);
    store(1, hi);
  } else {
    // The weights stream through memory as the groups follow each other: the group after this
    // one is fetched while both passes over this one compute (half of each block a pass), so the
    // memory is busy through the second pass too; a call's first group fetches its own blocks
    // ahead in its first pass, and the whole of the next in its second. (A mixture's experts,
    // a few tokens each, run at the pace of this stream: the Qwen3-MoE prompt 1.02-1.05x.)
    const bool fetched = g > 0;
    const int64_t next = g + 1 < a.nrows / kR16Rows ? kR16Rows * a.w_stride : 0;
    for (int h = 0; h < 2; ++h) {
      __m256 acc[T];
      for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = wg + b * kGroupBytes;
        R16Fetch f;
        if (prefetch && h == 0 && !fetched) f = r16_fetch(true, p, 0, kAll);
        else if (prefetch && next && !fetched) f = R16Fetch{p + next, kAll};
        else if (prefetch && next) f = h == 0 ? R16Fetch{p + next, kHalf} : R16Fetch{p + next + kHalf, kAll - kHalf};
        block(p, x, b, h, acc, f);
      }
      store(h, acc);
    }
  }
}

// 8 fp16 values (half h of a 16-entry table at p) as floats.
inline __m256 half_ph(const uint8_t* p, int h) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
}

// Q5_0_R16 / Q5_K_R16's fifth bits on 256 bits: adds 16 to the nibbles of chunk c whose fifth
// bit is set (H: 8 lanes' 4-byte qh words; bit r16_qh_bit(c, s) of each byte, shifted to bit 4:
// 16-bit shifts, whose bits carried in from the neighbouring byte the mask drops).
template <int kBit>
inline __m256i fifth_bit_at_4(__m256i H) {
  const __m256i b4 = _mm256_set1_epi8(16);
  if constexpr (kBit < 4) return _mm256_and_si256(_mm256_slli_epi16(H, 4 - kBit), b4);
  else if constexpr (kBit > 4) return _mm256_and_si256(_mm256_srli_epi16(H, kBit - 4), b4);
  else return _mm256_and_si256(H, b4);
}
template <int c>
inline void add_fifth_bits256(__m256i H, __m256i& lo, __m256i& hi) {
  lo = _mm256_or_si256(lo, fifth_bit_at_4<r16_qh_bit(c, 0)>(H));
  hi = _mm256_or_si256(hi, fifth_bit_at_4<r16_qh_bit(c, 1)>(H));
}
// The same for a chunk index known at run time (the kernels' loops over c are unrolled).
inline void add_fifth_bits256(__m256i H, int c, __m256i& lo, __m256i& hi) {
  switch (c) {
    case 0: add_fifth_bits256<0>(H, lo, hi); break;
    case 1: add_fifth_bits256<1>(H, lo, hi); break;
    case 2: add_fifth_bits256<2>(H, lo, hi); break;
    default: add_fifth_bits256<3>(H, lo, hi); break;
  }
}

}  // namespace
}  // namespace ember::cpu::detail
