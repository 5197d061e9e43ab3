#include "sparse/threshold.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace ember {

float quantile_at(const float* q, int64_t n, double s) {
  EMBER_CHECK(n >= 2, "a quantile table needs at least 2 entries, got {}", n);
  EMBER_CHECK(s >= 0.0 && s <= 1.0, "sparsity must be in [0, 1], got {}", s);
  const double idx = s * static_cast<double>(n - 1);
  const int64_t lo = std::min<int64_t>(static_cast<int64_t>(std::floor(idx)), n - 2);
  const double f = idx - static_cast<double>(lo);
  return static_cast<float>(q[lo] + f * (q[lo + 1] - q[lo]));
}

std::vector<float> calibrate_thresholds(const gguf::Reader& r, double sparsity) {
  EMBER_CHECK(r.opt_string("general.architecture").value_or("") == "ember-profile",
              "'{}' is not a profile file (write one with `ember profile`)", r.path());
  EMBER_CHECK(sparsity >= 0.0 && sparsity < 1.0, "target sparsity must be in [0, 1), got {}", sparsity);
  const int64_t n_layer = r.get_int("ember.profile.n_layer");
  EMBER_CHECK(n_layer >= 1 && n_layer <= 100000, "'{}': bad ember.profile.n_layer {}", r.path(), n_layer);
  std::vector<float> t(static_cast<size_t>(n_layer));
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string name = "blk." + std::to_string(l) + ".ffn_gate_quantiles";
    const gguf::TensorInfo* ti = r.find_tensor(name);
    EMBER_CHECK(ti, "'{}' has no tensor {} (a profile from an older Ember?)", r.path(), name);
    TensorView v = r.view(*ti);
    EMBER_CHECK(v.type == DType::F32 && v.n_elements() >= 2, "'{}': {} must be F32 with at least 2 entries", r.path(),
                name);
    const float* q = reinterpret_cast<const float*>(v.data);
    for (int64_t i = 0; i < v.n_elements(); ++i)
      EMBER_CHECK(std::isfinite(q[i]) && q[i] >= 0.0f && (i == 0 || q[i] >= q[i - 1]),
                  "'{}': {} is not a non-decreasing table of finite values >= 0", r.path(), name);
    t[static_cast<size_t>(l)] = quantile_at(q, v.n_elements(), sparsity);
  }
  return t;
}

std::vector<float> calibrate_thresholds(const std::string& profile_path, double sparsity) {
  gguf::Reader r(profile_path);
  return calibrate_thresholds(r, sparsity);
}

}  // namespace ember
