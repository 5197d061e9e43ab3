// Normalizations over the embedding dimension, one row per token.
#pragma once
#include <cstdint>

namespace ember::cpu {

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * (weight (+ 1 when `add_one`, Gemma's convention))
// `weight` may be null (no scale). out may alias x.
void rms_norm(const float* x, const float* weight, float* out, int64_t n_tokens, int64_t n, float eps,
              bool add_one = false);

// LayerNorm: out[t] = (x[t] - mean(x[t])) / sqrt(var(x[t]) + eps) * weight + bias (OPT, Falcon).
// weight and bias may be null (1 and 0). out may alias x.
void layer_norm(const float* x, const float* weight, const float* bias, float* out, int64_t n_tokens, int64_t n,
                float eps);

}  // namespace ember::cpu
