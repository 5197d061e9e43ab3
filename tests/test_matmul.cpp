#include "ops/cpu/matmul.hpp"

#include <gtest/gtest.h>

#include "support/random_acts.hpp"
#include "support/simd_levels.hpp"

#include "support/paths.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/cpu_features.hpp"
#include "core/error.hpp"
#include "gguf/reader.hpp"
#include "ops/cpu/bandwidth.hpp"
#include "ops/cpu/gemm/gemm_table.hpp"
#include "ops/cpu/r16/r16.hpp"
#include "tensor/fp16.hpp"
#include "tensor/quant.hpp"

using namespace ember;

namespace {

// Every file type with a kernel in the GEMM table (ops/cpu/gemm/gemm_table.hpp): a kernel added there
// is tested here at every level. (The 16-row layouts are tested in test_r16.cpp, repacked from these.)
std::vector<DType> weight_types() {
  std::vector<DType> types;
  for (DType t : cpu::detail::gemm_weight_types())
    if (cpu::r16_base(t) == t) types.push_back(t);
  return types;
}
const std::vector<DType> kWeightTypes = weight_types();

bool is_k(DType w) { return info(w).block_size == 256; }

DType act_type(DType w) {
  switch (w) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q5_0: return DType::Q8_0;
    case DType::Q4_1: case DType::Q5_1: return DType::Q8_1;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return DType::Q8_K;
    default: return DType::F32;
  }
}

bool is_float(DType w) { return w == DType::F32 || w == DType::F16 || w == DType::BF16; }

using test_support::SimdGuard;
std::vector<SimdLevel> levels() { return test_support::simd_levels(); }

struct Matrix {
  std::vector<uint8_t> bytes;
  TensorView view;
};

Matrix random_matrix(DType t, int64_t rows, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  Matrix m;
  const size_t stride = row_bytes(t, k);
  m.bytes.resize(stride * rows);
  std::vector<float> row(k);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = 0.2f + static_cast<float>(r % 7);  // rows of different magnitude
    for (auto& x : row) x = dist(rng) * scale;
    quantize_row(t, row.data(), m.bytes.data() + r * stride, k);
  }
  m.view.name = "W";
  m.view.type = t;
  m.view.n_dims = 2;
  m.view.ne[0] = k;
  m.view.ne[1] = rows;
  m.view.data = m.bytes.data();
  m.view.nbytes = m.bytes.size();
  return m;
}

using test_support::random_acts;

struct Result {
  std::vector<float> y;
  std::vector<double> ref, l1;  // double-precision dot over dequantized operands, and sum |w x|
  // Q4_1 / Q5_1 x Q8_1 take the activation block sums from the fp16 field s = d * sum(q), computed
  // (as ggml does) from the unrounded d: the product differs from the plain dot by up to half
  // an fp16 ulp of s plus the rounding of d, times |m|, per block.
  std::vector<double> fp16_sum_slack;
  double bound(size_t i, double rel) const { return rel * l1[i] + fp16_sum_slack[i] + 1e-30; }
};

// Reference: dequantize weights and the quantized activations, dot in double.
void reference(const Matrix& m, const std::vector<float>& X, int64_t n, Result& res) {
  const int64_t k = m.view.cols(), rows = m.view.rows();
  const DType at = act_type(m.view.type);
  std::vector<uint8_t> xq(cpu::matmul_scratch_bytes(m.view.type, k, n));
  cpu::quantize_activations(m.view.type, X.data(), n, k, xq.data());
  std::vector<float> xd(n * k), wd(k);
  for (int64_t t = 0; t < n; ++t) dequantize_row(at, xq.data() + t * row_bytes(at, k), xd.data() + t * k, k);
  res.ref.assign(n * rows, 0.0);
  res.l1.assign(n * rows, 0.0);
  res.fp16_sum_slack.assign(n * rows, 0.0);
  if (m.view.type == DType::Q4_1 || m.view.type == DType::Q5_1) {
    const size_t wbytes = info(m.view.type).block_bytes;  // both start with fp16 d, fp16 m
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < n; ++t) {
        const auto* xb = reinterpret_cast<const BlockQ8_1*>(xq.data() + t * row_bytes(at, k));
        double slack = 0;
        for (int64_t b = 0; b < k / kQK; ++b) {
          uint16_t mh;
          std::memcpy(&mh, m.view.row(r) + b * wbytes + 2, 2);
          slack += std::fabs(fp16_to_fp32(mh) * fp16_to_fp32(xb[b].s)) * 0x1p-10;
        }
        res.fp16_sum_slack[t * rows + r] = slack;
      }
  }
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(m.view.type, m.view.row(r), wd.data(), k);
    for (int64_t t = 0; t < n; ++t) {
      double s = 0, a = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double p = static_cast<double>(wd[i]) * xd[t * k + i];
        s += p;
        a += std::fabs(p);
      }
      res.ref[t * rows + r] = s;
      res.l1[t * rows + r] = a;
    }
  }
}

std::vector<float> run_matmul(ThreadPool& pool, const Matrix& m, const std::vector<float>& X, int64_t n) {
  AlignedBuffer<uint8_t> scratch(cpu::matmul_scratch_bytes(m.view.type, m.view.cols(), n) + 1);
  std::vector<float> y(n * m.view.rows(), NAN);
  cpu::matmul(pool, m.view, X.data(), n, y.data(), scratch.data());
  return y;
}

// Integer paths differ from the double reference only by float summation of block terms.
double tolerance(DType t) { return is_float(t) ? 2e-6 : 1e-5; }

struct Shape {
  int64_t rows, k;
};

std::vector<Shape> shapes(DType t) {
  if (is_k(t)) return {{1, 256}, {3, 512}, {17, 768}, {1000, 256}};
  if (is_float(t)) return {{1, 7}, {3, 33}, {17, 1000}, {1000, 48}};
  // 96, 800: not multiples of 256. The 4-bit AVX-512 kernels step over four blocks at a time:
  // k of 1, 2, 3, 5, 7 and 25 blocks leave 1..3 in a last partial step, 4 and 16 none; row counts
  // are not multiples of the 4-row tile.
  return {{1, 32}, {3, 96}, {17, 800}, {1000, 64}, {5, 160}, {6, 128}, {13, 224}, {9, 512}};
}

}  // namespace

// Every SIMD level's matmul matches the double-precision product of the dequantized operands,
// and the SIMD levels match the scalar kernels.
TEST(Matmul, AllLevelsMatchReference) {
  SimdGuard guard;
  ThreadPool pool(2);
  for (DType t : kWeightTypes) {
    uint32_t seed = 10;
    for (Shape s : shapes(t)) {
      const Matrix m = random_matrix(t, s.rows, s.k, ++seed);
      for (int64_t n : {1, 2, 5, 13}) {
        const auto X = random_acts(n, s.k, ++seed);
        Result res;
        reference(m, X, n, res);
        std::vector<float> scalar_y;
        for (SimdLevel level : levels()) {
          set_simd_level(level);
          const auto y = run_matmul(pool, m, X, n);
          if (level == SimdLevel::scalar) scalar_y = y;
          for (size_t i = 0; i < y.size(); ++i) {
            ASSERT_NEAR(y[i], res.ref[i], res.bound(i, tolerance(t)))
                << dtype_name(t) << " " << simd_level_name(level) << " rows=" << s.rows << " k=" << s.k << " n=" << n
                << " i=" << i;
            ASSERT_NEAR(y[i], scalar_y[i], tolerance(t) * res.l1[i] + 1e-30)
                << dtype_name(t) << " " << simd_level_name(level) << " vs scalar, rows=" << s.rows << " k=" << s.k
                << " n=" << n << " i=" << i;
          }
        }
      }
    }
  }
}

TEST(Matmul, VecDotAllLevelsMatchScalar) {
  SimdGuard guard;
  for (DType t : kWeightTypes) {
    const int64_t k = is_k(t) ? 1280 : is_float(t) ? 1001 : 1248;
    const Matrix m = random_matrix(t, 4, k, 99);
    const auto X = random_acts(1, k, 100);
    std::vector<uint8_t> xq(cpu::matmul_scratch_bytes(t, k, 1));
    cpu::quantize_activations(t, X.data(), 1, k, xq.data());
    Result res;
    reference(m, X, 1, res);
    for (int64_t r = 0; r < 4; ++r) {
      set_simd_level(SimdLevel::scalar);
      const float want = cpu::vec_dot(t, k, m.view.row(r), xq.data());
      EXPECT_NEAR(want, res.ref[r], res.bound(r, tolerance(t))) << dtype_name(t);
      for (SimdLevel level : levels()) {
        set_simd_level(level);
        EXPECT_NEAR(cpu::vec_dot(t, k, m.view.row(r), xq.data()), want, tolerance(t) * res.l1[r])
            << dtype_name(t) << " " << simd_level_name(level);
      }
    }
  }
}

// The split over threads changes nothing: results are bit-identical for 1, 2 and 3 threads.
TEST(Matmul, DeterministicAcrossThreadCounts) {
  ThreadPool p1(1), p2(2), p3(3);
  for (DType t : kWeightTypes) {
    const int64_t k = is_k(t) ? 512 : 160;
    const Matrix m = random_matrix(t, 203, k, 7);
    for (int64_t n : {1, 13, 70}) {
      const auto X = random_acts(n, k, 8);
      const auto y1 = run_matmul(p1, m, X, n);
      const auto y2 = run_matmul(p2, m, X, n);
      const auto y3 = run_matmul(p3, m, X, n);
      EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float))) << dtype_name(t) << " n=" << n;
      EXPECT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float))) << dtype_name(t) << " n=" << n;
    }
  }
}

TEST(Matmul, RowsSubsetMatchesFullProduct) {
  ThreadPool pool(1);
  const int64_t k = 256, rows = 37, n = 5;
  for (DType t : kWeightTypes) {
    const Matrix m = random_matrix(t, rows, k, 21);
    const auto X = random_acts(n, k, 22);
    const auto full = run_matmul(pool, m, X, n);
    std::vector<uint8_t> xq(cpu::matmul_scratch_bytes(t, k, n));
    cpu::quantize_activations(t, X.data(), n, k, xq.data());
    const int64_t r0 = 5, r1 = 30;
    std::vector<float> part(n * (r1 - r0));
    cpu::matmul_rows(m.view, xq.data(), n, r0, r1, part.data(), r1 - r0);
    for (int64_t tk = 0; tk < n; ++tk)
      for (int64_t r = r0; r < r1; ++r) EXPECT_EQ(part[tk * (r1 - r0) + r - r0], full[tk * rows + r]) << dtype_name(t);
  }
}

TEST(Matmul, GetRowsDequantizes) {
  for (DType t : kWeightTypes) {
    const int64_t k = 256;
    const Matrix m = random_matrix(t, 10, k, 31);
    const int32_t ids[3] = {9, 0, 4};
    std::vector<float> out(3 * k), want(k);
    cpu::get_rows(m.view, ids, 3, out.data());
    for (int i = 0; i < 3; ++i) {
      dequantize_row(t, m.view.row(ids[i]), want.data(), k);
      EXPECT_EQ(0, std::memcmp(out.data() + i * k, want.data(), k * sizeof(float))) << dtype_name(t);
    }
    const int32_t bad = 10;
    EXPECT_THROW(cpu::get_rows(m.view, &bad, 1, out.data()), Error);
  }
}

TEST(Matmul, ScratchSizeAndBadShapes) {
  // 4-bit weights also get room for the activations in the kernels' quad layout.
  EXPECT_GE(cpu::matmul_scratch_bytes(DType::Q4_0, 64, 3), 3 * 2 * sizeof(BlockQ8_0));
  EXPECT_GE(cpu::matmul_scratch_bytes(DType::Q4_1, 64, 1), 2 * sizeof(BlockQ8_1));
  EXPECT_EQ(cpu::matmul_scratch_bytes(DType::Q8_0, 64, 3), 3 * 2 * sizeof(BlockQ8_0));
  EXPECT_EQ(cpu::matmul_scratch_bytes(DType::Q6_K, 512, 2), 4 * sizeof(BlockQ8_K));
  EXPECT_THROW(cpu::matmul_scratch_bytes(DType::Q4_0, 48, 1), Error);
  EXPECT_THROW(cpu::matmul_scratch_bytes(DType::IQ4_NL, 64, 1), Error);
}

// Real weights: rows of SmolLM2's Q4_1 FFN matrix against the double-precision reference.
TEST(Matmul, RealModelQ4_1Rows) {
  const std::string path = test_support::model_path(test_support::kSmolLM2);
  if (path.empty()) GTEST_SKIP() << "SmolLM2 model not installed (scripts/get_model.sh smollm2)";
  gguf::Reader reader(path);
  int checked = 0;
  for (const auto& info : reader.tensors()) {
    TensorView w = reader.view(info);
    if (w.type != DType::Q4_1 && w.type != DType::Q8_0) continue;
    if (w.n_dims != 2 || checked >= 3) continue;
    ++checked;
    Matrix m;
    m.view = w;
    const int64_t k = w.cols();
    const auto X = random_acts(2, k, 5);
    ThreadPool pool(2);
    const auto y = run_matmul(pool, m, X, 2);
    Result res;
    Matrix head = m;  // reference over the first 64 rows only
    head.view.ne[1] = 64;
    head.view.ne[2] = head.view.ne[3] = 1;
    reference(head, X, 2, res);
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t r = 0; r < 64; ++r)
        ASSERT_NEAR(y[t * w.rows() + r], res.ref[t * 64 + r], res.bound(t * 64 + r, 1e-5)) << w.name;
  }
  EXPECT_GT(checked, 0);
}

TEST(Bandwidth, ProbeReturnsPositiveFinite) {
  ThreadPool pool(2);
  const double bw = cpu::measure_read_bandwidth(pool, size_t{32} << 20);
  EXPECT_TRUE(std::isfinite(bw));
  EXPECT_GT(bw, 1e8);  // any machine reads faster than 100 MB/s
}

TEST(Bandwidth, ScatteredProbeReturnsPositiveFiniteAndRefusesBadRows) {
  ThreadPool pool(2);
  for (double keep : {0.5, 1.0}) {
    const double bw = cpu::measure_scattered_read_bandwidth(pool, size_t{16} << 20, 2048, keep);
    EXPECT_TRUE(std::isfinite(bw));
    EXPECT_GT(bw, 1e8);
  }
  EXPECT_THROW(cpu::measure_scattered_read_bandwidth(pool, size_t{1} << 20, 100, 0.5), std::exception);
  EXPECT_THROW(cpu::measure_scattered_read_bandwidth(pool, size_t{1} << 20, 2048, 0.0), std::exception);
}

// At `level` (left set), quantize_activations gives n rows of X the bytes quantize_row gives.
void expect_quantized_as_quantize_row(DType w, SimdLevel level, const std::vector<float>& X, int64_t n, int64_t k) {
  const DType at = act_type(w);
  std::vector<uint8_t> want(row_bytes(at, k) * n);
  for (int64_t t = 0; t < n; ++t) quantize_row(at, X.data() + t * k, want.data() + t * row_bytes(at, k), k);
  set_simd_level(level);
  std::vector<uint8_t> got(want.size());
  cpu::quantize_activations(w, X.data(), n, k, got.data());
  EXPECT_EQ(got, want) << dtype_name(w) << " " << simd_level_name(level);
}

// quantize_activations may use SIMD; it must give the bytes quantize_row gives.
TEST(Matmul, QuantizeActivationsMatchesQuantizeRow) {
  SimdGuard guard;
  const int64_t k = 768, n = 3;
  auto X = random_acts(n, k, 77);
  for (int i = 0; i < 32; ++i) X[32 + i] = 0.f;           // an all-zero block
  for (int i = 0; i < 32; ++i) X[96 + i] = (i - 16) * 0.5f;  // exact multiples: rounding ties
  for (int i = 0; i < 256; ++i) X[512 + i] = 0.f;         // an all-zero Q8_K block
  for (DType w : {DType::Q4_0, DType::Q4_1, DType::Q4_K})
    for (SimdLevel level : levels()) expect_quantized_as_quantize_row(w, level, X, n, k);
}

// An activation holding a NaN or infinity (a corrupt weight upstream) is quantized to a NaN scale
// (zero levels), the same bytes at every level, so that every product it enters is NaN and the run
// reports it, instead of reading the value as a finite level; the other blocks are untouched.
TEST(Matmul, ANonFiniteActivationMakesItsProductsNaN) {
  SimdGuard guard;
  ThreadPool pool(2);
  const int64_t k = 512, n = 3;
  auto X = random_acts(n, k, 78);
  X[k + 37] = NAN;                 // token 1, block 1
  X[2 * k + 300] = -INFINITY;     // token 2, block 9 (Q8_K: block 1)
  for (DType w : {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    const Matrix m = random_matrix(w, 40, k, 5);
    for (SimdLevel level : levels()) {
      expect_quantized_as_quantize_row(w, level, X, n, k);
      const std::vector<float> y = run_matmul(pool, m, X, n);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < 40; ++r)
          EXPECT_EQ(std::isnan(y[t * 40 + r]), t > 0) << dtype_name(w) << " " << simd_level_name(level) << " t" << t;
    }
  }
}

// Fused products (Q/K/V, gate/up) give exactly what separate matmul() calls give, at every
// SIMD level and thread count, for decode and prompt batches, with row counts that are not
// multiples of the 16-row decode split or the 64-row prompt blocks.
TEST(Matmul, MultiMatchesSeparateProducts) {
  SimdGuard guard;
  ThreadPool p1(1), p2(2), p3(3);
  for (DType t : kWeightTypes) {
    const int64_t k = is_k(t) ? 512 : 160;
    const Matrix a = random_matrix(t, 203, k, 41), b = random_matrix(t, 17, k, 42), c = random_matrix(t, 1, k, 43);
    for (SimdLevel level : levels()) {
      set_simd_level(level);
      for (int64_t n : {1, 5, 70}) {
        const auto X = random_acts(n, k, 44);
        const auto ya = run_matmul(p1, a, X, n), yb = run_matmul(p1, b, X, n), yc = run_matmul(p1, c, X, n);
        for (ThreadPool* pool : {&p1, &p2, &p3}) {
          std::vector<float> ga(ya.size(), NAN), gb(yb.size(), NAN), gc(yc.size(), NAN);
          AlignedBuffer<uint8_t> scratch(cpu::matmul_scratch_bytes(t, k, n));
          const cpu::MatmulOut outs[] = {{a.view, ga.data()}, {b.view, gb.data()}, {c.view, gc.data()}};
          cpu::matmul_multi(*pool, outs, X.data(), n, scratch.data());
          const std::string where = std::string(dtype_name(t)) + " " + simd_level_name(level) + " n=" +
                                    std::to_string(n) + " threads=" + std::to_string(pool->size());
          EXPECT_EQ(0, std::memcmp(ga.data(), ya.data(), ya.size() * sizeof(float))) << where;
          EXPECT_EQ(0, std::memcmp(gb.data(), yb.data(), yb.size() * sizeof(float))) << where;
          EXPECT_EQ(0, std::memcmp(gc.data(), yc.data(), yc.size() * sizeof(float))) << where;
        }
      }
    }
  }
}

TEST(Matmul, GatedMatchesTwoProductsAndActivation) {
  SimdGuard guard;
  ThreadPool p1(1), p2(2), p3(3);
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::F16}) {
    const int64_t k = is_k(t) ? 256 : 96, rows = 37;
    const Matrix gate = random_matrix(t, rows, k, 51), up = random_matrix(t, rows, k, 52);
    for (SimdLevel level : levels()) {
      set_simd_level(level);
      for (cpu::Activation act : {cpu::Activation::silu, cpu::Activation::relu, cpu::Activation::gelu_tanh})
        for (int64_t n : {1, 3, 67}) {
          const auto X = random_acts(n, k, 53);
          auto want = run_matmul(p1, gate, X, n);
          const auto u = run_matmul(p1, up, X, n);
          cpu::gated_activation(act, want.data(), u.data(), want.data(), n * rows);
          for (ThreadPool* pool : {&p1, &p2, &p3}) {
            std::vector<float> out(n * rows, NAN), ub(n * rows, NAN);
            AlignedBuffer<uint8_t> scratch(cpu::matmul_scratch_bytes(t, k, n));
            cpu::matmul_gated(*pool, gate.view, up.view, act, X.data(), n, out.data(), ub.data(), scratch.data());
            EXPECT_EQ(0, std::memcmp(out.data(), want.data(), want.size() * sizeof(float)))
                << dtype_name(t) << " " << simd_level_name(level) << " " << cpu::activation_name(act) << " n=" << n
                << " threads=" << pool->size();
            EXPECT_EQ(0, std::memcmp(ub.data(), u.data(), u.size() * sizeof(float))) << dtype_name(t);
          }
        }
    }
  }
}

TEST(Matmul, MultiRejectsMismatchedMatrices) {
  ThreadPool pool(2);
  const Matrix a = random_matrix(DType::Q4_0, 8, 64, 1), b = random_matrix(DType::Q8_0, 8, 64, 2),
               c = random_matrix(DType::Q4_0, 8, 96, 3);
  std::vector<float> X(96, 1.f), y(8), z(8);
  AlignedBuffer<uint8_t> scratch(cpu::matmul_scratch_bytes(DType::Q4_0, 96, 1));
  const cpu::MatmulOut types[] = {{a.view, y.data()}, {b.view, z.data()}};
  EXPECT_THROW(cpu::matmul_multi(pool, types, X.data(), 1, scratch.data()), Error);
  const cpu::MatmulOut widths[] = {{a.view, y.data()}, {c.view, z.data()}};
  EXPECT_THROW(cpu::matmul_multi(pool, widths, X.data(), 1, scratch.data()), Error);
  EXPECT_THROW(cpu::matmul_multi(pool, std::span<const cpu::MatmulOut>{}, X.data(), 1, scratch.data()), Error);
  const Matrix d = random_matrix(DType::Q4_0, 9, 64, 4);
  EXPECT_THROW(cpu::matmul_gated(pool, a.view, d.view, cpu::Activation::silu, X.data(), 1, y.data(), z.data(),
                                 scratch.data()),
               Error);
}

// The AVX-512 kernels' activations written straight in the quad layout are the bytes of
// quantizing with quantize_row and rearranging with prepare_quads.
TEST(Matmul, DirectQuadsMatchQuantizedRows) {
  if (!cpu_features().avx512 || !cpu_features().avx512_vnni) GTEST_SKIP() << "no AVX-512 VNNI";
  const auto& set = cpu::detail::act_quantizers_avx512();
  for (int64_t k : {32, 64, 96, 128, 160, 224, 800, 2048, 5632}) {
    auto X = random_acts(1, k, static_cast<uint32_t>(k));
    for (int i = 0; i < 32; ++i) X[i] = 0.f;                                  // an all-zero block
    if (k >= 96) for (int i = 0; i < 32; ++i) X[64 + i] = (i - 16) * 0.5f;  // rounding ties
    if (k >= 128) for (int i = 0; i < 32; ++i) X[96 + i] = 1e-30f * (i + 1);  // d underflows fp16
    for (DType w : {DType::Q4_0, DType::Q4_1}) {
      const DType at = act_type(w);
      std::vector<uint8_t> rows(row_bytes(at, k));
      quantize_row(at, X.data(), rows.data(), k);
      const size_t qb = cpu::detail::quad_row_bytes(k);
      AlignedBuffer<uint8_t> want(qb), got(qb);
      std::memset(got.data(), 0xAB, qb);  // padding must be written, not left over
      cpu::detail::prepare_quads(w, rows.data(), want.data(), k);
      (w == DType::Q4_0 ? set.quads_q8_0 : set.quads_q8_1)(X.data(), got.data(), k);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), qb)) << dtype_name(w) << " k=" << k;
    }
  }
}
