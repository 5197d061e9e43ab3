#include "ops/cpu/norm.hpp"

#include <cmath>

#include "ops/cpu/vec.hpp"

namespace ember::cpu {

void rms_norm(const float* x, const float* weight, float* out, int64_t n_tokens, int64_t n, float eps,
              bool add_one) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * n;
    float* ot = out + t * n;
    double mean = static_cast<double>(sum_squares_f32(xt, n)) / static_cast<double>(n);
    float scale = static_cast<float>(1.0 / std::sqrt(mean + eps));
    if (!weight) {
      for (int64_t i = 0; i < n; ++i) ot[i] = xt[i] * scale;
    } else if (add_one) {
      for (int64_t i = 0; i < n; ++i) ot[i] = xt[i] * scale * (1.0f + weight[i]);
    } else {
      scale_mul_f32(xt, scale, weight, ot, n);
    }
  }
}

void layer_norm(const float* x, const float* weight, const float* bias, float* out, int64_t n_tokens, int64_t n,
                float eps) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * n;
    float* ot = out + t * n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += xt[i];
    const double mean = sum / static_cast<double>(n);
    double var = 0.0;  // two passes: no cancellation when the mean is large
    for (int64_t i = 0; i < n; ++i) var += (xt[i] - mean) * (xt[i] - mean);
    const float scale = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(n) + eps));
    const float m = static_cast<float>(mean);
    for (int64_t i = 0; i < n; ++i) {
      float v = (xt[i] - m) * scale;
      if (weight) v *= weight[i];
      if (bias) v += bias[i];
      ot[i] = v;
    }
  }
}

}  // namespace ember::cpu
