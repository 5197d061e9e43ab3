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

namespace {

// The logistic loss's term and gradient in double precision (ops/cpu/activation.hpp).
double logistic_reference(double z, double pw, double& grad) {
  const double sig = 1.0 / (1.0 + std::exp(-z));
  const double l1p = std::log1p(std::exp(-std::fabs(z)));  // softplus(+-z) = max(+-z, 0) + l1p
  if (pw > 0) {
    grad = pw * (sig - 1.0);
    return pw * (std::max(-z, 0.0) + l1p);
  }
  grad = sig;
  return std::max(z, 0.0) + l1p;
}

// Label weights: negative (0) mostly, positive weights of a few sizes between.
std::vector<float> label_weights(size_t n) {
  std::vector<float> pw(n, 0.0f);
  for (size_t i = 0; i < n; ++i)
    if (i % 3 == 1) pw[i] = 0.5f + 0.75f * static_cast<float>(i % 7);
  return pw;
}

}  // namespace

TEST(Activation, LogisticLossMatchesDoublePrecision) {
  SimdGuard guard;
  const std::vector<float> z = test_values();
  const std::vector<float> pw = label_weights(z.size());
  const float scale = 0.125f;
  for (SimdLevel level : test_support::simd_levels()) {
    set_simd_level(level);
    SCOPED_TRACE(simd_level_name(level));
    std::vector<float> grad(z.size());
    const float total = cpu::logistic_loss(z.data(), pw.data(), scale, grad.data(), static_cast<int64_t>(z.size()));
    double want_total = 0;
    for (size_t i = 0; i < z.size(); ++i) {
      double g;
      const double l = logistic_reference(z[i], pw[i], g);
      want_total += l;
      // Loss terms are as large as |z| (1e10 here): their error relative to the term, floored at
      // the term's own magnitude near 0; gradients lie in [-pw, 1]: absolute.
      EXPECT_NEAR(grad[i], scale * g, 2e-7 * scale * std::max(1.0, double{pw[i]})) << "z " << z[i] << " pw " << pw[i];
      std::vector<float> one_grad(1);
      const double got = cpu::logistic_loss(&z[i], &pw[i], 1.0f, one_grad.data(), 1);
      EXPECT_LE(std::fabs(got - l), 2e-6 * std::fabs(l) + 1e-37) << "z " << z[i] << " pw " << pw[i];
      EXPECT_TRUE(std::isfinite(got));
    }
    EXPECT_NEAR(total, want_total, 1e-5 * std::fabs(want_total));
  }
}

TEST(Activation, LogisticLossGradientsEqualTheScalarOnesBitForBit) {
  SimdGuard guard;
  const std::vector<float> v = test_values();
  const std::vector<float> pw = label_weights(v.size());
  set_simd_level(SimdLevel::scalar);
  std::vector<float> want(v.size());
  const float want_total = cpu::logistic_loss(v.data(), pw.data(), 0.3f, want.data(), static_cast<int64_t>(v.size()));
  for (SimdLevel level : test_support::simd_levels()) {
    set_simd_level(level);
    SCOPED_TRACE(simd_level_name(level));
    for (int64_t n : std::vector<int64_t>{1, 7, 8, 9, 15, 16, 17, 33, 67, static_cast<int64_t>(v.size())}) {
      std::vector<float> g(v.begin(), v.begin() + n);  // in place: grad is z
      const float total = cpu::logistic_loss(g.data(), pw.data(), 0.3f, g.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(g[i], want[i]) << "n " << n << " i " << i << " z " << v[i];
      }
      if (n == static_cast<int64_t>(v.size())) {
        EXPECT_NEAR(total, want_total, 1e-5 * std::fabs(want_total));
      }
    }
  }
}
