// The Q4_0_R16 / Q4_1_R16 / Q5_0_R16 kernels on AVX-512 VNNI (layout in r16/r16.hpp). Per 32-element block of a
// group: four 64-byte loads give 16 rows x 32 nibbles; split into low and high nibbles they are
// eight registers, register c (c < 4) holding elements 4c .. 4c + 3 and register 4 + c elements
// 16 + 4c .. 16 + 4c + 3 of all 16 rows, one row per 32-bit lane. Each meets the activation's
// matching 4 bytes broadcast to all lanes in a vpdpbusd; the 16 lanes are the 16 rows' integer
// block dots, scaled once per block (Q4_1: plus m * s). Q5_0 adds each nibble's fifth bit first:
// byte c of a lane's qh broadcast to the lane's four bytes (vpshufb), tested bit by bit into a
// mask that adds 16. The decoded weights serve up to four tokens.
// GCC 12 warns falsely inside its own cvtph / cvtepi32 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "ops/cpu/r16/r16_avx512.hpp"

namespace ember::cpu::detail {
namespace {

template <bool kHasMin, bool kHasQh = false>
struct Kernel {
  static constexpr size_t kGroupBlockBytes = r16_q4_block_bytes(kHasMin, kHasQh), kQsAt = kGroupBlockBytes - 256;
  // Tiles of eight tokens (Matmul512/*_R16/2048x2048, one thread, Zen 5: Q4_0 1.15x, Q4_1 1.10x, Q5_0 1.17x).
  static constexpr bool kTile8 = true;

  template <int T>
  static void tile(const GemmArgs& a, int64_t g, int64_t t0) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    r16_tile<R16Act, 32, kGroupBlockBytes, T>(a, g, t0, [&](const uint8_t* p, const R16Act* const* x, int64_t b,
                                                              __m512(&acc)[T], const R16Fetch& fetch) {
      fetch.all();
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      [[maybe_unused]] __m512 mw;
      if constexpr (kHasMin) mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
      __m512i lo[4], hi[4];
      [[maybe_unused]] __m512i H;
      if constexpr (kHasQh) H = _mm512_loadu_si512(p + 32);
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(p + kQsAt + 64 * c);
        lo[c] = _mm512_and_si512(v, m4);
        hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if constexpr (kHasQh) add_fifth_bits(H, c, lo[c], hi[c]);
      }
      for (int t = 0; t < T; ++t) {
        const R16Act& xa = x[t][b];
        // Two dependency chains of four (low and high nibbles), joined once.
        __m512i sl = kHasMin ? _mm512_setzero_si512() : _mm512_set1_epi32(xa.c), sh = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
          sl = _mm512_dpbusd_epi32(sl, lo[c], bcast4(xa.qs + 4 * c));
          sh = _mm512_dpbusd_epi32(sh, hi[c], bcast4(xa.qs + 16 + 4 * c));
        }
        const __m512i s = _mm512_add_epi32(sl, sh);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(xa.d)), acc[t]);
        if constexpr (kHasMin) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xa.s), acc[t]);
      }
    });
  }
};

}  // namespace

void gemm_q4_0_r16_avx512(const GemmArgs& a) { run_r16_tiles<Kernel<false>>(a); }
void gemm_q4_1_r16_avx512(const GemmArgs& a) { run_r16_tiles<Kernel<true>>(a); }
void gemm_q5_0_r16_avx512(const GemmArgs& a) { run_r16_tiles<Kernel<false, true>>(a); }

}  // namespace ember::cpu::detail
