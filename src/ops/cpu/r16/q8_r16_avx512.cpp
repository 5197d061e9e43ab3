// The Q8_0_R16 kernel on AVX-512 VNNI (layout in r16/r16.hpp). Per 32-element block of a group:
// eight 64-byte loads hold 16 rows x 32 weights biased to unsigned (w + 128), register c
// holding elements 4c .. 4c + 3 of all 16 rows, one row per 32-bit lane. Each meets the
// activation's matching 4 bytes broadcast to all lanes in a vpdpbusd, the bias times the
// activation sum (R16Act::c) is taken off in integers, and the 16 lanes are scaled once per
// block. The loaded weights serve up to four tokens.
// GCC 12 warns falsely inside its own cvtph / cvtepi32 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "ops/cpu/r16/r16_avx512.hpp"

namespace ember::cpu::detail {
namespace {

struct Q8Kernel {
  static constexpr size_t kGroupBlockBytes = kR16Q8BlockBytes, kQsAt = kR16Q8QsAt;
  // Tiles of eight tokens (Matmul512/*_R16/2048x2048, one thread, Zen 5: 1.15x).
  static constexpr bool kTile8 = true;

  template <int T>
  static void tile(const GemmArgs& a, int64_t g, int64_t t0) {
    r16_tile<R16Act, 32, kGroupBlockBytes, T>(a, g, t0, [&](const uint8_t* p, const R16Act* const* x, int64_t b,
                                                           __m512(&acc)[T], const R16Fetch& fetch) {
      fetch.all();
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      __m512i w[8];
      for (int c = 0; c < 8; ++c) w[c] = _mm512_loadu_si512(p + kQsAt + 64 * c);
      for (int t = 0; t < T; ++t) {
        const R16Act& xa = x[t][b];
        // Two dependency chains of four, joined once.
        __m512i s0 = _mm512_set1_epi32(xa.c), s1 = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
          s0 = _mm512_dpbusd_epi32(s0, w[c], bcast4(xa.qs + 4 * c));
          s1 = _mm512_dpbusd_epi32(s1, w[4 + c], bcast4(xa.qs + 16 + 4 * c));
        }
        const __m512i s = _mm512_add_epi32(s0, s1);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(xa.d)), acc[t]);
      }
    });
  }
};

}  // namespace

void gemm_q8_0_r16_avx512(const GemmArgs& a) { run_r16_tiles<Q8Kernel>(a); }

}  // namespace ember::cpu::detail
