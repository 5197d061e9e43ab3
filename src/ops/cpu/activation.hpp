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

}  // namespace ember::cpu
