// FFN activations. The gated forms compute out = act(gate) * up elementwise.
#pragma once
#include <cstdint>

namespace ember::cpu {

enum class Activation { silu, relu, gelu_tanh };

const char* activation_name(Activation a);
float activate(Activation a, float x);
// out[i] = act(gate[i]) * up[i]; out may alias gate or up.
void gated_activation(Activation a, const float* gate, const float* up, float* out, int64_t n);
// x[i] = act(x[i])
void activation_inplace(Activation a, float* x, int64_t n);

// The weighted binary cross-entropy of scores z against labels given by pw: positive, of weight
// pw[i], where pw[i] > 0; negative, of weight 1, elsewhere. Writes grad[i] = scale dL/dz[i] (grad
// may be z) and returns the loss summed over i:
//   positive: L = pw softplus(-z), dL/dz = pw (sigmoid(z) - 1);
//   negative: L = softplus(z),     dL/dz = sigmoid(z).
// Stable for every z: with e = exp(-|z|) in (0, 1], softplus(+-z) = max(+-z, 0) + log1p(e) and
// sigmoid(z) = 1 / (1 + e) for z >= 0, e / (1 + e) below (activation_impl.hpp: log1p and exp).
// Each grad[i] has the same bits on every SIMD level; the sum's rounding follows the lanes.
float logistic_loss(const float* z, const float* pw, float scale, float* grad, int64_t n);

}  // namespace ember::cpu
