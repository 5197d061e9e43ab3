// FFN activations (ops/cpu/activation.hpp): the scalar function against double precision, and
// the array forms at every SIMD level the CPU has bit for bit against the scalar function, on
// awkward lengths and on the edges of exp's range.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/cpu/activation.hpp"
#include "support/simd_levels.hpp"

using namespace ember;
using cpu::Activation;
using test_support::SimdGuard;

namespace {

double reference(Activation a, double x) {
  switch (a) {
    case Activation::silu: return x / (1.0 + std::exp(-x));
    case Activation::relu: return x > 0 ? x : 0.0;
    case Activation::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)));
  }
  return x;
}

std::vector<float> test_values() {
  std::vector<float> v = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-7f, -1e-7f, 0.5f, -0.5f, 1.0f, -1.0f, 3.0f, -3.0f,
                          10.0f, -10.0f, 30.0f, -30.0f, 86.9f, -86.9f, 87.5f, -87.5f, 88.5f, -88.5f, 100.0f,
                          -100.0f, 1e10f, -1e10f};
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int i = 0; i < 4000; ++i) v.push_back(nd(rng));
  std::uniform_real_distribution<float> wide(-90.0f, 90.0f);
  for (int i = 0; i < 1000; ++i) v.push_back(wide(rng));
  return v;
}

}  // namespace

TEST(Activation, ScalarMatchesDoublePrecision) {
  for (Activation a : {Activation::silu, Activation::gelu_tanh, Activation::relu}) {
    double worst = 0;
    for (float x : test_values()) {
      const double ref = reference(a, x), got = cpu::activate(a, x);
      ASSERT_TRUE(std::isfinite(got)) << cpu::activation_name(a) << " x " << x;
      // Relative to the value, with an absolute floor for the values near zero: 1 + tanh(u)
      // cancels for large negative x (as it does in the formula itself).
      const double err = std::fabs(got - ref) / (std::fabs(ref) + 1e-7 * std::max(1.0, std::fabs(double{x})));
      worst = std::max(worst, err);
      EXPECT_LT(err, 2e-6) << cpu::activation_name(a) << " x " << x << " got " << got << " want " << ref;
    }
    EXPECT_LT(worst, 2e-6) << cpu::activation_name(a);
  }
}

TEST(Activation, ArrayFormsEqualTheScalarFunctionBitForBit) {
  SimdGuard guard;
  const std::vector<float> v = test_values();
  for (SimdLevel level : test_support::simd_levels()) {
    set_simd_level(level);
    SCOPED_TRACE(simd_level_name(level));
    for (Activation a : {Activation::silu, Activation::gelu_tanh, Activation::relu}) {
      for (int64_t n : std::vector<int64_t>{1, 7, 8, 9, 15, 16, 17, 33, 67, static_cast<int64_t>(v.size())}) {
        std::vector<float> x(v.begin(), v.begin() + n), up(static_cast<size_t>(n)), out(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) up[i] = 0.25f * static_cast<float>(i % 9) - 1.0f;
        cpu::gated_activation(a, x.data(), up.data(), out.data(), n);
        cpu::activation_inplace(a, x.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const float want = cpu::activate(a, v[i]);
          ASSERT_EQ(x[i], want) << cpu::activation_name(a) << " n " << n << " i " << i << " x " << v[i];
          ASSERT_EQ(out[i], want * up[i]) << cpu::activation_name(a) << " n " << n << " i " << i;
        }
      }
    }
  }
}
