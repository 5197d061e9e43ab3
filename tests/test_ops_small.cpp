// Norms, RoPE, activations and vector helpers against direct formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "ops/cpu/activation.hpp"
#include "ops/cpu/norm.hpp"
#include "ops/cpu/rope.hpp"
#include "ops/cpu/vec.hpp"
#include "support/simd_levels.hpp"

using namespace ember;

namespace {
std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
}  // namespace

TEST(Vec, DotAxpyMatchDouble) {
  for (int64_t n : {1, 15, 16, 17, 100, 1027}) {
    auto a = random_vec(n, 1), b = random_vec(n, 2);
    double ref = 0, ss = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += double(a[i]) * b[i];
      ss += double(a[i]) * a[i];
    }
    EXPECT_NEAR(cpu::dot_f32(a.data(), b.data(), n), ref, 1e-4 * std::sqrt(double(n)));
    EXPECT_NEAR(cpu::sum_squares_f32(a.data(), n), ss, 1e-4 * ss);
    auto y = b;
    cpu::axpy_f32(0.5f, a.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[i], b[i] + 0.5f * a[i]);
  }
}

// scale_mul_f32 (rms_norm's last step) == (x * a) * w exactly, at every SIMD level, with tails.
TEST(Vec, ScaleMulIsExactAtEveryLevel) {
  test_support::SimdGuard guard;
  for (SimdLevel level : test_support::simd_levels()) {
    set_simd_level(level);
    for (int64_t n : {1, 15, 16, 17, 100, 2051}) {
      const auto x = random_vec(n, 3), w = random_vec(n, 4);
      std::vector<float> y(n);
      cpu::scale_mul_f32(x.data(), 0.37f, w.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] * 0.37f * w[i]) << simd_level_name(level) << " n " << n;
    }
  }
}

// argmax_f32 == std::max_element: ties (the first wins), the maximum in every position of a
// chunk and in a tail, infinities, NaNs (never the maximum) and the empty row.
TEST(Vec, TransposeMovesEveryElementAtEveryLevel) {
  test_support::SimdGuard guard;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (SimdLevel level : test_support::simd_levels()) {
    set_simd_level(level);
    SCOPED_TRACE(simd_level_name(level));
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 1}, {1, 9}, {9, 1}, {8, 8}, {7, 13}, {16, 24}, {17, 33}, {64, 2048}, {256, 37}, {35, 64}}) {
      std::vector<float> src(static_cast<size_t>(rows * cols)), dst(src.size(), NAN);
      for (float& v : src) v = u(rng);
      // In three row ranges, as threads split it; the middle one starts off the 8-row tiles.
      const int64_t a = rows / 3, b = std::min(rows, a + 11);
      cpu::transpose_f32(src.data(), rows, cols, 0, a, dst.data());
      cpu::transpose_f32(src.data(), rows, cols, a, b, dst.data());
      cpu::transpose_f32(src.data(), rows, cols, b, rows, dst.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(dst[c * rows + r], src[r * cols + c]) << rows << "x" << cols << " r " << r << " c " << c;
    }
  }
}

TEST(Vec, ArgmaxIsTheFirstLargest) {
  for (int64_t n : {1, 15, 255, 256, 257, 1000, 49152}) {
    auto x = random_vec(n, 7 + static_cast<uint32_t>(n));
    EXPECT_EQ(cpu::argmax_f32(x.data(), n), std::max_element(x.begin(), x.end()) - x.begin()) << n;
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      auto y = x;
      y[at] = 100.0f;
      if (at + 3 < n) y[at + 3] = 100.0f;  // a tie after it
      EXPECT_EQ(cpu::argmax_f32(y.data(), n), at) << n << " " << at;
      y[at] = INFINITY;
      EXPECT_EQ(cpu::argmax_f32(y.data(), n), at) << n << " " << at;
      if (at > 0) {
        y[0] = NAN;
        EXPECT_EQ(cpu::argmax_f32(y.data(), n), at) << n << " " << at;
      }
    }
  }
  std::vector<float> nans(40, NAN), low(40, -INFINITY);
  EXPECT_EQ(cpu::argmax_f32(nans.data(), 40), 0);
  EXPECT_EQ(cpu::argmax_f32(low.data(), 40), 0);
  EXPECT_EQ(cpu::argmax_f32(low.data(), 0), -1);
}

TEST(RmsNorm, MatchesFormula) {
  const int64_t n = 77, T = 3;
  auto x = random_vec(n * T, 3, 5.f), w = random_vec(n, 4);
  std::vector<float> out(n * T), out1(n * T);
  cpu::rms_norm(x.data(), w.data(), out.data(), T, n, 1e-5f);
  cpu::rms_norm(x.data(), w.data(), out1.data(), T, n, 1e-5f, /*add_one=*/true);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[t * n + i]) * x[t * n + i];
    double scale = 1.0 / std::sqrt(ss / n + 1e-5);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(out[t * n + i], x[t * n + i] * scale * w[i], 1e-5);
      EXPECT_NEAR(out1[t * n + i], x[t * n + i] * scale * (1 + w[i]), 1e-5);
    }
  }
}

// RoPE rotates pairs by pos * base^(-2i/n_rot) in both layouts, leaves dimensions past n_rot,
// preserves norms, and position 0 is the identity.
TEST(Rope, RotatesPairsInBothLayouts) {
  for (auto layout : {cpu::RopeLayout::normal, cpu::RopeLayout::neox}) {
    cpu::RopeConfig cfg;
    cfg.n_rot = 12;
    cfg.base = 500.0;
    cfg.layout = layout;
    cpu::RopeTable rope(cfg);
    const int64_t hd = 16, heads = 2, pos = 37;
    auto x = random_vec(hd * heads, 5);
    auto y = x;
    std::vector<float> cs(cfg.n_rot);
    rope.angles(pos, cs.data());
    rope.apply(y.data(), heads, hd, cs.data());
    for (int64_t h = 0; h < heads; ++h) {
      for (int i = 0; i < cfg.n_rot / 2; ++i) {
        double th = pos * std::pow(500.0, -2.0 * i / cfg.n_rot);
        int64_t a = layout == cpu::RopeLayout::normal ? 2 * i : i;
        int64_t b = layout == cpu::RopeLayout::normal ? 2 * i + 1 : i + cfg.n_rot / 2;
        double x0 = x[h * hd + a], x1 = x[h * hd + b];
        EXPECT_NEAR(y[h * hd + a], x0 * std::cos(th) - x1 * std::sin(th), 1e-5);
        EXPECT_NEAR(y[h * hd + b], x0 * std::sin(th) + x1 * std::cos(th), 1e-5);
      }
      for (int64_t i = cfg.n_rot; i < hd; ++i) EXPECT_EQ(y[h * hd + i], x[h * hd + i]);
    }
    auto z = x;
    rope.angles(0, cs.data());
    rope.apply(z.data(), heads, hd, cs.data());
    EXPECT_EQ(z, x);
  }
}

TEST(Rope, LinearScalingAndFactorsDivideFrequencies) {
  cpu::RopeConfig a;
  a.n_rot = 4;
  a.linear_scale = 4.0;
  cpu::RopeConfig b;
  b.n_rot = 4;
  cpu::RopeTable ta(a), tb(b);
  std::vector<float> ca(4), cb(4);
  ta.angles(40, ca.data());
  tb.angles(10, cb.data());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(ca[i], cb[i], 1e-6);
  cpu::RopeConfig f = b;
  f.freq_factors = {1.0f, 2.0f};
  cpu::RopeTable tf(f);
  tf.angles(20, ca.data());
  tb.angles(10, cb.data());
  EXPECT_NEAR(ca[2], cb[2], 1e-6);  // second frequency halved: pos 20 behaves like pos 10
  cpu::RopeConfig odd;
  odd.n_rot = 3;
  EXPECT_THROW(cpu::RopeTable{odd}, Error);
}

TEST(Activation, Formulas) {
  EXPECT_NEAR(cpu::activate(cpu::Activation::silu, 1.5f), 1.5 / (1 + std::exp(-1.5)), 1e-6);
  EXPECT_EQ(cpu::activate(cpu::Activation::relu, -2.f), 0.f);
  EXPECT_EQ(cpu::activate(cpu::Activation::relu, 2.5f), 2.5f);
  double x = 0.7;
  double gelu = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  EXPECT_NEAR(cpu::activate(cpu::Activation::gelu_tanh, 0.7f), gelu, 1e-6);
  std::vector<float> g = {-1, 0, 2}, u = {3, 4, 5}, o(3);
  cpu::gated_activation(cpu::Activation::relu, g.data(), u.data(), o.data(), 3);
  EXPECT_EQ(o, (std::vector<float>{0, 0, 10}));
}
