// The Q4_K_R16 / Q5_K_R16 kernels on AVX-512 VNNI (layout in r16/r16.hpp). Per sub-block of 32 elements of a
// group: four 64-byte loads hold the 4-bit weights of 16 rows (one row per 32-bit lane) in the
// order of the Q8_K activations; each chunk's low and high nibbles meet their 4 activation bytes
// broadcast to all lanes in vpdpbusd (Q4_K's high nibbles where they lie, as 16 x their value:
// no shift), the 16 rows' integer sums are multiplied by their 6-bit sub-block scales (vpmulld),
// and the mins by the activation's sub-block sums. Once per super-block the integers become
// floats, scaled by the rows' d and dmin and the activation's d. Q5_K adds each nibble's fifth bit
// as Q5_0_R16 does (add_fifth_bits). The scales and mins come unpacked from r16/k_scale_table.hpp,
// spread to the rows' lanes by one vpshufb each.
// GCC 12 warns falsely inside its own cvtph / cvtepi32 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "ops/cpu/r16/k_scale_table.hpp"
#include "ops/cpu/r16/r16_avx512.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

constexpr size_t kQhAt = kR16Q4KQhAt;

// vpshufb indices that spread 16 bytes (rows 0..15, broadcast to each 128-bit lane) to the 16
// rows' 32-bit lanes: the byte alone (wide) or in both 16-bit halves of the lane (pair, as
// vpmaddwd takes a multiplier).
struct ScaleSpread512 {
  __m512i wide, pair;
  ScaleSpread512() {
    alignas(64) uint8_t w[64], pr[64];
    for (int b = 0; b < 64; ++b) {
      const uint8_t row = static_cast<uint8_t>(b / 4), none = 0x80;
      w[b] = b % 4 == 0 ? row : none;
      pr[b] = b % 2 == 0 ? row : none;
    }
    wide = _mm512_load_si512(w);
    pair = _mm512_load_si512(pr);
  }
};
inline const ScaleSpread512& scale_spread512() {
  static const ScaleSpread512 s;
  return s;
}
inline __m512i spread16(const uint8_t* t, __m512i ix) {
  return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t))), ix);
}

template <bool kQh>
struct Kernel {
  static constexpr size_t kGroupBlockBytes = r16_q4k_block_bytes(kQh), kSubBlocksAt = r16_q4k_sub_blocks_at(kQh),
                          kSubBlockBytes = r16_q4k_sub_block_bytes(kQh);
  // total holds this times the integer sum: Q4_K's high nibbles stay in place (16 x their value),
  // and a power of two changes no rounding (cvt(16 n) = 16 cvt(n), d / 16 exact), so the floats
  // equal the scalar reference's bit for bit.
  static constexpr int kTotalScale = kQh ? 1 : 16;

  static void prepare_group(const GemmArgs& a, int64_t g) { prepare_k_scale_tables(a, g, kGroupBlockBytes); }

  // Tiles of eight tokens for Q5_K (Matmul512/Q5_K_R16 1.08-1.14x against tiles of four, one and
  // two threads, Zen 5); Q4_K's measured level to 0.96x, so it keeps tiles of four.
  static constexpr bool kTile8 = kQh;
  // Where the mins are summed: a tile of several tokens after the sub-blocks (sum_mins), which
  // frees the T registers of their sums inside the loop (Matmul512 Q4_K 1.03-1.05x, Q5_K with
  // tiles of four 1.05-1.09x); a single token's in the loop.
  template <int T>
  static constexpr bool kMinsAfter = T > 1;

  // The mins of block b summed after its sub-blocks: sub-blocks 2i and 2i + 1's mins in the 16-bit
  // halves of a lane against the activation's two sub-block sums (each at most 32 x 127), four
  // vpmaddwd a token.
  template <int T>
  static void sum_mins(const uint8_t* tab, const BlockQ8_K* const* x, int64_t b, __m512i (&mins)[T]) {
    __m512i mp[4];
    for (int i = 0; i < 4; ++i) {
      const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tab + 64 * i + 16)));
      const __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tab + 64 * i + 48)));
      mp[i] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
    }
    for (int t = 0; t < T; ++t) {
      const __m256i s32 = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].bsums)),
                                            _mm256_set1_epi16(1));
      // 32-bit elements 0, 1, 4, 5: the sub-block sums (s0, s1), (s2, s3), (s4, s5), (s6, s7).
      const __m512i s16 = _mm512_castsi256_si512(_mm256_packs_epi32(s32, s32));
      __m512i m = _mm512_madd_epi16(mp[0], _mm512_permutexvar_epi32(_mm512_set1_epi32(0), s16));
      m = _mm512_add_epi32(m, _mm512_madd_epi16(mp[1], _mm512_permutexvar_epi32(_mm512_set1_epi32(1), s16)));
      m = _mm512_add_epi32(m, _mm512_madd_epi16(mp[2], _mm512_permutexvar_epi32(_mm512_set1_epi32(4), s16)));
      mins[t] = _mm512_add_epi32(m, _mm512_madd_epi16(mp[3], _mm512_permutexvar_epi32(_mm512_set1_epi32(5), s16)));
    }
  }

  template <int T>
  static void tile(const GemmArgs& a, int64_t g, int64_t t0) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const ScaleSpread512& spread = scale_spread512();
    uint8_t* const tables = scale_tables(a.k / kQK_K);
    const bool unpack = k_scale_tables_inline(a);
    r16_tile<BlockQ8_K, kQK_K, kGroupBlockBytes, T>(a, g, t0, [&](const uint8_t* p, const BlockQ8_K* const* x,
                                                                   int64_t b, __m512(&acc)[T], const R16Fetch& fetch) {
      uint8_t* const tab = tables + kKScaleTableBytes * b;
      if (unpack) k_scale_table(p, tab);
      __m512i total[T], mins[T];
      for (int t = 0; t < T; ++t) total[t] = mins[t] = _mm512_setzero_si512();
      fetch.all();  // at once: spread over the sub-blocks (as at AVX2) measured 0.94-0.98x here (Zen 5)
      for (int j = 0; j < 8; ++j) {
        const __m512i sc = spread16(tab + 32 * j, spread.wide);
        [[maybe_unused]] __m512i m2;
        if constexpr (!kMinsAfter<T>) m2 = spread16(tab + 32 * j + 16, spread.pair);
        const uint8_t* q = p + kSubBlocksAt + kSubBlockBytes * j;
        __m512i wl[4], wh[4];
        [[maybe_unused]] __m512i H;
        if constexpr (kQh) H = _mm512_loadu_si512(p + kQhAt + kSubBlockBytes * j);
        for (int c = 0; c < 4; ++c) {
          const __m512i v = _mm512_loadu_si512(q + 64 * c);
          wl[c] = _mm512_and_si512(v, m4);
          if constexpr (kQh) {
            wh[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            add_fifth_bits(H, c, wl[c], wh[c]);
          } else {
            wh[c] = _mm512_andnot_si512(m4, v);  // 16 x the high nibble: no shift
          }
        }
        for (int t = 0; t < T; ++t) {
          const int8_t* xq = x[t][b].qs + 32 * j;
          __m512i slo = _mm512_setzero_si512(), shi = _mm512_setzero_si512();
          for (int c = 0; c < 4; ++c) {
            slo = _mm512_dpbusd_epi32(slo, wl[c], bcast4(xq + 4 * c));
            shi = _mm512_dpbusd_epi32(shi, wh[c], bcast4(xq + 16 + 4 * c));
          }
          // kTotalScale x the sub-block's dot product (Q4_K: 16 x; |16 x 8 x 61440 x 63| < 2^31).
          const __m512i s = kQh ? _mm512_add_epi32(slo, shi) : _mm512_add_epi32(_mm512_slli_epi32(slo, 4), shi);
          total[t] = _mm512_add_epi32(total[t], _mm512_mullo_epi32(s, sc));
          // m in both 16-bit halves against the sub-block's two 16-element sums (one 4-byte broadcast).
          if constexpr (!kMinsAfter<T>)
            mins[t] = _mm512_add_epi32(mins[t], _mm512_madd_epi16(m2, bcast4(reinterpret_cast<const int8_t*>(x[t][b].bsums + 2 * j))));
        }
      }
      if constexpr (kMinsAfter<T>) sum_mins<T>(tab, x, b, mins);
      const __m512 dw = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                                      _mm512_set1_ps(1.0f / kTotalScale));
      const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
      for (int t = 0; t < T; ++t) {
        const __m512 dx = _mm512_set1_ps(x[t][b].d);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[t]), _mm512_mul_ps(dw, dx), acc[t]);
        acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins[t]), _mm512_mul_ps(dm, dx), acc[t]);
      }
    });
  }
};

}  // namespace

void gemm_q4_k_r16_avx512(const GemmArgs& a) { run_r16_tiles<Kernel<false>>(a); }
void gemm_q5_k_r16_avx512(const GemmArgs& a) { run_r16_tiles<Kernel<true>>(a); }

}  // namespace ember::cpu::detail
