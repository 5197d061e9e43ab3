// AVX-512 kernels on 512-bit vectors for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K x Q8_K) and
// Q5_0 / Q5_1 (x Q8_0 / Q8_1).
//
// A K-quant super-block (256 elements) is four 64-element steps. Each step decodes 64 unsigned
// weights (0..3 up to 0..63) into one register ordered like the Q8_K activations, so one
// activation load serves the step: vpmaddubsw gives int16 pair sums (small enough not to
// saturate) and vpdpwssd multiplies them by the 16-bit sub-block scales, spread so that each
// 32-bit lane meets the scale of its sub-block, and accumulates. Mins (Q2_K, Q4_K, Q5_K) and the
// offsets (Q3_K, Q6_K) are taken off once per super-block from the Q8_K group sums (bsums):
// one vpmaddwd of the bsums with the mins or scales, instead of one product per step and token.
// Every output element is computed with the same operations whatever tile it falls in.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <array>
#include <cstring>
#include <type_traits>

#include "ops/cpu/gemm/gemm_table.hpp"
#include "ops/cpu/gemm/quad_avx512.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/gemm/tile_driver.hpp"
#include "ops/cpu/gemm/gemm_q5_kquant_simd.hpp"

// Weight bytes a Q5_0 / Q5_1 decode stream prefetches ahead of its reads. The K-quant kernels
// issue no software prefetch: on Zen 4 with both cores streaming, one per super-block (1, 2 or
// 4 KB ahead) cut Q6_K decode from ~31 to ~26 tok/s on the 1.1B synth (the hardware prefetcher
// follows one sequential stream per thread better on its own); see docs/benchmarks.md.
constexpr int kPrefetchAhead = 1024;

// pshufb controls, one 64-byte row per step c of a Q4_K / Q5_K super-block: every 16-bit word
// of 128-bit lanes 0, 1 <- byte 2c (zero-extended), of lanes 2, 3 <- byte 2c + 1. Applied to the
// eight 6-bit scales broadcast to every lane, they give the vpdpwssd multipliers of the step.
alignas(64) constexpr auto kK45ScaleCtl = [] {
  std::array<uint8_t, 256> c{};
  for (int s = 0; s < 4; ++s)
    for (int i = 0; i < 64; ++i) c[64 * s + i] = i % 2 ? 0x80 : static_cast<uint8_t>(2 * s + (i >= 32));
  return c;
}();
// pshufb control: words 2j, 2j + 1 <- byte 8 + j (the min of sub-block j), lane by lane (lane 1
// holds j = 4..7), to pair the mins with the 16 bsums.
alignas(32) constexpr auto kK45MinCtl = [] {
  std::array<uint8_t, 32> c{};
  for (int i = 0; i < 32; ++i) c[i] = i % 2 ? 0x80 : static_cast<uint8_t>(8 + i / 4);
  return c;
}();
// vpermw indices, one row per step i of a Q6_K super-block: word w <- scale 4i + w / 8 (one per
// 16 elements, 8 pair sums).
alignas(64) constexpr auto kQ6ScaleIdx = [] {
  std::array<int16_t, 128> idx{};
  for (int i = 0; i < 4; ++i)
    for (int w = 0; w < 32; ++w) idx[32 * i + w] = static_cast<int16_t>(4 * i + w / 8);
  return idx;
}();

// The 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a Q4_K / Q5_K super-block, unpacked from
// their 12-byte 6-bit packing (see kquant_scale_min) four at a time in 32-bit lanes: with a0, a1,
// a2 the three words, sc[0..3] = a0 & 0x3f, sc[4..7] = a2 & 0x0f | (a0 >> 2) & 0x30, m[0..3] =
// a1 & 0x3f, m[4..7] = (a2 >> 4) & 0x0f | (a1 >> 2) & 0x30 (byte-wise masks). The 16-byte load
// stays inside the block (qs follows the scales).
inline __m128i k45_scales_mins(const uint8_t* s) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i lo = _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_set_epi32(4, 0, 0, 0));
  const __m128i hi = _mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), 2);
  const __m128i lo_mask = _mm_set_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f);
  const __m128i hi_mask = _mm_set_epi32(0x30303030, 0, 0x30303030, 0);
  return _mm_or_si128(_mm_and_si128(lo, lo_mask), _mm_and_si128(hi, hi_mask));
}

inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

template <class WB, int R, int T>
using KTile = TileOperands<WB, BlockQ8_K, 16, R, T>;

// ---- Q5_0 / Q5_1 ------------------------------------------------------------------------
// Steps of four blocks against activations in the quad layout (gemm/gemm_kernels.hpp), as the Q4_0 / Q4_1
// kernels do: two overlapping 64-byte loads hold the four blocks (88 or 96 bytes); vpermt2w
// gathers their 64 quant bytes (128-bit lane i <- block i), their fp16 scales (and mins), and
// their qh words, whose low / high halves become the byte masks that add bit 4 (16) to elements
// 0..15 / 16..31. Q5_0's offset of 16 sits in the quad's c (-16 * sums), Q5_1's min is m * s.

template <DType WT>
struct Q5QuadKernel {
  static constexpr bool kHasMin = WT == DType::Q5_1;
  static constexpr int kRows = 4, kTokens = kHasMin ? 3 : 4;
  static constexpr int kDecodeRows = 1;  // one sequential weight stream per thread
  static constexpr int kBlockBytes = kHasMin ? 24 : 22;
  static constexpr int kQhOffset = kHasMin ? 4 : 2;
  static constexpr int kQsOffset = kQhOffset + 4;
  static constexpr int kSecond = 4 * kBlockBytes - 64;  // offset of the second load

  // Index of the 16-bit word at byte offset `byte` of the four blocks in vpermt2w terms: from
  // the first load (< 32) or the second (32 + its word there). Every field starts at an even byte.
  static constexpr int16_t word(int byte) {
    return static_cast<int16_t>(byte + 1 < 64 ? byte / 2 : 32 + (byte - kSecond) / 2);
  }
  static __m512i qs_index() {  // word 8i + w <- word w of block i's qs
    alignas(64) int16_t idx[32];
    for (int j = 0; j < 32; ++j) idx[j] = word(kBlockBytes * (j / 8) + kQsOffset + 2 * (j % 8));
    return _mm512_load_si512(idx);
  }
  // Words 0..15 <- d of block j / 4; 16..31 <- m of block (j - 16) / 4 (Q5_1).
  static __m512i scale_index() {
    alignas(64) int16_t idx[32];
    for (int j = 0; j < 32; ++j) idx[j] = word(kBlockBytes * ((j % 16) / 4) + (j >= 16 && kHasMin ? 2 : 0));
    return _mm512_load_si512(idx);
  }
  // Words 0..3 <- low qh word of blocks 0..3, words 4..7 <- their high qh words.
  static __m512i qh_index() {
    alignas(64) int16_t idx[32] = {};
    for (int j = 0; j < 8; ++j) idx[j] = word(kBlockBytes * (j % 4) + kQhOffset + (j >= 4 ? 2 : 0));
    return _mm512_load_si512(idx);
  }

  struct Indices {
    __m512i qs, sc, qh;
  };

  template <int R, int T, bool kTail>
  static inline void step(const uint8_t* const* w, const uint8_t* const* x, int64_t q, int nvalid, __m512 (&acc)[R][T],
                          const Indices& ix) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), k16 = _mm512_set1_epi8(0x10);
    __m512i lo[R], hi[R];
    __m512 dw[R];
    [[maybe_unused]] __m512 mw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w[r] + q * 4 * kBlockBytes;
      __m512i a, b;
      if constexpr (kTail) {
        // Bytes of blocks past the row end read as zero (and their activations are zero).
        const int n = nvalid * kBlockBytes;
        a = _mm512_maskz_loadu_epi8(n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1, p);
        b = _mm512_maskz_loadu_epi8(n > kSecond ? (__mmask64{1} << (n - kSecond)) - 1 : 0, p + kSecond);
      } else {
        _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchAhead, _MM_HINT_T0);
        a = _mm512_loadu_si512(p);
        b = _mm512_loadu_si512(p + kSecond);
      }
      const __m512i qs = _mm512_permutex2var_epi16(a, ix.qs, b);
      const __m128i qh = _mm512_castsi512_si128(_mm512_permutex2var_epi16(a, ix.qh, b));
      const auto mlo = static_cast<__mmask64>(_mm_cvtsi128_si64(qh));
      const auto mhi = static_cast<__mmask64>(_mm_extract_epi64(qh, 1));
      lo[r] = _mm512_and_si512(qs, m4);
      hi[r] = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
      lo[r] = _mm512_mask_add_epi8(lo[r], mlo, lo[r], k16);
      hi[r] = _mm512_mask_add_epi8(hi[r], mhi, hi[r], k16);
      const __m512i sc = _mm512_permutex2var_epi16(a, ix.sc, b);
      dw[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
      if constexpr (kHasMin) mw[r] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sc, 1));
    }
    quad_dot_tokens<R, T, kHasMin>(x, q, lo, hi, dw, mw, acc);
  }

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    const int64_t nb = a.k / kQK, nfull = nb / 4;
    TileOperands<uint8_t, uint8_t, 16, R, T> tl(a, r0, t0);
    const Indices ix{qs_index(), scale_index(), qh_index()};
    for (int64_t q = 0; q < nfull; ++q) step<R, T, false>(tl.w, tl.x, q, 4, tl.acc, ix);
    if (nb % 4) step<R, T, true>(tl.w, tl.x, nfull, static_cast<int>(nb % 4), tl.acc, ix);
    tl.store(a, r0, t0);
  }
};

// ---- Q4_K / Q5_K ------------------------------------------------------------------------

template <DType WT>
struct K45Kernel512 {
  static constexpr int kRows = 2, kTokens = 4;
  static constexpr int kDecodeRows = 1;  // one sequential weight stream per thread
  static constexpr bool kQ5 = WT == DType::Q5_K;
  using WB = std::conditional_t<kQ5, BlockQ5_K, BlockQ4_K>;

  // Weights of steps 2h and 2h + 1 (elements 128h .. 128h + 127) as unsigned bytes in the
  // activation order: 32 bytes of qs hold sub-block 2c in the low and 2c + 1 in the high nibbles.
  static void decode(const WB& blk, int h, [[maybe_unused]] __m512i qh2, __m512i& y0, __m512i& y1) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i raw = load64(blk.qs + 64 * h);
    const __m512i sh = _mm512_srli_epi16(raw, 4);
    y0 = _mm512_and_si512(_mm512_shuffle_i64x2(raw, sh, 0x44), m4);  // [c0 lo, c0 hi]
    y1 = _mm512_and_si512(_mm512_shuffle_i64x2(raw, sh, 0xEE), m4);  // [c1 lo, c1 hi]
    if constexpr (kQ5) {
      // qh2 = [qh, qh >> 1]: bit 2c of its bytes is bit 4 of step c's weights.
      const __m512i m10 = _mm512_set1_epi8(0x10);
      if (h == 0) {
        y0 = _mm512_or_si512(y0, _mm512_and_si512(_mm512_slli_epi16(qh2, 4), m10));
        y1 = _mm512_or_si512(y1, _mm512_and_si512(_mm512_slli_epi16(qh2, 2), m10));
      } else {
        y0 = _mm512_or_si512(y0, _mm512_and_si512(qh2, m10));
        y1 = _mm512_or_si512(y1, _mm512_and_si512(_mm512_srli_epi16(qh2, 2), m10));
      }
    }
  }

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    const int64_t nb = a.k / kQK_K;
    KTile<WB, R, T> tl(a, r0, t0);
    auto& [w, x, acc] = tl;
    const __m256i min_ctl = _mm256_load_si256(reinterpret_cast<const __m256i*>(kK45MinCtl.data()));
    for (int64_t b = 0; b < nb; ++b) {
      __m512i sm[R];  // scales and mins broadcast to every 128-bit lane
      __m256i mdup[R];
      __m128 dd[R];  // [d, dmin]
      [[maybe_unused]] __m512i qh2[R];
      for (int r = 0; r < R; ++r) {
        const WB& blk = w[r][b];
        const __m128i s = k45_scales_mins(blk.scales);
        sm[r] = _mm512_broadcast_i32x4(s);
        mdup[r] = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(s), min_ctl);
        uint32_t dbits;
        std::memcpy(&dbits, &blk.d, 4);  // d, dmin adjacent
        dd[r] = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dbits)));
        if constexpr (kQ5) {
          const __m256i qh = load32(blk.qh);
          qh2[r] = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 1), 1);
        }
      }
      __m512i isum[R][T];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) isum[r][t] = _mm512_setzero_si512();
      for (int h = 0; h < 2; ++h) {
        __m512i y[R][2];
        for (int r = 0; r < R; ++r) decode(w[r][b], h, qh2[r], y[r][0], y[r][1]);
        for (int cc = 0; cc < 2; ++cc) {
          const int c = 2 * h + cc;
          const __m512i ctl = _mm512_load_si512(kK45ScaleCtl.data() + 64 * c);
          __m512i sc[R];
          for (int r = 0; r < R; ++r) sc[r] = _mm512_shuffle_epi8(sm[r], ctl);
          for (int t = 0; t < T; ++t) {
            const __m512i xa = load64(x[t][b].qs + 64 * c);
            for (int r = 0; r < R; ++r)
              isum[r][t] = _mm512_dpwssd_epi32(isum[r][t], _mm512_maddubs_epi16(y[r][cc], xa), sc[r]);
          }
        }
      }
      for (int t = 0; t < T; ++t) {
        const __m256i bsums = load32(x[t][b].bsums);
        const __m128 xd = _mm_set1_ps(x[t][b].d);
        for (int r = 0; r < R; ++r) {
          const __m128 f = _mm_mul_ps(dd[r], xd);  // [d * xd, dmin * xd]
          const __m512 fd = _mm512_broadcastss_ps(f);
          const __m512 fm = _mm512_broadcastss_ps(_mm_movehdup_ps(f));
          const __m256i msum = _mm256_madd_epi16(bsums, mdup[r]);
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][t]), fd, acc[r][t]);
          acc[r][t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(msum)), fm, acc[r][t]);
        }
      }
    }
    tl.store(a, r0, t0);
  }
};

// ---- Q2_K, Q3_K, Q6_K: 16 sub-blocks of 16 ----------------------------------------------
// Weights enter unsigned: Q6_K q + 32 (0..63), Q3_K q + 4 (0..7), Q2_K q (0..3). The offsets of
// Q6_K and Q3_K come off per super-block as kOffset * sum_g scale_g * bsum_g, Q2_K's mins as
// dmin * sum_g m_g * bsum_g (the 16 scales and the 16 bsums cover the same groups of 16).

template <DType WT>
struct G16Kernel512 {
  static constexpr int kRows = 2, kTokens = 4;
  static constexpr int kDecodeRows = 1;
  using WB = std::conditional_t<WT == DType::Q6_K, BlockQ6_K, std::conditional_t<WT == DType::Q3_K, BlockQ3_K, BlockQ2_K>>;
  static constexpr bool kMins = WT == DType::Q2_K;
  static constexpr int kOffsetShift = WT == DType::Q6_K ? 5 : 2;  // log2 of the offset (Q6_K, Q3_K)

  struct Prep {
    __m256i s16;  // 16 scales as int16
    [[maybe_unused]] __m256i m16;  // Q2_K: 16 mins as int16
    [[maybe_unused]] __m512i h2;   // Q3_K: [hmask, hmask >> 1]
    __m128 dd;    // [d, dmin]
  };

  static Prep prepare(const WB& blk) {
    Prep p;
    if constexpr (WT == DType::Q6_K) {
      p.s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales)));
      p.dd = _mm_set_ss(_cvtsh_ss(blk.d));
    } else if constexpr (WT == DType::Q3_K) {
      p.s16 = _mm256_cvtepi8_epi16(q3_k_scales(blk.scales));
      const __m256i hm = load32(blk.hmask);
      p.h2 = _mm512_inserti64x4(_mm512_castsi256_si512(hm), _mm256_srli_epi16(hm, 1), 1);
      p.dd = _mm_set_ss(_cvtsh_ss(blk.d));
    } else {
      const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales));
      const __m128i m4 = _mm_set1_epi8(0x0F);
      p.s16 = _mm256_cvtepu8_epi16(_mm_and_si128(sm, m4));
      p.m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4));
      uint32_t dbits;
      std::memcpy(&dbits, &blk.d, 4);  // d, dmin adjacent
      p.dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dbits)));
    }
    return p;
  }

  // Elements 128h .. 128h + 127 as two registers of 64 (steps 2h and 2h + 1).
  static void decode(const WB& blk, const Prep& p, int h, __m512i& y0, __m512i& y1) {
    if constexpr (WT == DType::Q6_K) {
      const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
      const __m512i ql = load64(blk.ql + 64 * h);
      const __m256i qh = load32(blk.qh + 32 * h);
      // [qh, qh >> 2]: bits 0-1 / 4-5 of each byte are the high bits of steps 2h / 2h + 1.
      const __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
      y0 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_slli_epi16(qh2, 4), m30));
      y1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_and_si512(qh2, m30));
    } else {
      // [qs, qs >> 2] of this half: bits 0-1 / 4-5 of each byte are steps 2h / 2h + 1.
      const __m512i m3 = _mm512_set1_epi8(3);
      const __m256i q = load32(blk.qs + 32 * h);
      const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 2), 1);
      y0 = _mm512_and_si512(z, m3);
      y1 = _mm512_and_si512(_mm512_srli_epi16(z, 4), m3);
      if constexpr (WT == DType::Q3_K) {
        // Bit 2c of h2's bytes is the high bit of step c: moved to bit 2.
        const __m512i m04 = _mm512_set1_epi8(4);
        if (h == 0) {
          y0 = _mm512_or_si512(y0, _mm512_and_si512(_mm512_slli_epi16(p.h2, 2), m04));
          y1 = _mm512_or_si512(y1, _mm512_and_si512(p.h2, m04));
        } else {
          y0 = _mm512_or_si512(y0, _mm512_and_si512(_mm512_srli_epi16(p.h2, 2), m04));
          y1 = _mm512_or_si512(y1, _mm512_and_si512(_mm512_srli_epi16(p.h2, 4), m04));
        }
      }
    }
  }

  template <int R, int T>
  static void tile(const GemmArgs& a, int64_t r0, int64_t t0) {
    const int64_t nb = a.k / kQK_K;
    KTile<WB, R, T> tl(a, r0, t0);
    auto& [w, x, acc] = tl;
    for (int64_t b = 0; b < nb; ++b) {
      Prep p[R];
      for (int r = 0; r < R; ++r) p[r] = prepare(w[r][b]);
      __m512i isum[R][T];
      for (int t = 0; t < T; ++t) {
        const __m256i bsums = load32(x[t][b].bsums);
        for (int r = 0; r < R; ++r) {
          if constexpr (kMins) {
            isum[r][t] = _mm512_setzero_si512();
          } else {  // -offset * sum of scale x bsum, 8 lanes
            const __m256i o = _mm256_slli_epi32(_mm256_madd_epi16(bsums, p[r].s16), kOffsetShift);
            isum[r][t] = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), o));
          }
        }
      }
      for (int h = 0; h < 2; ++h) {
        __m512i y[R][2];
        for (int r = 0; r < R; ++r) decode(w[r][b], p[r], h, y[r][0], y[r][1]);
        for (int cc = 0; cc < 2; ++cc) {
          const int i = 2 * h + cc;
          const __m512i idx = _mm512_load_si512(kQ6ScaleIdx.data() + 32 * i);
          __m512i sc[R];
          for (int r = 0; r < R; ++r) sc[r] = _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(p[r].s16));
          for (int t = 0; t < T; ++t) {
            const __m512i xa = load64(x[t][b].qs + 64 * i);
            for (int r = 0; r < R; ++r)
              isum[r][t] = _mm512_dpwssd_epi32(isum[r][t], _mm512_maddubs_epi16(y[r][cc], xa), sc[r]);
          }
        }
      }
      for (int t = 0; t < T; ++t) {
        [[maybe_unused]] const __m256i bsums = load32(x[t][b].bsums);
        const __m128 xd = _mm_set1_ps(x[t][b].d);
        for (int r = 0; r < R; ++r) {
          const __m128 f = _mm_mul_ps(p[r].dd, xd);  // [d * xd, dmin * xd]
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][t]), _mm512_broadcastss_ps(f), acc[r][t]);
          if constexpr (kMins) {
            const __m256i msum = _mm256_madd_epi16(bsums, p[r].m16);
            acc[r][t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(msum)),
                                         _mm512_broadcastss_ps(_mm_movehdup_ps(f)), acc[r][t]);
          }
        }
      }
    }
    tl.store(a, r0, t0);
  }
};

}  // namespace

void add_gemm_q5_kquant_avx512(GemmTable& t) {
  t.add(SimdLevel::avx512, DType::Q5_0, {&gemm<Q5QuadKernel<DType::Q5_0>>, true});
  t.add(SimdLevel::avx512, DType::Q5_1, {&gemm<Q5QuadKernel<DType::Q5_1>>, true});
  t.add(SimdLevel::avx512, DType::Q4_K, {&gemm<K45Kernel512<DType::Q4_K>>});
  t.add(SimdLevel::avx512, DType::Q5_K, {&gemm<K45Kernel512<DType::Q5_K>>});
  t.add(SimdLevel::avx512, DType::Q2_K, {&gemm<G16Kernel512<DType::Q2_K>>});
  t.add(SimdLevel::avx512, DType::Q3_K, {&gemm<G16Kernel512<DType::Q3_K>>});
  t.add(SimdLevel::avx512, DType::Q6_K, {&gemm<G16Kernel512<DType::Q6_K>>});
}

}  // namespace ember::cpu::detail
