#include "ops/cpu/rope.hpp"

#include <cmath>

#include "core/error.hpp"

namespace ember::cpu {

RopeTable::RopeTable(RopeConfig config) : config_(std::move(config)) {
  EMBER_CHECK(config_.n_rot > 0 && config_.n_rot % 2 == 0, "rope: rotated dimension count must be even and positive, got {}",
              config_.n_rot);
  EMBER_CHECK(config_.base > 0, "rope: base must be positive");
  EMBER_CHECK(config_.linear_scale > 0, "rope: scale must be positive");
  EMBER_CHECK(config_.attn_factor > 0 && std::isfinite(config_.attn_factor), "rope: attention factor must be positive");
  int half = config_.n_rot / 2;
  EMBER_CHECK(config_.freq_factors.empty() || static_cast<int>(config_.freq_factors.size()) == half,
              "rope: {} frequency factors given, {} expected", config_.freq_factors.size(), half);
  inv_freq_.resize(half);
  for (int i = 0; i < half; ++i) {
    double f = std::pow(config_.base, -2.0 * i / config_.n_rot);
    if (!config_.freq_factors.empty()) f /= config_.freq_factors[i];
    inv_freq_[i] = f / config_.linear_scale;
  }
}

void RopeTable::angles(int64_t pos, float* cos_sin) const {
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    double theta = static_cast<double>(pos) * inv_freq_[i];
    cos_sin[2 * i] = static_cast<float>(config_.attn_factor * std::cos(theta));
    cos_sin[2 * i + 1] = static_cast<float>(config_.attn_factor * std::sin(theta));
  }
}

void RopeTable::apply(float* x, int64_t n_heads, int64_t head_dim, const float* cos_sin) const {
  const int half = config_.n_rot / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * head_dim;
    if (config_.layout == RopeLayout::normal) {
      for (int i = 0; i < half; ++i) {
        float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
        float a = xh[2 * i], b = xh[2 * i + 1];
        xh[2 * i] = a * c - b * s;
        xh[2 * i + 1] = a * s + b * c;
      }
    } else {
      for (int i = 0; i < half; ++i) {
        float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
        float a = xh[i], b = xh[i + half];
        xh[i] = a * c - b * s;
        xh[i + half] = a * s + b * c;
      }
    }
  }
}

}  // namespace ember::cpu
