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
      for (int64_t i = 0; i < n; ++i) ot[i] = xt[i] * scale * weight[i];
    }
  }
}

}  // namespace ember::cpu
