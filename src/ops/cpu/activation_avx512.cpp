// AVX-512 activations: every lane computes what activate() computes for its value, bit for bit
// (activation_impl.hpp; this file is built without floating-point contraction so that no
// multiply-add is fused that the scalar code rounds twice).
// GCC 12 at -O2 warns that the _mm512_undefined_ps() / _mm256_undefined_pd() inside the
// intrinsics (the lanes' sum among them) "may be" or "is used uninitialized"; it is undefined by design.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>

#include "ops/cpu/activation.hpp"
#include "ops/cpu/activation_impl.hpp"

namespace ember::cpu::detail {
namespace {

// In this order: the vector types, exp on them, the activations.
#include "ops/cpu/simd_f32.hpp"

#include "ops/cpu/exp_simd.hpp"

#include "ops/cpu/activation_simd.hpp"

}  // namespace

void activate_avx512(Activation a, const float* gate, const float* up, float* out, int64_t n) {
  activate_span<__m512>(a, gate, up, out, n);
}

float logistic_loss_avx512(const float* z, const float* pw, float scale, float* grad, int64_t n) {
  return logistic_loss_span<__m512>(z, pw, scale, grad, n);
}

}  // namespace ember::cpu::detail
