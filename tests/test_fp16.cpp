#include "tensor/fp16.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/cpu/vec.hpp"
#include "support/simd_levels.hpp"

using namespace ember;

// Every half value converts to float and back unchanged (NaNs stay NaN).
TEST(Fp16, RoundTripsAllHalfValues) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f))));
      continue;
    }
    EXPECT_EQ(fp32_to_fp16(f), h) << h;
  }
}

// Float to half rounds to the nearest representable half (checked against neighbours).
TEST(Fp16, RoundsToNearest) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-70000.f, 70000.f);
  for (int i = 0; i < 100000; ++i) {
    float x = dist(rng) * (i % 3 == 0 ? 1e-4f : 1.f);
    uint16_t h = fp32_to_fp16(x);
    float y = fp16_to_fp32(h);
    if (std::isinf(y)) {
      EXPECT_GE(std::fabs(x), 65504.f);
      continue;
    }
    float up = fp16_to_fp32(static_cast<uint16_t>(h + 1));
    float down = fp16_to_fp32(static_cast<uint16_t>(h - 1));
    EXPECT_LE(std::fabs(x - y), std::fabs(x - up)) << x;
    if ((h & 0x7fff) != 0) {
      EXPECT_LE(std::fabs(x - y), std::fabs(x - down)) << x;
    }
  }
}

// The row conversions (F16C / AVX-512 at those levels) give fp32_to_fp16's bits for every value
// class: ties to even, subnormals, overflow to infinity, signed zeros; at lengths with tails; and
// back, fp16_to_fp32's.
TEST(Fp16, RowConversionMatchesScalarAtEveryLevel) {
  test_support::SimdGuard guard;
  std::mt19937 rng(7);
  std::vector<float> x;
  for (uint32_t h = 0; h < 65536; ++h) {  // every half value, and the midpoints above them
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    x.push_back(f);
    const float next = fp16_to_fp32(static_cast<uint16_t>(h + 1));
    if (!std::isnan(next) && !std::isinf(next) && !std::isinf(f)) x.push_back(0.5f * (f + next));
  }
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int i = 0; i < 20000; ++i) x.push_back(dist(rng) * std::pow(2.0f, static_cast<float>(i % 60 - 40)));
  for (float f : {0.0f, -0.0f, 65504.f, 65519.f, 65520.f, 1e30f, -1e30f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::denorm_min()})
    x.push_back(f);
  for (SimdLevel level : test_support::simd_levels()) {
    set_simd_level(level);
    for (size_t n : {x.size(), size_t{1}, size_t{15}, size_t{17}, size_t{33}}) {
      std::vector<uint16_t> y(n + 1, 0xABCD);
      cpu::to_f16(x.data(), y.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], fp32_to_fp16(x[i])) << x[i] << " " << simd_level_name(level);
      EXPECT_EQ(y[n], 0xABCD) << "wrote past the end";
      // And back: the widening is exact.
      std::vector<float> back(n + 1, -7.0f);
      cpu::from_f16(y.data(), back.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], fp16_to_fp32(y[i])) << y[i] << " " << simd_level_name(level);
      EXPECT_EQ(back[n], -7.0f) << "wrote past the end";
    }
  }
}

TEST(Bf16, RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to even (1.0).
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
}
