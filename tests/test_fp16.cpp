#include "tensor/fp16.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

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

TEST(Bf16, RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to even (1.0).
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
}
