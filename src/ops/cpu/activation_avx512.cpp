// AVX-512 activations: every lane computes what activate() computes for its value, bit for bit
// (activation_impl.hpp; this file is built without floating-point contraction so that no
// multiply-add is fused that the scalar code rounds twice).
// GCC 12 at -O2 warns that the _mm512_undefined_ps() inside the intrinsics "may be used
// uninitialized"; it is undefined by design.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "ops/cpu/activation.hpp"
#include "ops/cpu/activation_impl.hpp"

namespace ember::cpu::detail {
namespace {

#include "ops/cpu/simd_f32.hpp"
#include "ops/cpu/exp_simd.hpp"

inline __m512 activate(Activation a, __m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  switch (a) {
    case Activation::silu:
      return _mm512_div_ps(x, _mm512_add_ps(one, exp_approx(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    case Activation::relu: return _mm512_max_ps(x, _mm512_setzero_ps());
    case Activation::gelu_tanh: {
      const __m512 z = _mm512_mul_ps(
          _mm512_mul_ps(_mm512_set1_ps(kGelu2A), x),
          _mm512_add_ps(one, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(kGeluB), x), x)));
      return _mm512_div_ps(x, _mm512_add_ps(one, exp_approx(_mm512_sub_ps(_mm512_setzero_ps(), z))));
    }
  }
  return x;
}

inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

}  // namespace

void activation_inplace_avx512(Activation a, float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, m, activate(a, _mm512_maskz_loadu_ps(m, x + i)));
  }
}

void gated_activation_avx512(Activation a, const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 g = activate(a, _mm512_maskz_loadu_ps(m, gate + i));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

}  // namespace ember::cpu::detail
