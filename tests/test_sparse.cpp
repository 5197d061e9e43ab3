// Neuron-sparse kernels (ops/cpu/sparse/sparse.hpp) against dense computations restricted to the
// active set, for every weight type, SIMD level and awkward shapes; thread counts must not
// change the bits.
#include "ops/cpu/sparse/sparse.hpp"

#include <gtest/gtest.h>

#include "support/simd_levels.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/cpu_features.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/sparse/sparse_impl.hpp"
#include "tensor/quant.hpp"

using namespace ember;

namespace {

const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                        DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
bool is_k(DType t) { return info(t).block_size == 256; }

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
    const float scale = 0.2f + static_cast<float>(r % 5);
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

std::vector<float> random_floats(int64_t n, uint32_t seed, float zero_fraction = 0.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng) < zero_fraction ? 0.f : dist(rng);
  return v;
}

// Active sets: none, one, all, random unsorted subsets, a sorted run-heavy subset.
std::vector<std::vector<int32_t>> active_sets(int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> all(rows);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<int32_t>> sets = {{}, {static_cast<int32_t>(rows - 1)}, all};
  for (double frac : {0.1, 0.5}) {
    std::vector<int32_t> s = all;
    std::shuffle(s.begin(), s.end(), rng);
    s.resize(std::max<int64_t>(1, static_cast<int64_t>(frac * rows)));
    sets.push_back(s);                            // unsorted
    std::sort(s.begin(), s.end());
    sets.push_back(s);                            // sorted (runs of consecutive rows)
  }
  return sets;
}

// Double-precision reference of the axpy over the dequantized neuron-major matrix.
std::vector<double> axpy_reference(const TensorView& D, const std::vector<int32_t>& active, const float* H,
                                   int64_t n_tokens, int64_t h_stride, const std::vector<float>& out0) {
  const int64_t n = D.cols();
  std::vector<double> ref(out0.begin(), out0.end());
  std::vector<float> row(n);
  for (size_t i = 0; i < active.size(); ++i) {
    dequantize_row(D.type, D.row(active[i]), row.data(), n);
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t j = 0; j < n; ++j) ref[t * n + j] += static_cast<double>(H[t * h_stride + i]) * row[j];
  }
  return ref;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

// The tests below run every type of kTypes at every level; so every kernel of the sparse tables
// (ops/cpu/sparse/sparse_impl.hpp) is among them: a kernel added to a table is tested against the scalar
// path without a new test.
TEST(Sparse, EveryTableKernelIsTested) {
  const auto& t = cpu::detail::sparse_tables();
  for (const std::vector<DType>& types : {t.rows.types(), t.gather.types(), t.gather_blocks.types(), t.axpy_rows.types()})
    for (DType w : types)
      EXPECT_NE(std::find(std::begin(kTypes), std::end(kTypes), w), std::end(kTypes)) << dtype_name(w);
  EXPECT_FALSE(t.rows.types().empty());
}

// gather_matmul == matmul over all rows, then the active rows picked: bit-exact, because both
// run the same row kernel on the same quantized activations.
TEST(Sparse, GatherMatmulEqualsDensePicked) {
  SimdGuard guard;
  for (SimdLevel level : levels()) {
    set_simd_level(level);
    for (DType t : kTypes) {
      const int64_t k = is_k(t) ? 512 : 96;
      for (int64_t rows : {int64_t{1}, int64_t{37}, int64_t{203}}) {
        Matrix W = random_matrix(t, rows, k, 7 + static_cast<uint32_t>(rows));
        for (int64_t n_tokens : {int64_t{1}, int64_t{3}}) {
          auto X = random_floats(n_tokens * k, 3);
          AlignedBuffer<uint8_t> scratch(cpu::matmul_scratch_bytes(t, k, n_tokens));
          std::vector<float> dense(n_tokens * rows);
          ThreadPool one(1);
          cpu::matmul(one, W.view, X.data(), n_tokens, dense.data(), scratch.data());
          for (const auto& act : active_sets(rows, 11)) {
            const int64_t na = static_cast<int64_t>(act.size());
            std::vector<float> first;
            for (int threads : {1, 2, 3}) {
              ThreadPool pool(threads);
              std::vector<float> y(n_tokens * std::max<int64_t>(na, 1), -7.f);
              cpu::gather_matmul(pool, W.view, X.data(), n_tokens, act.data(), na, y.data(), na, scratch.data());
              for (int64_t tk = 0; tk < n_tokens; ++tk)
                for (int64_t i = 0; i < na; ++i)
                  ASSERT_EQ(y[tk * na + i], dense[tk * rows + act[i]])
                      << dtype_name(t) << " level " << simd_level_name(level) << " rows " << rows << " tokens "
                      << n_tokens << " active " << na << " threads " << threads;
              if (threads == 1) first = y;
              else ASSERT_EQ(y, first);
            }
          }
        }
      }
    }
  }
}

// sparse_axpy == a double reference over the dequantized rows; both splits, all thread counts
// giving the same bits (the columns split across thread counts, the neurons split run to run).
TEST(Sparse, AxpyMatchesReferenceAndIsDeterministic) {
  SimdGuard guard;
  for (SimdLevel level : levels()) {
    set_simd_level(level);
    for (DType t : kTypes) {
      const bool kq = is_k(t);
      // K-quant and Q5 rows are dequantized by dequantize_row at every SIMD level: one suffices.
      if ((kq || t == DType::Q5_0 || t == DType::Q5_1) && level != SimdLevel::scalar) continue;
      const bool quant = info(t).block_size > 1;
      // n_embd: a tail for float types (not a multiple of 8), several column slices.
      for (int64_t n_embd : {kq ? int64_t{256} : int64_t{64}, kq ? int64_t{1024} : (quant ? int64_t{800} : int64_t{805})}) {
        for (int64_t n_ff : {int64_t{1}, int64_t{45}}) {
          Matrix D = random_matrix(t, n_ff, n_embd, 5 + static_cast<uint32_t>(n_ff));
          for (int64_t n_tokens : {int64_t{1}, int64_t{2}}) {
            for (const auto& act : active_sets(n_ff, 13)) {
              const int64_t na = static_cast<int64_t>(act.size());
              const int64_t h_stride = na + 3;
              auto H = random_floats(n_tokens * h_stride, 17, 0.3f);  // some exact zeros
              auto out0 = random_floats(n_tokens * n_embd, 19);
              auto ref = axpy_reference(D.view, act, H.data(), n_tokens, h_stride, out0);
              const double scale = std::max(1.0, max_abs(ref));
              for (auto split : {cpu::AxpySplit::columns, cpu::AxpySplit::neurons}) {
                std::vector<float> first;
                for (int threads : {1, 2, 3}) {
                  ThreadPool pool(threads);
                  std::vector<float> scratch(cpu::sparse_axpy_scratch_floats(n_embd, n_tokens, threads, split));
                  std::vector<float> out = out0;
                  cpu::sparse_axpy(pool, D.view, act.data(), na, H.data(), n_tokens, h_stride, out.data(), n_embd,
                                   scratch.data(), split);
                  double err = 0;
                  for (size_t j = 0; j < out.size(); ++j) err = std::max(err, std::fabs(out[j] - ref[j]));
                  ASSERT_LT(err / scale, 2e-6) << dtype_name(t) << " level " << simd_level_name(level) << " n_embd "
                                               << n_embd << " n_ff " << n_ff << " active " << na;
                  if (first.empty()) {
                    first = out;
                  } else if (split == cpu::AxpySplit::columns) {
                    ASSERT_EQ(out, first) << "columns split differs between thread counts, " << dtype_name(t);
                  }
                  if (split == cpu::AxpySplit::neurons) {  // run to run
                    std::vector<float> again = out0;
                    cpu::sparse_axpy(pool, D.view, act.data(), na, H.data(), n_tokens, h_stride, again.data(), n_embd,
                                     scratch.data(), split);
                    ASSERT_EQ(again, out);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

// The whole down projection: dense matmul of the input-major down with inactive neurons
// zeroed == axpy over the neuron-major copy, within the copy's rounding.
TEST(Sparse, NeuronMajorDownMatchesDense) {
  SimdGuard guard;
  for (DType t : kTypes) {
    const bool kq = is_k(t);
    const int64_t n_embd = kq ? 512 : 96, n_ff = kq ? 512 : 160;
    Matrix down = random_matrix(t, n_embd, n_ff, 23);  // input-major: ne[0] = n_ff
    ThreadPool pool(2);
    for (auto choice : {cpu::NeuronMajorType::exact, cpu::NeuronMajorType::same, cpu::NeuronMajorType::f32}) {
      const DType nt = cpu::neuron_major_dtype(t, choice, n_embd);
      auto nm = cpu::make_neuron_major(pool, down.view, nt);
      ASSERT_EQ(nm.view.cols(), n_embd);
      ASSERT_EQ(nm.view.rows(), n_ff);
      // Row j of the copy is column j of down, up to the copy's rounding.
      std::vector<float> dense_rows(n_embd * n_ff), nm_row(n_embd);
      for (int64_t r = 0; r < n_embd; ++r) dequantize_row(t, down.view.row(r), dense_rows.data() + r * n_ff, n_ff);
      double max_err = 0, max_v = 0;
      for (int64_t j = 0; j < n_ff; ++j) {
        dequantize_row(nt, nm.view.row(j), nm_row.data(), n_embd);
        for (int64_t r = 0; r < n_embd; ++r) {
          max_err = std::max(max_err, static_cast<double>(std::fabs(nm_row[r] - dense_rows[r * n_ff + j])));
          max_v = std::max(max_v, static_cast<double>(std::fabs(dense_rows[r * n_ff + j])));
        }
      }
      const bool exact = nt == DType::F32 || (nt == t && info(t).block_size == 1);
      // Requantized across its blocks in its own type (`same`): rounded twice; at 2 and 3 bits
      // that is a large part of a step.
      const double twice = t == DType::Q2_K ? 0.4 : t == DType::Q3_K ? 0.25 : 0.15;
      if (exact) EXPECT_EQ(max_err, 0.0) << dtype_name(t) << " -> " << dtype_name(nt);
      else if (nt == DType::Q8_0) EXPECT_LT(max_err / max_v, 1.0 / 127) << dtype_name(t);
      else EXPECT_LT(max_err / max_v, twice + 0.05) << dtype_name(t) << " -> " << dtype_name(nt);

      // Products: H with inactive neurons zeroed through the dense kernel vs the axpy.
      auto act = active_sets(n_ff, 29)[3];
      std::vector<float> h_full(n_ff, 0.f), h(act.size());
      auto hv = random_floats(static_cast<int64_t>(act.size()), 31);
      for (size_t i = 0; i < act.size(); ++i) h[i] = h_full[act[i]] = hv[i];
      std::vector<double> exact_out(n_embd, 0.0);
      for (int64_t r = 0; r < n_embd; ++r)
        for (int64_t j = 0; j < n_ff; ++j) exact_out[r] += static_cast<double>(h_full[j]) * dense_rows[r * n_ff + j];
      std::vector<float> out(n_embd, 0.f);
      std::vector<float> scratch(cpu::sparse_axpy_scratch_floats(n_embd, 1, 2, cpu::AxpySplit::columns));
      cpu::sparse_axpy(pool, nm.view, act.data(), static_cast<int64_t>(act.size()), h.data(), 1, 0, out.data(),
                       n_embd, scratch.data());
      std::vector<float> dense_out(n_embd);
      AlignedBuffer<uint8_t> mm(cpu::matmul_scratch_bytes(t, n_ff, 1));
      cpu::matmul(pool, down.view, h_full.data(), 1, dense_out.data(), mm.data());
      double e_sparse = 0, e_dense = 0, m = 0;
      for (int64_t r = 0; r < n_embd; ++r) {
        e_sparse = std::max(e_sparse, std::fabs(out[r] - exact_out[r]));
        e_dense = std::max(e_dense, std::fabs(dense_out[r] - exact_out[r]));
        m = std::max(m, std::fabs(exact_out[r]));
      }
      std::printf("%s -> %s: max |sparse - exact| / max = %.2e, max |dense - exact| / max = %.2e\n",
                  std::string(dtype_name(t)).c_str(), std::string(dtype_name(nt)).c_str(), e_sparse / m, e_dense / m);
      // Q8_0 copies stay within 8-bit rounding; a 4-bit type requantized across its blocks
      // (the `same` choice) is rounded twice at 4 bits, which shows (~8% of the largest output
      // here, where rows of different magnitude share a block after the transpose).
      EXPECT_LT(e_sparse / m, exact ? 1e-5 : nt == DType::Q8_0 ? 0.01 : twice);
    }
  }
}

// The one-token AVX-512 kernels work on groups of eight scattered rows: every group size (lists
// of 1..17 rows), rows with full steps of four blocks plus a tail, zeros among the factors. The
// gather must give the dense kernel's bits, the grouped axpy the one-row (AVX2) kernel's bits.
TEST(Sparse, OneTokenGroupedKernelsAreBitIdentical) {
  if (!cpu_features().avx512 || !cpu_features().avx512_vnni) GTEST_SKIP() << "no AVX-512 VNNI";
  SimdGuard guard;
  std::mt19937 rng(23);
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q8_0}) {
    for (int64_t k : {int64_t{224}, int64_t{288}, int64_t{1056}}) {
      const int64_t rows = 61;
      Matrix W = random_matrix(t, rows, k, 31 + static_cast<uint32_t>(k));
      auto X = random_floats(k, 37);
      for (int64_t na = 1; na <= 17; ++na) {
        std::vector<int32_t> act(rows);
        std::iota(act.begin(), act.end(), 0);
        std::shuffle(act.begin(), act.end(), rng);
        act.resize(na);
        // gather vs the dense product, both at the AVX-512 level.
        set_simd_level(SimdLevel::avx512);
        ThreadPool one(1);
        AlignedBuffer<uint8_t> scratch(cpu::matmul_scratch_bytes(t, k, 1));
        std::vector<float> dense(rows), y(na);
        cpu::matmul(one, W.view, X.data(), 1, dense.data(), scratch.data());
        cpu::gather_matmul(one, W.view, X.data(), 1, act.data(), na, y.data(), na, scratch.data());
        for (int64_t i = 0; i < na; ++i)
          ASSERT_EQ(y[i], dense[act[i]]) << dtype_name(t) << " k " << k << " active " << na << " i " << i;
        // axpy: the rows of W as a neuron-major matrix with k columns, AVX-512 vs AVX2.
        auto H = random_floats(na, 41 + static_cast<uint32_t>(na), 0.3f);
        auto out0 = random_floats(k, 43);
        std::vector<float> ref = out0, got = out0;
        std::vector<float> axs(cpu::sparse_axpy_scratch_floats(k, 1, 1, cpu::AxpySplit::columns));
        set_simd_level(SimdLevel::avx2);
        cpu::sparse_axpy(one, W.view, act.data(), na, H.data(), 1, na, ref.data(), k, axs.data());
        set_simd_level(SimdLevel::avx512);
        cpu::sparse_axpy(one, W.view, act.data(), na, H.data(), 1, na, got.data(), k, axs.data());
        ASSERT_EQ(got, ref) << dtype_name(t) << " k " << k << " active " << na;
        const auto dref = axpy_reference(W.view, act, H.data(), 1, na, out0);
        for (int64_t j = 0; j < k; ++j) ASSERT_NEAR(got[j], dref[j], 2e-6 * std::max(1.0, max_abs(dref)));
      }
    }
  }
}

// sparse_up_down_rows (up and down of the listed neurons in one pass) equals the gather, the
// products and the axpy in turn, bit for bit, at every SIMD level: 4-bit up rows with row-wise
// Q8_0 / Q4_0 / Q4_1 down rows take the AVX-512 one-pass kernel, other types the separate
// kernels. Both layouts: matrices of their own, and each neuron's up and down rows bundled one
// after the other (TensorView::stride, as model/repack.cpp lays them out).
TEST(Sparse, UpDownEqualsGatherThenAxpy) {
  SimdGuard guard;
  std::mt19937 rng(29);
  const int64_t rows = 61;
  for (SimdLevel level : levels()) {
    set_simd_level(level);
    for (DType ut : {DType::Q4_0, DType::Q4_1, DType::Q8_0})
      for (DType dt : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::F16})
        for (int64_t k : {int64_t{224}, int64_t{1056}})
          for (bool bundled : {false, true}) {
            const Matrix U = random_matrix(ut, rows, k, 47 + static_cast<uint32_t>(k));
            const Matrix D = random_matrix(dt, rows, k, 53 + static_cast<uint32_t>(k));
            std::vector<uint8_t> both;
            TensorView up = U.view, down = D.view;
            if (bundled) {
              const size_t ru = U.view.row_stride(), rd = D.view.row_stride();
              both.resize((ru + rd) * rows);
              for (int64_t r = 0; r < rows; ++r) {
                std::copy_n(U.view.row(r), ru, both.data() + r * (ru + rd));
                std::copy_n(D.view.row(r), rd, both.data() + r * (ru + rd) + ru);
              }
              up.data = both.data(), down.data = both.data() + ru;
              up.stride = down.stride = ru + rd;
            }
            const auto X = random_floats(k, 59);
            AlignedBuffer<uint8_t> xq(cpu::matmul_scratch_bytes(ut, k, 1));
            cpu::quantize_activations(ut, X.data(), 1, k, xq.data());
            ThreadPool one(1);
            std::vector<float> dense(rows);
            cpu::matmul(one, U.view, X.data(), 1, dense.data(), xq.data());
            cpu::quantize_activations(ut, X.data(), 1, k, xq.data());
            for (int64_t na : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{17}, rows}) {
              std::vector<int32_t> act(rows);
              std::iota(act.begin(), act.end(), 0);
              std::shuffle(act.begin(), act.end(), rng);
              act.resize(na);
              const auto g = random_floats(na, 61 + static_cast<uint32_t>(na), 0.3f);
              const auto out0 = random_floats(k, 67);
              std::vector<float> h_ref(na), h(na), tmp(k), out_ref = out0, out = out0;
              cpu::gather_matmul_rows(up, xq.data(), 1, act.data(), na, h_ref.data(), na);
              for (int64_t i = 0; i < na; ++i) h_ref[i] *= g[i];
              cpu::sparse_axpy_rows(down, act.data(), na, h_ref.data(), 1, na, 0, k, out_ref.data(), k, tmp.data());
              cpu::sparse_up_down_rows(up, xq.data(), down, act.data(), na, g.data(), h.data(), out.data(), tmp.data());
              const std::string what = std::string(simd_level_name(level)) + " up " + std::string(dtype_name(ut)) + " down " +
                                       std::string(dtype_name(dt)) + " k " + std::to_string(k) + (bundled ? " bundled" : "") +
                                       " active " + std::to_string(na);
              ASSERT_EQ(h, h_ref) << what;
              ASSERT_EQ(out, out_ref) << what;
              // And the values themselves: up's rows as the dense product computes them, the
              // sum against a double-precision reference.
              for (int64_t i = 0; i < na; ++i) ASSERT_EQ(h[i], dense[act[i]] * g[i]) << what;
              const auto dref = axpy_reference(D.view, act, h.data(), 1, na, out0);
              for (int64_t j = 0; j < k; ++j) ASSERT_NEAR(out[j], dref[j], 2e-6 * std::max(1.0, max_abs(dref))) << what;
            }
          }
  }
}
