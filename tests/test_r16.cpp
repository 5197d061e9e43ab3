// Matrices repacked 16 rows at a time (Q4_0_R16, Q4_1_R16, Q5_0_R16, Q8_0_R16, Q4_K_R16, Q5_K_R16, Q6_K_R16): layout
// round trip, single rows read back through get_rows, and the products
// (scalar and AVX-512) against a double-precision reference, the file layout's product and each
// other, on awkward shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/error.hpp"
#include "core/thread_pool.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/r16/r16.hpp"
#include "ops/cpu/r16/r16_kernels.hpp"
#include "support/random_acts.hpp"
#include "support/simd_levels.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

using namespace ember;

namespace {

struct Packed {
  std::vector<uint8_t> plain;
  AlignedBuffer<uint8_t> packed;
  TensorView plain_view, packed_view;
};

Packed random_matrix(DType type, int64_t rows, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  Packed p;
  const size_t stride = row_bytes(type, k);
  p.plain.resize(stride * rows);
  std::vector<float> row(k);
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& x : row) x = dist(rng) * (0.3f + static_cast<float>(r % 5));
    quantize_row(type, row.data(), p.plain.data() + r * stride, k);
  }
  p.packed.resize(p.plain.size());
  cpu::repack_r16(type, p.plain.data(), rows, k, p.packed.data());
  for (TensorView* v : {&p.plain_view, &p.packed_view}) {
    v->name = "W";
    v->n_dims = 2;
    v->ne[0] = k;
    v->ne[1] = rows;
    v->nbytes = p.plain.size();
  }
  p.plain_view.type = type;
  p.plain_view.data = p.plain.data();
  p.packed_view.type = cpu::r16_type(type);
  p.packed_view.data = p.packed.data();
  return p;
}

using test_support::random_acts;

std::vector<float> product(ThreadPool& pool, const TensorView& W, const std::vector<float>& X, int64_t n) {
  AlignedBuffer<uint8_t> scratch(cpu::matmul_scratch_bytes(W.type, W.cols(), n));
  std::vector<float> y(n * W.rows(), NAN);
  cpu::matmul(pool, W, X.data(), n, y.data(), scratch.data());
  return y;
}

struct Shape {
  int64_t rows, k;
};
// k of 1, 3, 25 and 176 blocks; 16, 48 and 208 rows (one, three and thirteen groups).
const Shape kShapes[] = {{16, 32}, {48, 96}, {208, 800}, {32, 5632}, {16, 2048}};
// Q6_K: k of 1, 3, 5 and 22 super-blocks.
const Shape kShapesK[] = {{16, 256}, {48, 768}, {208, 1280}, {32, 5632}};
const DType kTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};
bool is_k(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }
std::vector<Shape> shapes(DType t) {
  return is_k(t) ? std::vector<Shape>(std::begin(kShapesK), std::end(kShapesK))
                          : std::vector<Shape>(std::begin(kShapes), std::end(kShapes));
}
const int64_t kTokens[] = {1, 2, 3, 4, 5, 7, 12, 67};

}  // namespace

TEST(R16, Q4RepackRoundTripsAndKeepsSize) {
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0})
    for (const Shape& s : kShapes) {
      ASSERT_TRUE(cpu::r16_unpackable(type));
      Packed p = random_matrix(type, s.rows, s.k, 7);
      std::vector<uint8_t> back(p.plain.size());
      cpu::unpack_r16(type, p.packed.data(), s.rows, s.k, back.data());
      EXPECT_EQ(back, p.plain) << dtype_name(type) << " " << s.rows << " x " << s.k;
      // Single rows of the repacked matrix (the token embedding when it is also the output
      // matrix) read back as the plain rows do.
      std::vector<int32_t> ids;
      for (int64_t r = s.rows - 1; r >= 0; r -= 5) ids.push_back(static_cast<int32_t>(r));
      std::vector<float> from_plain(ids.size() * s.k), from_packed(ids.size() * s.k);
      cpu::get_rows(p.plain_view, ids.data(), static_cast<int64_t>(ids.size()), from_plain.data());
      cpu::get_rows(p.packed_view, ids.data(), static_cast<int64_t>(ids.size()), from_packed.data());
      EXPECT_EQ(from_packed, from_plain) << dtype_name(type) << " " << s.rows << " x " << s.k;
      // Group g starts where row 16g did, and its first block's scales are rows 16g..16g+15's.
      if (s.rows < 32) continue;
      const size_t stride = row_bytes(type, s.k);
      EXPECT_EQ(p.packed_view.row(16), p.packed.data() + 16 * stride);
      EXPECT_EQ(std::memcmp(p.packed.data() + 16 * stride + 2, p.plain.data() + 17 * stride, 2), 0);
    }
}

// The Q4_K, Q5_K and Q6_K repackings take a group's 16 rows at once on vectors: the same bytes as row by
// row, on random bytes (every bit of the scales and mins, every nibble) and on quantized rows.
TEST(R16, KRepackOfSixteenRowsEqualsRowByRow) {
  using Repack = void (*)(const void*, int64_t, int64_t, void*);
  const struct {
    DType type;
    Repack fast, rows;
  } kinds[] = {{DType::Q4_K, &cpu::detail::repack_q4_k_r16, &cpu::detail::repack_q4_k_r16_rows},
               {DType::Q5_K, &cpu::detail::repack_q5_k_r16, &cpu::detail::repack_q5_k_r16_rows},
               {DType::Q6_K, &cpu::detail::repack_q6_k_r16, &cpu::detail::repack_q6_k_r16_rows}};
  std::mt19937 rng(11);
  for (const auto& kind : kinds)
    for (const Shape& s : kShapesK) {
      const size_t n = row_bytes(kind.type, s.k) * static_cast<size_t>(s.rows);
      std::vector<uint8_t> bytes(n), fast(n, 0xAA), rows(n, 0x55);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      kind.fast(bytes.data(), s.rows, s.k, fast.data());
      kind.rows(bytes.data(), s.rows, s.k, rows.data());
      EXPECT_EQ(fast, rows) << dtype_name(kind.type) << " " << s.rows << " x " << s.k;
      Packed p = random_matrix(kind.type, s.rows, s.k, 5);
      std::vector<uint8_t> by_rows(p.plain.size());
      kind.rows(p.plain.data(), s.rows, s.k, by_rows.data());
      EXPECT_EQ(std::memcmp(by_rows.data(), p.packed.data(), by_rows.size()), 0)
          << dtype_name(kind.type) << " " << s.rows << " x " << s.k;
    }
}

TEST(R16, RejectsShapesItCannotHold) {
  std::vector<uint8_t> a(18 * 17), b(a.size());
  EXPECT_THROW(cpu::repack_r16(DType::Q4_0, a.data(), 17, 32, b.data()), Error);
  EXPECT_THROW(cpu::repack_r16(DType::Q4_1, a.data(), 16, 48, b.data()), Error);
  std::vector<uint8_t> c(210 * 32), d(c.size());
  EXPECT_THROW(cpu::repack_r16(DType::Q6_K, c.data(), 16, 512 + 32, d.data()), Error);
  EXPECT_THROW(cpu::repack_r16(DType::Q6_K, c.data(), 8, 256, d.data()), Error);
  EXPECT_THROW(cpu::repack_r16(DType::Q4_K, c.data(), 16, 256 + 32, d.data()), Error);
  EXPECT_THROW(cpu::repack_r16(DType::Q4_K, c.data(), 24, 256, d.data()), Error);
  EXPECT_THROW(cpu::repack_r16(DType::Q8_0, c.data(), 16, 48, d.data()), Error);
  EXPECT_THROW(cpu::repack_r16(DType::Q8_1, c.data(), 16, 32, d.data()), Error);
  EXPECT_FALSE(cpu::r16_unpackable(DType::Q6_K));
}

// Against a double-precision dot of the dequantized weights and 8-bit activations (Q8_0, Q8_K),
// at every SIMD level; the scalar and AVX-512 kernels agree bit for bit (same operations in the
// same order).
TEST(R16, ProductMatchesReferenceAtEveryLevel) {
  test_support::SimdGuard guard;
  ThreadPool pool(2);
  for (DType type : kTypes)
    for (const Shape& s : shapes(type)) {
      Packed p = random_matrix(type, s.rows, s.k, static_cast<uint32_t>(s.rows * 31 + s.k));
      const DType at = is_k(type) ? DType::Q8_K : type == DType::Q4_1 ? DType::Q8_1 : DType::Q8_0;
      std::vector<float> wd(s.rows * s.k);
      for (int64_t r = 0; r < s.rows; ++r) dequantize_row(type, p.plain_view.row(r), wd.data() + r * s.k, s.k);
      for (int64_t n : kTokens) {
        const std::vector<float> X = random_acts(n, s.k, static_cast<uint32_t>(n + s.k));
        std::vector<uint8_t> xq(row_bytes(at, s.k) * n);
        cpu::quantize_activations(type, X.data(), n, s.k, xq.data());
        std::vector<float> xd(n * s.k);
        for (int64_t t = 0; t < n; ++t)
          dequantize_row(at, xq.data() + t * row_bytes(at, s.k), xd.data() + t * s.k, s.k);
        std::vector<float> first;
        for (SimdLevel level : test_support::simd_levels()) {
          set_simd_level(level);
          const std::vector<float> y = product(pool, p.packed_view, X, n);
          const std::vector<float> plain = product(pool, p.plain_view, X, n);
          for (int64_t t = 0; t < n; ++t)
            for (int64_t r = 0; r < s.rows; ++r) {
              double ref = 0, l1 = 0;
              for (int64_t i = 0; i < s.k; ++i) {
                const double v = static_cast<double>(wd[r * s.k + i]) * xd[t * s.k + i];
                ref += v;
                l1 += std::fabs(v);
              }
              // Q4_1 x Q8_1 adds m * s per block with s = d * sum(q) stored in fp16 (as ggml does):
              // up to an fp16 ulp of s times |m| off the exact dot.
              double slack = 0;
              if (type == DType::Q4_1)
                for (int64_t b = 0; b < s.k / 32; ++b) {
                  const auto& wb = reinterpret_cast<const BlockQ4_1*>(p.plain_view.row(r))[b];
                  const auto& xb = reinterpret_cast<const BlockQ8_1*>(xq.data() + t * row_bytes(at, s.k))[b];
                  slack += std::fabs(fp16_to_fp32(wb.m) * fp16_to_fp32(xb.s)) * 0x1p-10;
                }
              const size_t i = t * s.rows + r;
              ASSERT_NEAR(y[i], ref, 1e-5 * l1 + slack + 1e-30)
                  << dtype_name(type) << " " << s.rows << "x" << s.k << " n=" << n << " t=" << t << " r=" << r;
              ASSERT_NEAR(y[i], plain[i], 2e-5 * l1 + 1e-30);
            }
          if (first.empty())
            first = y;
          else
            ASSERT_EQ(y, first) << "level " << simd_level_name(level) << " differs from scalar";
        }
      }
    }
}

TEST(R16, SameResultForAnyThreadCountAndFusedCalls) {
  for (DType type : kTypes) {
    Packed q = random_matrix(type, 96, 2048, 3), u = random_matrix(type, 96, 2048, 4);
    const std::vector<float> X1 = random_acts(1, 2048, 5), X5 = random_acts(5, 2048, 6);
    ThreadPool one(1), two(2), three(3);
    for (const auto* X : {&X1, &X5}) {
      const int64_t n = static_cast<int64_t>(X->size() / 2048);
      const std::vector<float> y1 = product(one, q.packed_view, *X, n);
      EXPECT_EQ(product(two, q.packed_view, *X, n), y1);
      EXPECT_EQ(product(three, q.packed_view, *X, n), y1);
      // The fused gate/up product of two repacked matrices equals two separate products.
      std::vector<float> out(n * 96), up(n * 96);
      AlignedBuffer<uint8_t> scratch(cpu::matmul_scratch_bytes(q.packed_view.type, 2048, n));
      cpu::matmul_gated(two, q.packed_view, u.packed_view, cpu::Activation::relu, X->data(), n, out.data(), up.data(),
                        scratch.data());
      EXPECT_EQ(up, product(one, u.packed_view, *X, n));
      for (int64_t i = 0; i < n * 96; ++i) EXPECT_EQ(out[i], std::max(y1[i], 0.0f) * up[i]);
    }
  }
}
