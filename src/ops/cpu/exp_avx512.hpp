// exp on 16 lanes (AVX-512), the approximation activation_impl.hpp describes. Include only from
// files compiled for AVX-512 (*_avx512.cpp). Static: each file keeps its own copy, compiled with
// its own contraction setting (activation_avx512.cpp must not get a fused copy from elsewhere).
#pragma once
#include <immintrin.h>

#include "ops/cpu/activation_impl.hpp"

namespace ember::cpu::detail {

static inline __m512 exp_approx(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpMin));
  x = _mm512_min_ps(x, _mm512_set1_ps(kExpMax));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpP[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP[i]));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}

}  // namespace ember::cpu::detail
