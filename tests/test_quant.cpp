#include "tensor/quant.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "tensor/fp16.hpp"

using namespace ember;

namespace {

std::vector<float> random_floats(int64_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  // Some outliers and a constant run make the per-block ranges uneven.
  for (size_t i = 0; i < v.size(); i += 97) v[i] *= 6.f;
  for (size_t i = 64; i < std::min<size_t>(v.size(), 96); ++i) v[i] = 0.75f;
  return v;
}

std::vector<float> round_trip(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_bytes(t, static_cast<int64_t>(x.size())));
  quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}

float block_amax(const std::vector<float>& x, size_t i, size_t bs) {
  size_t b = i / bs * bs;
  float m = 0.f;
  for (size_t j = b; j < b + bs; ++j) m = std::max(m, std::fabs(x[j]));
  return m;
}

}  // namespace

TEST(Quant, FloatTypesRoundTrip) {
  const auto x = random_floats(1024, 1);
  EXPECT_EQ(round_trip(DType::F32, x), x);
  const auto h = round_trip(DType::F16, x);
  const auto b = round_trip(DType::BF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_LE(std::fabs(h[i] - x[i]), std::fabs(x[i]) * 0x1p-11f) << i;
    EXPECT_LE(std::fabs(b[i] - x[i]), std::fabs(x[i]) * 0x1p-8f) << i;
  }
}

// 8-bit symmetric types: error at most half a step (d = amax / 127) plus the fp16 rounding of d.
TEST(Quant, Q8ErrorBounds) {
  const auto x = random_floats(2048, 2, 3.f);
  for (DType t : {DType::Q8_0, DType::Q8_1, DType::Q8_K}) {
    const size_t bs = static_cast<size_t>(info(t).block_size);
    const auto y = round_trip(t, x);
    for (size_t i = 0; i < x.size(); ++i) {
      const float d = block_amax(x, i, bs) / 127.f;
      const float bound = t == DType::Q8_K ? 0.5001f * d : 0.5f * d + 127.f * d * 0x1p-11f + 1e-7f;
      ASSERT_LE(std::fabs(y[i] - x[i]), bound) << dtype_name(t) << " element " << i;
    }
  }
}

TEST(Quant, Q4_0ErrorBound) {
  const auto x = random_floats(2048, 3);
  const auto y = round_trip(DType::Q4_0, x);
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = block_amax(x, i, 32) / 8.f;
    // Half a step, except the value opposite the max may clip by a whole step.
    ASSERT_LE(std::fabs(y[i] - x[i]), d * (1.f + 0x1p-8f)) << i;
  }
  double err = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) err += (y[i] - x[i]) * (y[i] - x[i]), ref += x[i] * x[i];
  EXPECT_LT(std::sqrt(err / ref), 0.12);
}

TEST(Quant, Q4_1ErrorBound) {
  const auto x = random_floats(2048, 4);
  const auto y = round_trip(DType::Q4_1, x);
  for (size_t i = 0; i < x.size(); i += 32) {
    const auto [lo, hi] = std::minmax_element(x.begin() + i, x.begin() + i + 32);
    const float d = (*hi - *lo) / 15.f;
    for (size_t j = i; j < i + 32; ++j)
      ASSERT_LE(std::fabs(y[j] - x[j]), 0.5f * d + 16.f * d * 0x1p-11f + std::fabs(*lo) * 0x1p-10f) << j;
  }
}

TEST(Quant, Q6_KRelativeError) {
  const auto x = random_floats(4096, 5);
  const auto y = round_trip(DType::Q6_K, x);
  double err = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) err += (y[i] - x[i]) * (y[i] - x[i]), ref += x[i] * x[i];
  EXPECT_LT(std::sqrt(err / ref), 0.03);
  // Each element within about one step of its 16-element group.
  for (size_t i = 0; i < x.size(); ++i) ASSERT_LE(std::fabs(y[i] - x[i]), block_amax(x, i, 16) / 16.f + 1e-6f) << i;
}

// The element codes the CUDA device's layout and its tests read (q4_k_code, q5_k_code,
// q6_k_code) are the ones dequantization uses: on random blocks every element's value is d sc
// code - dmin m (Q4_K, Q5_K) or d sc code (Q6_K, scale of its 16), exactly.
TEST(Quant, KQuantElementCodesMatchDequantization) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(4 * kQK_K), y(x.size());
  for (auto& v : x) v = nd(rng);
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    std::vector<uint8_t> q(row_bytes(t, static_cast<int64_t>(x.size())));
    quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
    dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(x.size()));
    const size_t sb = row_bytes(t, kQK_K);
    for (size_t b = 0; b < x.size() / kQK_K; ++b)
      for (int e = 0; e < kQK_K; ++e) {
        const uint8_t* blk = q.data() + b * sb;
        float want = 0.0f;
        if (t == DType::Q6_K) {
          const auto& k = *reinterpret_cast<const BlockQ6_K*>(blk);
          want = fp16_to_fp32(k.d) * static_cast<float>(k.scales[e / 16]) * static_cast<float>(q6_k_code(k, e));
        } else {
          const auto& k4 = *reinterpret_cast<const BlockQ4_K*>(blk);
          const auto& k5 = *reinterpret_cast<const BlockQ5_K*>(blk);
          const bool five = t == DType::Q5_K;
          uint8_t sc, m;
          kquant_scale_min(five ? k5.scales : k4.scales, e / 32, sc, m);
          const int code = five ? q5_k_code(k5, e) : q4_k_code(k4, e);
          want = fp16_to_fp32(five ? k5.d : k4.d) * static_cast<float>(sc) * static_cast<float>(code) -
                 fp16_to_fp32(five ? k5.dmin : k4.dmin) * static_cast<float>(m);
        }
        ASSERT_NEAR(y[b * kQK_K + e], want, 1e-6f * (std::fabs(want) + 1.0f)) << dtype_name(t) << " element " << e;
      }
  }
}

TEST(Quant, Q8_1AndQ8_KSums) {
  const auto x = random_floats(512, 6);
  std::vector<BlockQ8_1> b1(512 / 32);
  quantize_row(DType::Q8_1, x.data(), b1.data(), 512);
  for (const auto& b : b1) {
    int sum = 0;
    for (int8_t q : b.qs) sum += q;
    EXPECT_NEAR(fp16_to_fp32(b.s), fp16_to_fp32(b.d) * sum, std::fabs(fp16_to_fp32(b.d) * sum) * 2e-3f + 1e-6f);  // s uses the unrounded d
  }
  std::vector<BlockQ8_K> bk(2);
  quantize_row(DType::Q8_K, x.data(), bk.data(), 512);
  for (const auto& b : bk)
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += b.qs[16 * g + j];
      EXPECT_EQ(b.bsums[g], sum);
    }
}

TEST(Quant, ZerosStayZero) {
  std::vector<float> x(256, 0.f);
  for (DType t : {DType::Q8_0, DType::Q8_1, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q4_K,
                  DType::Q5_K, DType::Q6_K, DType::Q8_K})
    for (float v : round_trip(t, x)) ASSERT_EQ(v, 0.f) << dtype_name(t);
}

// ---- hand-made blocks ------------------------------------------------------------------

TEST(Quant, KnownFloatBits) {
  const uint16_t h[4] = {0x3C00, 0xC000, 0x3800, 0x0000};
  float y[4];
  dequantize_row(DType::F16, h, y, 4);
  EXPECT_EQ(y[0], 1.f); EXPECT_EQ(y[1], -2.f); EXPECT_EQ(y[2], 0.5f); EXPECT_EQ(y[3], 0.f);
  const uint16_t b[3] = {0x3F80, 0xC040, 0x4120};
  dequantize_row(DType::BF16, b, y, 3);
  EXPECT_EQ(y[0], 1.f); EXPECT_EQ(y[1], -3.f); EXPECT_EQ(y[2], 10.f);
}

TEST(Quant, KnownQ4_0Block) {
  BlockQ4_0 b;
  b.d = 0x3800;  // 0.5
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  float y[32];
  dequantize_row(DType::Q4_0, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 8)) << j;              // low nibbles: elements 0..15
    EXPECT_EQ(y[j + 16], 0.5f * (15 - j - 8)) << j;    // high nibbles: elements 16..31
  }
}

TEST(Quant, KnownQ4_1Block) {
  BlockQ4_1 b;
  b.d = 0x3400;  // 0.25
  b.m = 0xBC00;  // -1
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>((j * 7) % 16 | j << 4);
  float y[32];
  dequantize_row(DType::Q4_1, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * ((j * 7) % 16) - 1.f) << j;
    EXPECT_EQ(y[j + 16], 0.25f * j - 1.f) << j;
  }
}

TEST(Quant, KnownQ8_0Block) {
  BlockQ8_0 b[2];
  b[0].d = 0x4000;  // 2
  b[1].d = 0xB800;  // -0.5
  for (int j = 0; j < 32; ++j) b[0].qs[j] = static_cast<int8_t>(j - 16), b[1].qs[j] = static_cast<int8_t>(127 - 8 * j);
  float y[64];
  dequantize_row(DType::Q8_0, b, y, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(y[j], 2.f * (j - 16));
    EXPECT_EQ(y[32 + j], -0.5f * (127 - 8 * j));
  }
}

// Q6_K packed by hand from the layout description: element i of a super-block lives in half
// h = i / 128; with w = i % 128, quarter c = w / 32 and l = w % 32 its low 4 bits are the
// (c >= 2 ? high : low) nibble of ql[64h + l + 32 (c & 1)] and its high 2 bits are bits 2c, 2c+1
// of qh[32h + l]; its scale is scales[i / 16].
TEST(Quant, KnownQ6_KBlock) {
  BlockQ6_K b;
  std::memset(&b, 0, sizeof(b));
  b.d = 0x3C00;  // 1
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 37 + 11) % 64;
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(g * 9 - 70);
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, w = i % 128, c = w / 32, l = w % 32;
    uint8_t& lo = b.ql[64 * h + l + 32 * (c & 1)];
    lo |= static_cast<uint8_t>((q[i] & 0x0F) << (c >= 2 ? 4 : 0));
    b.qh[32 * h + l] |= static_cast<uint8_t>((q[i] >> 4) << (2 * c));
  }
  float y[256];
  dequantize_row(DType::Q6_K, &b, y, 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], static_cast<float>(b.scales[i / 16] * (q[i] - 32))) << i;
  // The quantizer packs the same layout: quantizing these values gives them back up to the
  // rounding of the group scales to 8 bits.
  std::vector<float> x(y, y + 256);
  const auto z = round_trip(DType::Q6_K, x);
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(z[i], y[i], 0.004f * std::fabs(y[i]) + 0.5f * std::fabs(b.scales[i / 16])) << i;
}

TEST(Quant, RejectsPartialBlocks) {
  std::vector<float> x(40, 1.f);
  std::vector<uint8_t> q(64);
  EXPECT_THROW(quantize_row(DType::Q4_0, x.data(), q.data(), 40), Error);
  EXPECT_THROW(dequantize_row(DType::Q6_K, q.data(), x.data(), 32), Error);
  EXPECT_THROW(dequantize_row(DType::Q5_0, q.data(), x.data(), 16), Error);
  EXPECT_THROW(dequantize_row(DType::Q4_K, q.data(), x.data(), 32), Error);
}

// Q5_0 / Q5_1: low 4 bits as Q4_0 (element j < 16 in the low nibble of qs[j], j + 16 in the high
// nibble), bit 4 of element j in bit j of the little-endian 32-bit qh.
TEST(Quant, KnownQ5_0AndQ5_1Blocks) {
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = (j * 13 + 5) % 32;
  uint32_t qh = 0;
  uint8_t qs[16];
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 15) | (q[j + 16] & 15) << 4);
  for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
  BlockQ5_0 b0;
  b0.d = 0xB800;  // -0.5
  std::memcpy(b0.qh, &qh, 4);
  std::memcpy(b0.qs, qs, 16);
  BlockQ5_1 b1;
  b1.d = 0x3400;  // 0.25
  b1.m = 0xC000;  // -2
  std::memcpy(b1.qh, &qh, 4);
  std::memcpy(b1.qs, qs, 16);
  float y0[32], y1[32];
  dequantize_row(DType::Q5_0, &b0, y0, 32);
  dequantize_row(DType::Q5_1, &b1, y1, 32);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(y0[j], -0.5f * (q[j] - 16)) << j;
    EXPECT_EQ(y1[j], 0.25f * q[j] - 2.f) << j;
  }
}

namespace {
// Packs 6-bit sub-block scales and mins as ggml does (written from the layout, not the decoder):
// j < 4: low 6 bits of bytes j (scale) and j + 4 (min); j >= 4: low / high nibble of byte j + 4,
// top 2 bits in bits 6-7 of bytes j - 4 (scale) and j (min).
void pack_scales(const int sc[8], const int m[8], uint8_t out[12]) {
  std::memset(out, 0, 12);
  for (int j = 0; j < 4; ++j) {
    out[j] |= static_cast<uint8_t>(sc[j]);
    out[j + 4] |= static_cast<uint8_t>(m[j]);
  }
  for (int j = 4; j < 8; ++j) {
    out[j + 4] = static_cast<uint8_t>((sc[j] & 15) | (m[j] & 15) << 4);
    out[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
    out[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
  }
}
}  // namespace

// Q4_K / Q5_K: element i of the super-block is in sub-block j = i / 32 (scale sc[j], min m[j]);
// with c = i / 64, l = i % 32 its low 4 bits are the (j odd ? high : low) nibble of qs[32c + l]
// and (Q5_K) its bit 4 is bit j of qh[l]. Value: d * sc[j] * q - dmin * m[j].
TEST(Quant, KnownQ4_KAndQ5_KBlocks) {
  int sc[8], m[8], q[256];
  for (int j = 0; j < 8; ++j) sc[j] = (j * 23 + 7) % 64, m[j] = (j * 41 + 3) % 64;
  for (int i = 0; i < 256; ++i) q[i] = (i * 29 + 3) % 32;
  BlockQ4_K b4;
  BlockQ5_K b5;
  std::memset(&b4, 0, sizeof(b4));
  std::memset(&b5, 0, sizeof(b5));
  b4.d = b5.d = 0x3800;     // 0.5
  b4.dmin = b5.dmin = 0x3400;  // 0.25
  pack_scales(sc, m, b4.scales);
  pack_scales(sc, m, b5.scales);
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32, c = i / 64, l = i % 32;
    b4.qs[32 * c + l] |= static_cast<uint8_t>((q[i] & 15) << (j % 2 ? 4 : 0));
    b5.qs[32 * c + l] |= static_cast<uint8_t>((q[i] & 15) << (j % 2 ? 4 : 0));
    b5.qh[l] |= static_cast<uint8_t>((q[i] >> 4) << j);
  }
  float y4[256], y5[256];
  dequantize_row(DType::Q4_K, &b4, y4, 256);
  dequantize_row(DType::Q5_K, &b5, y5, 256);
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32;
    EXPECT_EQ(y4[i], 0.5f * sc[j] * (q[i] & 15) - 0.25f * m[j]) << i;
    EXPECT_EQ(y5[i], 0.5f * sc[j] * q[i] - 0.25f * m[j]) << i;
  }
  // The quantizers pack the same layout: quantizing the values gives them back closely.
  for (DType t : {DType::Q4_K, DType::Q5_K}) {
    std::vector<float> x(t == DType::Q4_K ? y4 : y5, (t == DType::Q4_K ? y4 : y5) + 256);
    const auto z = round_trip(t, x);
    for (int i = 0; i < 256; ++i) EXPECT_NEAR(z[i], x[i], 0.75f * 0.5f * sc[i / 32] + 1.f) << dtype_name(t) << " " << i;
  }
}

// 5-bit and K-quant types: error within about one quantization step of the (sub-)block range.
TEST(Quant, FiveBitAndKQuantErrors) {
  const auto x = random_floats(4096, 7);
  const struct { DType t; size_t group; float levels; double rel; } cases[] = {
      {DType::Q5_0, 32, 31.f, 0.08}, {DType::Q5_1, 32, 31.f, 0.06}, {DType::Q4_K, 32, 15.f, 0.12},
      {DType::Q5_K, 32, 31.f, 0.06}};
  for (const auto& c : cases) {
    const auto y = round_trip(c.t, x);
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) err += (y[i] - x[i]) * (y[i] - x[i]), ref += x[i] * x[i];
    EXPECT_LT(std::sqrt(err / ref), c.rel) << dtype_name(c.t);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_LE(std::fabs(y[i] - x[i]), 2.f * block_amax(x, i, c.group) / c.levels * 1.1f + 1e-6f)
          << dtype_name(c.t) << " " << i;
  }
}

// ---- Q2_K / Q3_K ------------------------------------------------------------------------

namespace {
// A block of n bytes filled by a formula, with the fp16 fields set by the caller.
std::vector<uint8_t> pattern_block(int n, int mul, int add, int x) {
  std::vector<uint8_t> b(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(((i * mul + add) ^ (i * x)) & 0xFF);
  return b;
}

struct Probe {
  int i;
  float v;
};

void expect_gguf_py(DType t, const std::vector<uint8_t>& b, const std::vector<Probe>& probes, double sum,
                    double weighted) {
  float y[256];
  dequantize_row(t, b.data(), y, 256);
  double s = 0, ws = 0;
  for (int i = 0; i < 256; ++i) s += y[i], ws += std::fabs(static_cast<double>(y[i])) * i;
  EXPECT_EQ(s, sum) << dtype_name(t);
  EXPECT_EQ(ws, weighted) << dtype_name(t);
  for (const Probe& p : probes) EXPECT_EQ(y[p.i], p.v) << dtype_name(t) << " element " << p.i;
}
}  // namespace

// Blocks of formula bytes dequantize to the values gguf-py's reference dequantizer gives for the
// same bytes (llama.cpp c392e509, gguf-py/gguf/quants.py): a few elements, the sum and the sum of
// |y_i| * i (all values are exact in float).
TEST(Quant, Q2_KAndQ3_KMatchGgufPy) {
  auto b2 = pattern_block(84, 37, 11, 5);
  const uint16_t half = 0x3800, eighth = 0x3000, quarter = 0x3400;  // 0.5, 0.125, 0.25
  std::memcpy(b2.data() + 80, &half, 2);
  std::memcpy(b2.data() + 82, &eighth, 2);
  expect_gguf_py(DType::Q2_K, b2,
                 {{0, 16.5f}, {1, 5.5f}, {15, 5.5f}, {16, 7.125f}, {31, 2.125f}, {32, 14.375f}, {63, 6.625f},
                  {64, -1.0f}, {100, 5.125f}, {127, -0.25f}, {128, 16.375f}, {150, 6.625f}, {191, 6.375f},
                  {200, 14.625f}, {240, -0.875f}, {255, 18.625f}},
                 2040.5, 265979.75);
  auto b3 = pattern_block(110, 53, 7, 3);
  std::memcpy(b3.data() + 108, &quarter, 2);
  expect_gguf_py(DType::Q3_K, b3,
                 {{0, 17.25f}, {1, 17.25f}, {15, 17.25f}, {16, 23.25f}, {31, 23.25f}, {32, 5.75f}, {63, 23.25f},
                  {64, 0.0f}, {100, 9.0f}, {127, 15.5f}, {128, -7.0f}, {150, 14.25f}, {191, 7.5f}, {200, -2.25f},
                  {240, 7.5f}, {255, 5.0f}},
                 1272.75, 306222.75);
}

// Q2_K / Q3_K packed by hand from the layout description: element e = 128n + 32j + l has its 2
// low bits at bits 2j of qs[32n + l], (Q3_K) its high bit at bit 4n + j of hmask[l], sub-block
// g = e / 16. Q2_K: d * sc[g] * q - dmin * m[g], scales[g] = sc | m << 4. Q3_K: d * s[g] * q
// with q = low + 4 * high - 4 and 6-bit s + 32 split into a nibble (byte g % 8, low for g < 8)
// and 2 bits (bits 2 * (g / 4) of byte 8 + g % 4).
TEST(Quant, KnownQ2_KAndQ3_KBlocks) {
  BlockQ2_K b2;
  BlockQ3_K b3;
  std::memset(&b2, 0, sizeof(b2));
  std::memset(&b3, 0, sizeof(b3));
  b2.d = b3.d = 0x3800;  // 0.5
  b2.dmin = 0x3400;      // 0.25
  int sc[16], m[16], s[16], q[256];
  for (int g = 0; g < 16; ++g) {
    sc[g] = (g * 7 + 3) % 16, m[g] = (g * 5 + 1) % 16, s[g] = (g * 13 + 5) % 64 - 32;
    b2.scales[g] = static_cast<uint8_t>(sc[g] | m[g] << 4);
    const int u = s[g] + 32;
    b3.scales[g % 8] |= static_cast<uint8_t>((u & 15) << (g < 8 ? 0 : 4));
    b3.scales[8 + g % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (g / 4)));
  }
  for (int e = 0; e < 256; ++e) {
    q[e] = (e * 11 + 3) % 8;  // 3-bit unsigned: Q2_K uses its low 2 bits
    const int n = e / 128, j = (e % 128) / 32, l = e % 32;
    b2.qs[32 * n + l] |= static_cast<uint8_t>((q[e] & 3) << (2 * j));
    b3.qs[32 * n + l] |= static_cast<uint8_t>((q[e] & 3) << (2 * j));
    b3.hmask[l] |= static_cast<uint8_t>((q[e] >> 2) << (4 * n + j));
  }
  float y2[256], y3[256];
  dequantize_row(DType::Q2_K, &b2, y2, 256);
  dequantize_row(DType::Q3_K, &b3, y3, 256);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 16;
    EXPECT_EQ(y2[e], 0.5f * sc[g] * (q[e] & 3) - 0.25f * m[g]) << e;
    EXPECT_EQ(y3[e], 0.5f * s[g] * (q[e] - 4)) << e;
  }
  // The quantizers pack the same layout: the values come back within a step of their group.
  for (DType t : {DType::Q2_K, DType::Q3_K}) {
    const float* y = t == DType::Q2_K ? y2 : y3;
    const std::vector<float> x(y, y + 256);
    const auto z = round_trip(t, x);
    for (int e = 0; e < 256; ++e) {
      const float step = t == DType::Q2_K ? (0.5f * sc[e / 16] + 0.25f * m[e / 16]) / 3.f * 1.1f + 0.6f
                                          : 0.5f * std::abs(s[e / 16]) * 1.1f + 1.1f;
      EXPECT_NEAR(z[e], x[e], step) << dtype_name(t) << " " << e;
    }
  }
}

// Q2_K / Q3_K on random data: the error is within about one step of the 16-element group range.
TEST(Quant, Q2_KAndQ3_KErrors) {
  const auto x = random_floats(4096, 11);
  for (DType t : {DType::Q2_K, DType::Q3_K}) {
    const auto y = round_trip(t, x);
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) err += (y[i] - x[i]) * (y[i] - x[i]), ref += x[i] * x[i];
    EXPECT_LT(std::sqrt(err / ref), t == DType::Q2_K ? 0.45 : 0.25) << dtype_name(t);
    const float levels = t == DType::Q2_K ? 3.f : 4.f;
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_LE(std::fabs(y[i] - x[i]), 2.5f * block_amax(x, i, 16) / levels + 1e-6f) << dtype_name(t) << " " << i;
  }
  std::vector<float> zeros(256, 0.f);
  for (DType t : {DType::Q2_K, DType::Q3_K})
    for (float v : round_trip(t, zeros)) ASSERT_EQ(v, 0.f) << dtype_name(t);
}

// Every row of the type table (tensor/dtype.cpp) against the others: a type Ember computes with
// converts both ways within the coarsest type's step (2^-2 of the block's largest value: Q2_K),
// its dot products' activation type is one Ember quantizes to, its repacked form names it back
// with the same block bytes and the same activations, and what `ember synth` writes is
// declared by a llama_ftype no two types share.
TEST(Quant, TypeTableRowsAgree) {
  const auto x = random_floats(512, 9);
  std::vector<int> file_types;
  int supported = 0;
  std::vector<DType> types = {DType::Q4_0_R16, DType::Q4_1_R16, DType::Q5_0_R16, DType::Q8_0_R16, DType::Q4_K_R16,
                               DType::Q5_K_R16,  DType::Q6_K_R16, DType::Q4_0_NM,  DType::Q4_1_NM,  DType::Q4_0_NM8,
                               DType::Q4_1_NM8};
  for (uint32_t id = 0; id < 64; ++id)
    if (dtype_info(id)) types.push_back(static_cast<DType>(id));
  for (DType t : types) {
    const bool own = static_cast<uint32_t>(t) >= 0x10000;
    const DTypeInfo& i = info(t);
    SCOPED_TRACE(std::string(i.name));
    EXPECT_EQ(dtype_from_name(i.name), own ? std::nullopt : std::optional<DType>(t));
    if (dtype_supported(t)) {
      ++supported;
      EXPECT_FALSE(own);
      const auto y = round_trip(t, x);
      for (size_t j = 0; j < x.size(); ++j)
        EXPECT_LE(std::fabs(y[j] - x[j]), 0.25f * block_amax(x, j, static_cast<size_t>(i.block_size)) + 1e-6f) << j;
      ASSERT_TRUE(i.dot.has_value());
      EXPECT_TRUE(info(*i.dot).from_float != nullptr);
    }
    if (i.repacked) {
      const DTypeInfo& r = info(*i.repacked);
      EXPECT_EQ(r.base, std::optional<DType>(t));
      EXPECT_EQ(r.block_size, i.block_size);
      EXPECT_EQ(r.block_bytes, i.block_bytes);
      EXPECT_EQ(r.dot, i.dot);
    }
    if (i.base) {
      EXPECT_TRUE(own);
    }
    if (dtype_writable(t)) {
      EXPECT_GE(i.file_type, 0);
      EXPECT_EQ(std::count(file_types.begin(), file_types.end(), i.file_type), 0);
      file_types.push_back(i.file_type);
    }
  }
  EXPECT_EQ(supported, 13);  // F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K
  EXPECT_EQ(file_types.size(), 13u);
}
