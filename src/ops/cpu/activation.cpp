#include "ops/cpu/activation.hpp"

#include <cmath>

namespace ember::cpu {

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::silu: return "silu";
    case Activation::relu: return "relu";
    case Activation::gelu_tanh: return "gelu_tanh";
  }
  return "?";
}

float activate(Activation a, float x) {
  switch (a) {
    case Activation::silu: return x / (1.0f + std::exp(-x));
    case Activation::relu: return x > 0 ? x : 0.0f;
    case Activation::gelu_tanh: {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
      return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
    }
  }
  return x;
}

void gated_activation(Activation a, const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = activate(a, gate[i]) * up[i];
}

void activation_inplace(Activation a, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = activate(a, x[i]);
}

}  // namespace ember::cpu
