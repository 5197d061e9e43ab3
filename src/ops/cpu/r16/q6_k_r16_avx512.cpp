// The Q6_K_R16 kernel on AVX-512 VNNI (layout in r16/r16.hpp). Per sub-block of 16 elements of a
// group: three 64-byte loads unpack into four registers of 6-bit weights, one row per 32-bit lane,
// in the order of the Q8_K activations; each meets its 4 activation bytes broadcast to all lanes
// in a vpdpbusd started from -32 x the sub-block's activation sum (the Q6_K offset), and the
// 16 rows' integer sums are multiplied by their sub-block scales (vpmulld) and added up. Once per
// super-block the integers become floats, scaled by the rows' d and the activation's d. The
// decoded weights serve up to four tokens.
// GCC 12 warns falsely inside its own cvtph / cvtepi32 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "ops/cpu/r16/r16_avx512.hpp"
#include "tensor/quant.hpp"

namespace ember::cpu::detail {
namespace {

constexpr size_t kGroupBlockBytes = kR16Q6KBlockBytes, kScalesAt = kR16Q6KScalesAt, kSubBlocksAt = kR16Q6KSubBlocksAt,
                 kSubBlockBytes = kR16Q6KSubBlockBytes;

struct Kernel {
  // Tiles of eight tokens (Matmul512/*_R16/2048x2048, one thread, Zen 5: 1.26x).
  static constexpr bool kTile8 = true;
  template <int T>
  static void tile(const GemmArgs& a, int64_t g, int64_t t0) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    r16_tile<BlockQ8_K, kQK_K, kGroupBlockBytes, T>(a, g, t0, [&](const uint8_t* p, const BlockQ8_K* const* x,
                                                                   int64_t b, __m512(&acc)[T], const R16Fetch& fetch) {
      __m512i total[T];
      for (int t = 0; t < T; ++t) total[t] = _mm512_setzero_si512();
      fetch.all();  // at once: spread over the sub-blocks (as at AVX2) measured 0.94-0.98x here (Zen 5)
      for (int j = 0; j < 16; ++j) {
        const __m512i sc =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kScalesAt + 16 * j)));
        const uint8_t* q = p + kSubBlocksAt + kSubBlockBytes * j;
        const __m512i A = _mm512_loadu_si512(q), B = _mm512_loadu_si512(q + 64), H = _mm512_loadu_si512(q + 128);
        const __m512i w0 = _mm512_or_si512(_mm512_and_si512(A, m4), _mm512_and_si512(_mm512_slli_epi16(H, 4), m30));
        const __m512i w1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(A, 4), m4),
                                           _mm512_and_si512(_mm512_slli_epi16(H, 2), m30));
        const __m512i w2 = _mm512_or_si512(_mm512_and_si512(B, m4), _mm512_and_si512(H, m30));
        const __m512i w3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(B, 4), m4),
                                           _mm512_and_si512(_mm512_srli_epi16(H, 2), m30));
        for (int t = 0; t < T; ++t) {
          const BlockQ8_K& xb = x[t][b];
          const int8_t* xq = xb.qs + 16 * j;
          __m512i s = _mm512_set1_epi32(-32 * xb.bsums[j]);
          s = _mm512_dpbusd_epi32(s, w0, bcast4(xq));
          s = _mm512_dpbusd_epi32(s, w1, bcast4(xq + 4));
          s = _mm512_dpbusd_epi32(s, w2, bcast4(xq + 8));
          s = _mm512_dpbusd_epi32(s, w3, bcast4(xq + 12));
          total[t] = _mm512_add_epi32(total[t], _mm512_mullo_epi32(s, sc));
        }
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      for (int t = 0; t < T; ++t)
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[t]), _mm512_mul_ps(dw, _mm512_set1_ps(x[t][b].d)), acc[t]);
    });
  }
};

}  // namespace

void gemm_q6_k_r16_avx512(const GemmArgs& a) { run_r16_tiles<Kernel>(a); }

}  // namespace ember::cpu::detail
