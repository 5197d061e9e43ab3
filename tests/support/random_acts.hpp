// Random activations for kernel tests: normal, with every 53rd value ten times larger (outliers
// that set the 8-bit quantization scales, as real activations have).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace ember::test_support {

inline std::vector<float> random_acts(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * k));
  for (auto& v : x) v = dist(rng);
  for (size_t i = 0; i < x.size(); i += 53) x[i] *= 10.f;
  return x;
}

}  // namespace ember::test_support
