#include "ops/cpu/activation.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/enum_names.hpp"
#include "core/cpu_features.hpp"
#include "ops/cpu/activation_impl.hpp"

namespace ember::cpu {
namespace detail {
// activation_avx2.cpp, activation_avx512.cpp: out[i] = act(gate[i]) * up[i], or act(gate[i]) where
// up is null; out may be gate.
void activate_avx2(Activation a, const float* gate, const float* up, float* out, int64_t n);
void activate_avx512(Activation a, const float* gate, const float* up, float* out, int64_t n);
float logistic_loss_avx2(const float* z, const float* pw, float scale, float* grad, int64_t n);
float logistic_loss_avx512(const float* z, const float* pw, float scale, float* grad, int64_t n);
}  // namespace detail

namespace {

// The scalar twin of the vector exp (activation_impl.hpp): the same operations in the same order.
float exp_approx(float x) {
  using namespace detail;
  x = x > kExpMin ? x : kExpMin;  // as max_ps / min_ps (a NaN becomes the bound)
  x = x < kExpMax ? x : kExpMax;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kExpP[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kExpP[i]);
  const float y = std::fma(p, r * r, r) + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

// One term of logistic_loss, the vector lanes' operations in their order (activation_simd.hpp).
float logistic_term(float z, float pw, float scale, float& grad) {
  const float e = exp_approx(-std::fabs(z));
  const float r = 1.0f / (1.0f + e);
  const float sig = -z > 0.0f ? e * r : r;
  const float s = e / (2.0f + e), w = s * s;
  float p = detail::kLog1pP[0];
  for (int i = 1; i < 7; ++i) p = std::fma(p, w, detail::kLog1pP[i]);
  const float l1p = (s + s) * p;
  const float pos_loss = pw * (std::max(-z, 0.0f) + l1p);
  const float neg_loss = std::max(z, 0.0f) + l1p;
  grad = scale * (pw > 0.0f ? pw * (sig - 1.0f) : sig);
  return pw > 0.0f ? pos_loss : neg_loss;
}

}  // namespace

const char* activation_name(Activation a) {
  static constexpr EnumName<Activation> kNames[] = {
      {Activation::silu, "silu"}, {Activation::relu, "relu"}, {Activation::gelu_tanh, "gelu_tanh"}};
  return enum_name(kNames, a);
}

float activate(Activation a, float x) {
  switch (a) {
    case Activation::silu: return x / (1.0f + exp_approx(-x));
    case Activation::relu: return x > 0 ? x : 0.0f;
    case Activation::gelu_tanh: {
      // 0.5 x (1 + tanh(u)) = x / (1 + e^{-2u}), u = sqrt(2/pi) x (1 + 0.044715 x^2): no
      // cancellation for negative x.
      const float z = detail::kGelu2A * x * (1.0f + detail::kGeluB * x * x);
      return x / (1.0f + exp_approx(-z));
    }
  }
  return x;
}

void gated_activation(Activation a, const float* gate, const float* up, float* out, int64_t n) {
  if (vector_level() == SimdLevel::avx512) return detail::activate_avx512(a, gate, up, out, n);
  if (vector_level() == SimdLevel::avx2) return detail::activate_avx2(a, gate, up, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = activate(a, gate[i]) * up[i];
}

void activation_inplace(Activation a, float* x, int64_t n) {
  if (vector_level() == SimdLevel::avx512) return detail::activate_avx512(a, x, nullptr, x, n);
  if (vector_level() == SimdLevel::avx2) return detail::activate_avx2(a, x, nullptr, x, n);
  for (int64_t i = 0; i < n; ++i) x[i] = activate(a, x[i]);
}

float logistic_loss(const float* z, const float* pw, float scale, float* grad, int64_t n) {
  if (vector_level() == SimdLevel::avx512) return detail::logistic_loss_avx512(z, pw, scale, grad, n);
  if (vector_level() == SimdLevel::avx2) return detail::logistic_loss_avx2(z, pw, scale, grad, n);
  float total = 0.0f;
  for (int64_t i = 0; i < n; ++i) total += logistic_term(z[i], pw[i], scale, grad[i]);
  return total;
}

}  // namespace ember::cpu
