// Input sparsity (sparse/input_sparse.hpp, sparse/input_allocation.hpp): the profile's input
// tables, the allocation of a target over layers and sites, the product over the kept inputs of
// an input-channel-major copy against doubles (every type, SIMD level, awkward shapes), the
// executor's FFN and projections against a masked double reference, one function on the decode
// and prompt paths, thread-count independence, and thresholds stored in a model file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <random>

#include "core/error.hpp"
#include "engine/profile_run.hpp"
#include "engine/session.hpp"
#include "gguf/writer.hpp"
#include "model/blocks.hpp"
#include "model/repack.hpp"
#include "synth/synth.hpp"
#include "ops/cpu/nm4/nm4.hpp"
#include "ops/cpu/r16/r16.hpp"
#include "sparse/input_allocation.hpp"
#include "sparse/input_sparse.hpp"
#include "sparse/sparsify.hpp"
#include "support/errors.hpp"
#include "support/reference_llama.hpp"
#include "support/session_logits.hpp"
#include "support/session_params.hpp"
#include "support/simd_levels.hpp"
#include "support/synth_files.hpp"
#include "tensor/quant.hpp"

using namespace ember;
using test_support::Logits;

namespace {

std::filesystem::path temp_dir() { return test_support::test_temp_dir("input-sparse"); }

SynthOptions small(DType type, uint64_t seed) {
  SynthOptions o;
  o.type = type;
  o.act = FfnActivation::silu;
  o.n_embd = 128;
  o.n_ff = 352;
  o.n_layer = 3;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.seed = seed;
  o.n_threads = 1;
  return o;
}

std::unique_ptr<Model> load_synth(const SynthOptions& o, const std::string& name) {
  return test_support::load_synth_in(temp_dir(), o, name);
}

using test_support::random_tokens;

// A profile of `m` over random tokens (the input tables included).
Profile profile_of(const Model& m) {
  Session s(m, test_support::session_params(2, 64, 64));
  ProfileOptions o;
  o.n_ctx = 64;
  o.sparsity = 0.5f;
  return run_profile(s, random_tokens(128, m.hp.n_vocab, 7), o);
}

// The copies' rows of small(): q|k|v 256 outputs, o and down 128, gate|up 704; in F32 1 KiB,
// 512 bytes and 2816 bytes. So by default (kInputMinRowBytes) an F32 layer decodes gate|up
// through its copy and the other sites dense on masked inputs; min_row_bytes 0 makes every
// site use a copy, kAllDense none. With kAllCopies the tests also turn off the per-token choice
// (SparseFfnOptions::input_copy_by_cost), so that every decode token reads every copy.
constexpr size_t kAllCopies = 0, kAllDense = kInputNoCopies;

// The Q4_0 model of the copy-or-dense tests (512-wide FFNs) and one random decode input for it.
struct ChoiceCase {
  std::unique_ptr<Model> m;
  std::vector<float> x;
};
ChoiceCase choice_case(const std::string& name) {
  SynthOptions o = small(DType::Q4_0, 8);
  o.n_ff = 512;
  ChoiceCase c{load_synth(o, name), {}};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  c.x.resize(static_cast<size_t>(c.m->hp.n_embd));
  for (auto& v : c.x) v = nd(rng);
  return c;
}

// One decode token of layer 1 through `ex`, x the input of each site's product: the FFN's
// output, then q, then o.
std::vector<float> decode_layer(InputSparseExecutor& ex, const Model& m, ThreadPool& pool, const std::vector<float>& x) {
  Workspace ws;
  ws.init(m, 4, 4, 2);
  const auto d = static_cast<size_t>(m.hp.n_embd);
  std::vector<float> out(d), xn = x, attn = x, o(d);
  ex.run(pool, 1, m.layers[1].ffn, m.hp.act, x.data(), 1, out.data(), ws);
  ex.qkv(pool, 1, m.layers[1], xn.data(), 1, ws);
  ex.out(pool, 1, m.layers[1], attn.data(), 1, o.data(), ws);
  out.insert(out.end(), ws.q.data(), ws.q.data() + m.hp.n_head * m.hp.head_dim);
  out.insert(out.end(), o.begin(), o.end());
  return out;
}

Logits run_input_mode(const Model& m, const InputThresholds& t, int threads, InputSparsityStats* stats = nullptr,
                      size_t min_row_bytes = kInputMinRowBytes) {
  SessionParams p = test_support::session_params(threads, 64, 64);
  p.sparse.mode = FfnMode::input;
  p.sparse.input_thresholds = t;
  p.sparse.input_min_row_bytes = min_row_bytes;
  p.sparse.input_copy_by_cost = min_row_bytes != kAllCopies;
  Session s(m, p);
  Logits out = test_support::session_logits(s);
  if (stats) *stats = s.input_sparse()->stats();
  return out;
}

}  // namespace

TEST(AbsHistogram, EnergyFractionsOfUniformValuesAreCubes) {
  // For |x| uniform in [0, 1], the values below quantile p hold p^3 of the energy.
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(400000);
  for (auto& v : x) v = u(rng);
  AbsHistogram h;
  h.add(x.data(), static_cast<int64_t>(x.size()));
  const std::vector<float> e = h.energy_fractions(kQuantiles);
  for (int64_t k : {0, 100, 250, 500, 800, 1000}) {
    const double p = k / 1000.0;
    EXPECT_NEAR(e[k], p * p * p, 4e-3) << "quantile " << k;
  }
  EXPECT_FLOAT_EQ(e[1000], 1.0f);
}

TEST(InputSparse, SelectInputsKeepsTheEntriesAboveTheThreshold) {
  const float x[] = {0.5f, -0.1f, 0.0f, -2.0f, 0.1f, 0.11f};
  int32_t ids[6];
  float vals[6];
  ASSERT_EQ(select_inputs(x, 6, 0.1f, ids, vals), 3);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 3);
  EXPECT_EQ(ids[2], 5);
  EXPECT_FLOAT_EQ(vals[1], -2.0f);
  EXPECT_EQ(select_inputs(x, 6, -1.0f, ids, vals), 6);  // t < 0 keeps every entry, zeros too
}

// The product of an input-channel-major copy (as the executor makes it) with the kept inputs,
// against doubles over the file's values (over the copy's own where its tables are narrow: the
// compact choice): every copy type the executor makes, every SIMD level, shapes that are no
// multiple of the kernels' widths.
TEST(InputSparse, ProductOverKeptInputsMatchesDoubles) {
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0,
                         DType::Q4_1, DType::Q5_0, DType::Q4_K, DType::Q6_K};
  struct Shape {
    int64_t n_in, n_out;
  };
  for (SimdLevel level : test_support::simd_levels()) {
    test_support::SimdGuard guard(level);
    for (DType t : types) {
      const int64_t bs = info(t).block_size;
      for (Shape sh : {Shape{bs == 256 ? 512 : 96, 160}, Shape{bs == 256 ? 768 : 544, 32},
                       Shape{bs == 256 ? 256 : 288, 96}}) {
        std::mt19937 rng(static_cast<uint32_t>(sh.n_in * 7 + sh.n_out));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        // W: n_out rows of n_in (the file's layout), rows of different scales.
        std::vector<uint8_t> bytes(row_bytes(t, sh.n_in) * static_cast<size_t>(sh.n_out));
        std::vector<float> row(static_cast<size_t>(sh.n_in));
        for (int64_t r = 0; r < sh.n_out; ++r) {
          for (auto& v : row) v = nd(rng) * (0.2f + static_cast<float>(r % 5));
          quantize_row(t, row.data(), bytes.data() + r * row_bytes(t, sh.n_in), sh.n_in);
        }
        TensorView W;
        W.name = "w";
        W.type = t;
        W.n_dims = 2;
        W.ne[0] = sh.n_in;
        W.ne[1] = sh.n_out;
        W.data = bytes.data();
        W.nbytes = bytes.size();
        const std::vector<double> Wd = test_support::dequant_matrix(W);
        ThreadPool pool(2);
        std::vector<float> x(static_cast<size_t>(sh.n_in));
        for (auto& v : x) v = nd(rng);
        for (cpu::NeuronMajorType choice : {cpu::NeuronMajorType::exact, cpu::NeuronMajorType::compact}) {
          const DType ct = cpu::neuron_major_dtype(t, choice, sh.n_out, true);
          if (choice == cpu::NeuronMajorType::compact && !cpu::nm4_narrow(ct)) continue;  // as exact
          const cpu::NeuronMajorMatrix copy = cpu::make_neuron_major(pool, W, ct);
          // The values the copy holds: the file's, but with narrow tables (each table value
          // rounded: Nm4.NarrowCopyKeepsTheCodesAndRoundsTheTablesToAStepOf255 bounds them).
          std::vector<double> Wc = Wd;
          if (cpu::nm4_narrow(ct)) {
            std::vector<float> col(static_cast<size_t>(sh.n_out));
            for (int64_t i = 0; i < sh.n_in; ++i) {
              cpu::dequantize_neuron(copy.view, i, col.data());
              for (int64_t j = 0; j < sh.n_out; ++j) Wc[j * sh.n_in + i] = col[j];
            }
          }
          for (float thr : {-1.0f, 0.5f, 1.5f}) {  // none, ~40 %, ~85 % dropped
            std::vector<int32_t> ids(x.size());
            std::vector<float> vals(x.size());
            const int64_t k = select_inputs(x.data(), sh.n_in, thr, ids.data(), vals.data());
            std::vector<float> y(static_cast<size_t>(sh.n_out), 0.0f);
            std::vector<float> scratch(cpu::sparse_axpy_scratch_floats(sh.n_out, 1, 2, cpu::AxpySplit::columns));
            if (k > 0)
              cpu::sparse_axpy(pool, copy.view, ids.data(), k, vals.data(), 1, k, y.data(), sh.n_out, scratch.data());
            // Floats keep the file's values (only float rounding). Q4_0 / Q4_1 keep them too, but
            // their kernel rounds the kept inputs to int8 per segment (ops/cpu/nm4/nm4.hpp): each moves
            // by at most half a step, 1/254 of the largest kept |x|, times the rounded part of
            // the weight (d (q - 8); Q4_1: d q, the min m takes x unrounded). The other types (Q8_0
            // too) are requantized to Q8_0 along the input's row of outputs: each value moves by
            // at most half a step, 1/254 of the largest |value| of its block of 32 outputs.
            const bool exact = info(t).block_size == 1;
            const bool nm4 = cpu::is_nm4(ct);
            double xmax = 0;
            for (float v : x) xmax = std::fabs(v) > thr ? std::max(xmax, static_cast<double>(std::fabs(v))) : xmax;
            for (int64_t j = 0; j < sh.n_out; ++j) {
              double ref = 0, mag = 0, requant = 0;
              for (int64_t i = 0; i < sh.n_in; ++i) {
                if (std::fabs(x[i]) <= thr) continue;
                const double w = Wc[j * sh.n_in + i];
                ref += x[i] * w, mag += std::fabs(x[i] * w);
                if (nm4) {
                  const double m = cpu::nm4_has_min(ct) ? cpu::nm4_table_value(copy.view, i, j, true) : 0.0;
                  requant += std::fabs(w - m) * xmax / 254.0;
                  mag += std::fabs(w - m) * xmax;
                  continue;
                }
                double block_max = 0;
                for (int64_t jj = j / 32 * 32; jj < j / 32 * 32 + 32; ++jj)
                  block_max = std::max(block_max, std::fabs(Wd[jj * sh.n_in + i]));
                requant += std::fabs(x[i]) * block_max / 254.0;
              }
              ASSERT_NEAR(y[j], ref, 2e-6 * mag + (exact ? 0.0 : 1.01 * requant) + 1e-6)
                  << dtype_name(t) << " -> " << dtype_name(ct) << " " << sh.n_in << "x" << sh.n_out << " thr " << thr
                  << " out " << j << " level " << simd_level_name(level);
            }
          }
        }
      }
    }
  }
}

// One layer's FFN and Q/K/V/O projections through the executor, one token (the copies) and
// several (the file's layout, masked), against doubles on the masked inputs.
TEST(InputSparse, LayerMatchesMaskedDoubleReference) {
  auto m = load_synth(small(DType::F32, 4), "layer.gguf");
  const Hparams& hp = m->hp;
  const LayerWeights& L = m->layers[1];
  const int64_t d = hp.n_embd, nff = hp.n_ff, nq = hp.n_head * hp.head_dim, nkv = hp.n_head_kv * hp.head_dim;
  const auto G = test_support::dequant_matrix(L.ffn.gate), U = test_support::dequant_matrix(L.ffn.up),
             D = test_support::dequant_matrix(L.ffn.down), Q = test_support::dequant_matrix(L.wq),
             K = test_support::dequant_matrix(L.wk), V = test_support::dequant_matrix(L.wv),
             O = test_support::dequant_matrix(L.wo);
  InputThresholds thr(3, {-1.0f, -1.0f, -1.0f, -1.0f});
  thr[1] = {0.6f, 0.7f, 0.5f, 0.02f};
  ThreadPool pool(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto masked = [](std::vector<double> v, float t) {
    for (auto& e : v)
      if (std::fabs(e) <= t) e = 0;
    return v;
  };
  const auto matvec = [](const std::vector<double>& W, int64_t rows, int64_t cols, const double* x) {
    std::vector<double> y(static_cast<size_t>(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < cols; ++i) y[r] += W[r * cols + i] * x[i];
    return y;
  };
  // Every site through its copy, the default (gate|up through its copy, the rest dense on masked
  // inputs), every site dense.
  std::mt19937 rng(5);
  for (size_t min_row : {kAllCopies, kInputMinRowBytes, kAllDense}) {
  rng.seed(5);  // the same inputs each time
  InputSparseExecutor ex(*m, pool, thr, cpu::NeuronMajorType::exact, 8, min_row, min_row != kAllCopies);
  for (int64_t n : {1, 5}) {
    Workspace ws;
    ws.init(*m, 8, 8, 2);
    std::vector<float> x(static_cast<size_t>(n * d)), a(static_cast<size_t>(n * nq)), out(static_cast<size_t>(n * d)),
        o(static_cast<size_t>(n * d));
    for (auto& v : x) v = nd(rng);
    for (auto& v : a) v = nd(rng);
    std::vector<float> xn = x, attn = a;  // the executor may zero its inputs in place
    ex.run(pool, 1, L.ffn, hp.act, x.data(), n, out.data(), ws);
    std::vector<float> ffn_out = out;
    ex.qkv(pool, 1, L, xn.data(), n, ws);
    ex.out(pool, 1, L, attn.data(), n, o.data(), ws);
    int64_t dropped_h = 0;
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<double> xt = masked({x.begin() + t * d, x.begin() + (t + 1) * d}, 0.5f);
      const std::vector<double> g = matvec(G, nff, d, xt.data()), u = matvec(U, nff, d, xt.data());
      std::vector<double> h(static_cast<size_t>(nff));
      for (int64_t j = 0; j < nff; ++j) h[j] = g[j] / (1.0 + std::exp(-g[j])) * u[j];
      const std::vector<double> hm = masked(h, 0.02f);
      for (int64_t j = 0; j < nff; ++j) dropped_h += hm[j] == 0.0 && h[j] != 0.0;
      const std::vector<double> y = matvec(D, d, nff, hm.data());
      for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(ffn_out[t * d + i], y[i], 1e-4 * (1 + std::fabs(y[i]))) << n << " " << t;
      const std::vector<double> xa = masked({x.begin() + t * d, x.begin() + (t + 1) * d}, 0.6f);
      const std::vector<double> q = matvec(Q, nq, d, xa.data()), k = matvec(K, nkv, d, xa.data()),
                                v = matvec(V, nkv, d, xa.data());
      for (int64_t i = 0; i < nq; ++i) EXPECT_NEAR(ws.q[t * nq + i], q[i], 1e-4 * (1 + std::fabs(q[i])));
      for (int64_t i = 0; i < nkv; ++i) EXPECT_NEAR(ws.k[t * nkv + i], k[i], 1e-4 * (1 + std::fabs(k[i])));
      for (int64_t i = 0; i < nkv; ++i) EXPECT_NEAR(ws.v[t * nkv + i], v[i], 1e-4 * (1 + std::fabs(v[i])));
      const std::vector<double> am = masked({a.begin() + t * nq, a.begin() + (t + 1) * nq}, 0.7f);
      const std::vector<double> ov = matvec(O, d, nq, am.data());
      for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(o[t * d + i], ov[i], 1e-4 * (1 + std::fabs(ov[i])));
    }
    EXPECT_GT(dropped_h, n * nff / 10) << "the down threshold drops too little to test anything";
  }
  // One token went through the decode path: the stats saw it at every site, copy or not.
  const InputSparsityStats& st = ex.stats();
  EXPECT_EQ(st.seen[1][static_cast<int>(InputSite::ffn_in)], static_cast<uint64_t>(d));
  EXPECT_EQ(st.seen[1][static_cast<int>(InputSite::ffn_hidden)], static_cast<uint64_t>(nff));
  EXPECT_EQ(st.seen[1][static_cast<int>(InputSite::attn_in)], static_cast<uint64_t>(d));
  EXPECT_EQ(st.seen[0][0], 0u);
  // The copies made: all four sites', gate|up's alone (2816-byte rows), none.
  for (int s = 0; s < kInputSites; ++s)
    EXPECT_EQ(input_site_dense(L, s, cpu::NeuronMajorType::exact, min_row),
              min_row == kAllDense || (min_row == kInputMinRowBytes && s != static_cast<int>(InputSite::ffn_in)))
        << s << " " << min_row;
  const size_t gate_up = 3 * row_bytes(DType::F32, 2 * nff) * static_cast<size_t>(d);  // three layers
  if (min_row == kAllCopies) {
    EXPECT_GT(ex.copy_bytes(), gate_up);
  } else if (min_row == kInputMinRowBytes) {
    EXPECT_EQ(ex.copy_bytes(), gate_up);
  } else {
    EXPECT_EQ(ex.copy_bytes(), 0u);
  }
  }

  // Q, K and V share one copy (their outputs side by side) only where they share a type, as in
  // files that keep V in more bits: with V in F16, Q and K share a copy and V has its own.
  std::vector<uint8_t> v16(row_bytes(DType::F16, d) * static_cast<size_t>(nkv));
  for (int64_t r = 0; r < nkv; ++r) {
    std::vector<float> row(V.begin() + r * d, V.begin() + (r + 1) * d);
    quantize_row(DType::F16, row.data(), v16.data() + r * row_bytes(DType::F16, d), d);
  }
  TensorView wv16 = matrix_view(DType::F16, v16.data(), nkv, d);
  wv16.name = L.wv.name;
  m->layers[1].wv = wv16;
  const auto V16 = test_support::dequant_matrix(wv16);
  InputSparseExecutor mixed(*m, pool, thr, cpu::NeuronMajorType::exact, 8, kAllCopies, false);
  Workspace ws;
  ws.init(*m, 8, 8, 2);
  std::vector<float> x(static_cast<size_t>(d));
  for (auto& e : x) e = nd(rng);
  const std::vector<double> xa = masked({x.begin(), x.end()}, 0.6f);
  mixed.qkv(pool, 1, m->layers[1], x.data(), 1, ws);
  const std::vector<double> q = matvec(Q, nq, d, xa.data()), k = matvec(K, nkv, d, xa.data()),
                            v = matvec(V16, nkv, d, xa.data());
  for (int64_t i = 0; i < nq; ++i) EXPECT_NEAR(ws.q[i], q[i], 1e-4 * (1 + std::fabs(q[i])));
  for (int64_t i = 0; i < nkv; ++i) EXPECT_NEAR(ws.k[i], k[i], 1e-4 * (1 + std::fabs(k[i])));
  for (int64_t i = 0; i < nkv; ++i) EXPECT_NEAR(ws.v[i], v[i], 1e-4 * (1 + std::fabs(v[i])));
}

// The copy-or-dense choice of a decode token (input_copy_rate, input_copy_max_kept): the rate
// model at its measured points and between them, the break-even count where the copy's time meets
// the dense time, and the executor taking the dense kernels where a token keeps more inputs than
// pays (the bits of a copyless executor) and the copy where it keeps few (the bits of an executor
// that always reads its copies).
TEST(InputSparse, ACopyIsReadOnlyWhereItReadsFaster) {
  EXPECT_DOUBLE_EQ(input_copy_rate(512), 0.63);
  EXPECT_DOUBLE_EQ(input_copy_rate(2048), 0.63);
  EXPECT_NEAR(input_copy_rate(3072), 0.72, 1e-12);
  EXPECT_NEAR(input_copy_rate(14336), 0.88, 1e-12);
  EXPECT_DOUBLE_EQ(input_copy_rate(1 << 20), 0.88);
  for (size_t b = 2048; b < 14336; b += 512) EXPECT_LT(input_copy_rate(b), input_copy_rate(b + 512)) << b;
  // The 7B shape's down as Q4_0_NM: 14336 rows of 2048 bytes, 448 blocks' tables of 8 KiB; dense
  // 4096 rows of 14336 Q4_0 values.
  const size_t row = 2048, tables = 448 * 8192, dense = 4096 * (14336 / 32) * 18;
  const int64_t k = input_copy_max_kept({row}, {tables}, dense);
  const auto copy_time = [&](int64_t kept) {
    return (static_cast<double>(kept) * static_cast<double>(row) + static_cast<double>(tables)) / input_copy_rate(row);
  };
  EXPECT_LE(copy_time(k), static_cast<double>(dense));
  EXPECT_GT(copy_time(k + 1), static_cast<double>(dense));
  EXPECT_GT(k, 14336 / 2) << "at 2 KiB rows the copy pays from about 42 % sparsity";
  EXPECT_LT(k, 14336 * 6 / 10);
  EXPECT_GT(input_copy_max_kept({14336}, {4096 / 32 * 28672 * 2}, 28672 * (4096 / 32) * 18), 4096 * 3 / 4)
      << "long rows pay from lower sparsity";
  EXPECT_EQ(input_copy_max_kept({row}, {dense}, dense), -1) << "tables alone read longer than dense";
  EXPECT_THROW(input_copy_max_kept({row}, {}, dense), std::exception);

  // Q4_0 layers with 512-wide FFNs, copies of every site (kAllCopies), one token.
  const ChoiceCase cc = choice_case("choice.gguf");
  const Model& mdl = *cc.m;
  ThreadPool pool(2);
  // Keeping every input (t < 0): the dense kernels at every site; keeping a few (|x| > 2, about
  // 5 %; |h| > 0.05 on the FFN's values): every copy.
  for (float t : {-1.0f, 2.0f}) {
    const InputThresholds thr(3, {t, t, t, t > 0 ? 0.05f : t});
    InputSparseExecutor chooser(mdl, pool, thr, cpu::NeuronMajorType::exact, 4, kAllCopies, true),
        copies(mdl, pool, thr, cpu::NeuronMajorType::exact, 4, kAllCopies, false),
        dense(mdl, pool, thr, cpu::NeuronMajorType::exact, 4, kAllDense);
    const auto layer = [&](InputSparseExecutor& ex) { return decode_layer(ex, mdl, pool, cc.x); };
    const std::vector<float> got = layer(chooser);
    const InputSparsityStats& st = chooser.stats();
    for (int s : {0, 2, 3}) {
      EXPECT_EQ(st.tokens[1][s], 1u) << s;
      EXPECT_EQ(st.copy_tokens[1][s], t < 0 ? 0u : 1u) << "site " << s << " threshold " << t;
      EXPECT_DOUBLE_EQ(st.copy_share(s), t < 0 ? 0.0 : 1.0) << s;
    }
    EXPECT_EQ(got, layer(t < 0 ? dense : copies)) << "threshold " << t;
  }
}

// A copy no decode token would read is not kept: where the inputs keep on average (the
// allocation's dropped shares on the profile's corpus) more than kInputCopySlack times the copy's
// break-even count. Keeping everything (t < 0, nothing dropped): no copy at all, and the bits of
// an executor that has them and never reads them; keeping about 5 % (95 % dropped): every copy
// that pays, the same as without the shares. Shares for other layers are refused.
TEST(InputSparse, NoCopyWhereNoTokenWouldReadIt) {
  const ChoiceCase cc = choice_case("unpaid.gguf");
  const Model& mdl = *cc.m;
  ThreadPool pool(2);
  const auto layer = [&](InputSparseExecutor& ex) { return decode_layer(ex, mdl, pool, cc.x); };
  for (float t : {-1.0f, 2.0f}) {
    const InputThresholds thr(3, {t, t, t, t > 0 ? 0.05f : t});
    const float share = t < 0 ? 0.0f : 0.95f;
    const std::vector<std::array<float, kInputSites>> dropped(3, {share, share, share, share});
    InputSparseExecutor every(mdl, pool, thr, cpu::NeuronMajorType::exact, 4, kAllCopies, true),
        lean(mdl, pool, thr, cpu::NeuronMajorType::exact, 4, kAllCopies, true, dropped);
    EXPECT_GT(every.copy_bytes(), 0u);
    if (t < 0) {
      EXPECT_EQ(lean.copy_bytes(), 0u);
    } else {
      EXPECT_EQ(lean.copy_bytes(), every.copy_bytes());
    }
    EXPECT_EQ(layer(every), layer(lean)) << "threshold " << t;
    for (int s = 0; s < kInputSites; ++s) EXPECT_EQ(every.stats().copy_tokens[1][s], lean.stats().copy_tokens[1][s]);
  }
  const InputThresholds thr(3, {1.0f, 1.0f, 1.0f, 0.05f});
  EXPECT_THROW(InputSparseExecutor(mdl, pool, thr, cpu::NeuronMajorType::exact, 4, kAllCopies, true,
                                   std::vector<std::array<float, kInputSites>>(2)),
               Error);
}

// As the loader and sparsify run input mode (repack_for_session): the file's layout kept
// (Model::file_layers), every layer matrix repacked for the dense kernels (prompts and dense
// sites read those), the copies built from the file's layout. It computes what the model without
// repacking computes, to the kernels' rounding (or to an input that rounding moved across its threshold),
// with every site through a copy, with the default (all dense at this size: Q4_0 rows of 72-396
// bytes) and with gate|up alone through its copy (a 300-byte minimum).
TEST(InputSparse, CopiesFromTheFileLayoutBesideRepackedMatrices) {
  if (!cpu::r16_pays(DType::Q4_0)) GTEST_SKIP() << "Q4_0 is not repacked at this SIMD level";
  auto plain = load_synth(small(DType::Q4_0, 14), "repack_plain.gguf");
  auto packed = load_synth(small(DType::Q4_0, 14), "repack_packed.gguf");
  const InputThresholds t = allocate_input_sparsity(profile_of(*plain), *plain, 0.4).thresholds;
  repack_for_session(*packed, FfnMode::input, repack_scope_for(FfnMode::input, false), ResidentWeights::in_file);
  for (size_t l = 0; l < packed->layers.size(); ++l) {
    const LayerWeights& L = packed->layers[l];
    for (const TensorView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn.gate, &L.ffn.up, &L.ffn.down})
      EXPECT_EQ(w->type, DType::Q4_0_R16) << w->name;
    EXPECT_EQ(packed->file_layer(l).wq.type, DType::Q4_0);
    for (int s = 0; s < kInputSites; ++s)  // decided on the file's types: the same either way
      EXPECT_EQ(input_site_dense(L, s, cpu::NeuronMajorType::exact, 300), s != 2) << s;
  }
  for (size_t min_row : {kAllCopies, kInputMinRowBytes, size_t{300}}) {
    InputSparsityStats sa, sb;
    const Logits a = run_input_mode(*plain, t, 2, &sa, min_row), b = run_input_mode(*packed, t, 2, &sb, min_row);
    // Where the two layouts' kernels round differently enough to move an input across its
    // threshold (AVX2, masked inputs on the dense kernels: 1-3 of 2112 in a layer), the runs are
    // different functions from there on; the counts must still agree that closely, and without
    // such a flip the outputs agree to rounding.
    uint64_t flips = 0, seen = 0;
    for (size_t l = 0; l < sa.kept.size(); ++l)
      for (int s = 0; s < kInputSites; ++s) {
        flips += sa.kept[l][s] > sb.kept[l][s] ? sa.kept[l][s] - sb.kept[l][s] : sb.kept[l][s] - sa.kept[l][s];
        seen += sa.seen[l][s];
        EXPECT_EQ(sa.seen[l][s], sb.seen[l][s]);
      }
    EXPECT_LE(flips * 500, seen) << min_row;
    if (flips == 0) {
      EXPECT_LT(test_support::max_rel_diff(a, b), 1e-3) << min_row;
    }
  }
}

// Thresholds below every input keep everything: input mode is the dense model (float weights:
// to rounding; Q4_0: both round the inputs to 8 bits, the copies' kernel per segment of up to 16
// kept inputs, the dense kernels per block of 32: roundings of the same size that differ).
TEST(InputSparse, KeepingEveryInputIsTheDenseModel) {
  for (DType t : {DType::F32, DType::Q4_0}) {
    auto m = load_synth(small(t, 2), "all.gguf");
    SessionParams p = test_support::session_params(2, 64, 64);
    Session dense(*m, p);
    const Logits want = test_support::session_logits(dense);
    for (size_t min_row : {kAllCopies, kInputMinRowBytes}) {
      InputSparsityStats st;
      const Logits got = run_input_mode(*m, InputThresholds(3, {-1.0f, -1.0f, -1.0f, -1.0f}), 2, &st, min_row);
      EXPECT_LT(test_support::max_rel_diff(want, got), t == DType::F32 ? 1e-4 : 3e-2) << dtype_name(t);
      EXPECT_EQ(st.sparsity(), 0.0);
    }
  }
}

// Session::set_dense (`ember bench --versus-dense`): an input-mode session switched to its dense
// path computes a dense session's logits bit for bit (both repacked as the CLI repacks them, so
// the same kernels read the same layouts), and switched back its own again; the other modes
// refuse it.
TEST(InputSparse, ItsDensePathIsADenseSessionBitForBit) {
  auto dense_m = load_synth(small(DType::Q4_0, 15), "versus_dense_d.gguf");
  auto input_m = load_synth(small(DType::Q4_0, 15), "versus_dense_i.gguf");
  const InputThresholds t = allocate_input_sparsity(profile_of(*input_m), *input_m, 0.5).thresholds;
  repack_for_session(*dense_m, FfnMode::dense, repack_scope_for(FfnMode::dense, false), ResidentWeights::in_file);
  repack_for_session(*input_m, FfnMode::input, repack_scope_for(FfnMode::input, false), ResidentWeights::in_file);
  SessionParams p = test_support::session_params(2, 64, 64);
  Session dense(*dense_m, p);
  const Logits want = test_support::session_logits(dense);
  const Logits sparse = run_input_mode(*input_m, t, 2, nullptr, kAllCopies);
  p.sparse.mode = FfnMode::input;
  p.sparse.input_thresholds = t;
  p.sparse.input_min_row_bytes = kAllCopies;
  p.sparse.input_copy_by_cost = false;
  Session s(*input_m, p);
  s.set_dense(true);
  EXPECT_EQ(test_support::session_logits(s), want);
  uint64_t seen = s.input_sparse()->stats().batch_tokens;  // the executor was not asked
  for (const auto& layer : s.input_sparse()->stats().seen)
    for (uint64_t v : layer) seen += v;
  EXPECT_EQ(seen, 0u);
  s.set_dense(false);
  s.reset();
  const Logits back = test_support::session_logits(s);
  EXPECT_EQ(back, sparse);
  EXPECT_GT(test_support::max_rel_diff(back, want), 1e-4);  // at 50 %, input mode is not the dense model

  EXPECT_NE(test_support::error_of([&] { dense.set_dense(true); }).find("input mode only"), std::string::npos);
  SessionParams th = test_support::session_params(1, 64, 64);
  th.sparse.mode = FfnMode::oracle;
  auto plain = load_synth(small(DType::Q4_0, 15), "versus_dense_o.gguf");
  Session oracle(*plain, th);
  EXPECT_NE(test_support::error_of([&] { oracle.set_dense(true); }).find("neuron-sparse"), std::string::npos);
}

// The decode path (the copies) and the prompt path (the file's layout with inputs zeroed)
// compute one function: a sequence evaluated token by token gives the logits of the same
// sequence as one batch; the measured sparsity follows the allocation; thread counts change no
// bit.
TEST(InputSparse, DecodeAndPromptPathsAgreeAndThreadsChangeNothing) {
  auto m = load_synth(small(DType::F32, 3), "paths.gguf");
  const Profile prof = profile_of(*m);
  const InputSparsityPlan plan = allocate_input_sparsity(prof, *m, 0.5);
  const std::vector<int32_t> tokens = test_support::session_tokens(*m, 18);
  for (size_t min_row : {kAllCopies, kInputMinRowBytes}) {
  SessionParams p = test_support::session_params(2, 64, 64);
  p.sparse.mode = FfnMode::input;
  p.sparse.input_thresholds = plan.thresholds;
  p.sparse.input_min_row_bytes = min_row;
  p.sparse.input_copy_by_cost = min_row != kAllCopies;
  Session batch(*m, p), single(*m, p);
  std::vector<float> all(tokens.size() * static_cast<size_t>(m->hp.n_vocab));
  batch.eval_all_logits(tokens.data(), static_cast<int64_t>(tokens.size()), all.data());
  double worst = 0, mag = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    single.eval(&tokens[t], 1);
    for (int64_t i = 0; i < m->hp.n_vocab; ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(single.logits()[i] - all[t * m->hp.n_vocab + i])));
      mag = std::max(mag, static_cast<double>(std::fabs(all[t * m->hp.n_vocab + i])));
    }
  }
  EXPECT_LT(worst / mag, 1e-3) << min_row;
  // Random tokens of the profile's kind: the sparsity measured on decode is near the target.
  EXPECT_NEAR(single.input_sparse()->stats().sparsity(), 0.5, 0.08) << min_row;
  // Bytes per token: the kept rows of the copies, dense sites' matrices whole.
  EXPECT_GT(single.input_sparse()->weight_bytes_per_token(), 0.0);
  EXPECT_LT(single.input_sparse()->weight_bytes_per_token(), static_cast<double>(m->weight_bytes_per_token()));
  }

  auto q = load_synth(small(DType::Q4_0, 3), "paths_q4.gguf");
  const InputThresholds tq = allocate_input_sparsity(profile_of(*q), *q, 0.4).thresholds;
  for (size_t min_row : {kAllCopies, kInputMinRowBytes}) {
    const Logits a = run_input_mode(*q, tq, 1, nullptr, min_row), b = run_input_mode(*q, tq, 2, nullptr, min_row),
                 c = run_input_mode(*q, tq, 3, nullptr, min_row);
    EXPECT_EQ(a, b) << min_row;
    EXPECT_EQ(a, c) << min_row;
  }
}

// The allocation meets each layer's share, gives sites where sparsity costs little more of it,
// costs less error than the uniform one, and round-trips through the profile file.
TEST(InputAllocation, GreedyMeetsTheTargetAndSpendsErrorWhereItIsCheap) {
  auto m = load_synth(small(DType::F32, 6), "alloc.gguf");
  Profile prof = profile_of(*m);
  ASSERT_TRUE(prof.has_input_tables());
  const std::string path = (temp_dir() / "alloc.profile.gguf").string();
  write_profile(prof, path);
  const Profile back = read_profile(path);
  EXPECT_EQ(back.input_quantiles, prof.input_quantiles);
  EXPECT_EQ(back.input_energy, prof.input_energy);

  for (double target : {0.25, 0.4, 0.5}) {
    const InputSparsityPlan g = allocate_input_sparsity(prof, *m, target);
    const InputSparsityPlan u = allocate_input_sparsity(prof, *m, target, InputAllocation::uniform);
    EXPECT_NEAR(g.weighted_sparsity, target, 0.006) << target;
    EXPECT_NEAR(u.weighted_sparsity, target, 1e-6) << target;
    double eg = 0, eu = 0;
    for (int64_t l = 0; l < m->hp.n_layer; ++l) {
      const auto w = input_site_weights(m->layers[static_cast<size_t>(l)]);
      double skipped = 0, total = 0;
      for (int s = 0; s < kInputSites; ++s) {
        EXPECT_LE(g.sparsity[l][s], 0.95f);
        EXPECT_FLOAT_EQ(u.sparsity[l][s], static_cast<float>(target));
        // Each threshold is the profile's quantile at the site's sparsity.
        EXPECT_FLOAT_EQ(g.thresholds[l][s],
                        prof.input_quantiles[l][static_cast<size_t>(s * kQuantiles + std::lround(g.sparsity[l][s] * 1000))]);
        skipped += w[s] * g.sparsity[l][s], total += w[s];
        eg += g.error[l][s], eu += u.error[l][s];
      }
      EXPECT_NEAR(skipped / total, target, 0.006) << "layer " << l;
    }
    EXPECT_LE(eg, eu) << target;
  }
  // A site whose entries below the 90 % quantile hold no energy at all is filled up to there
  // before any error is spent elsewhere.
  Profile cheap = prof;
  for (auto& e : cheap.input_energy)
    for (int64_t k = 0; k < kQuantiles; ++k)
      e[static_cast<size_t>(1 * kQuantiles + k)] = k <= 900 ? 0.0f : (k - 900) / 100.0f;
  const InputSparsityPlan c = allocate_input_sparsity(cheap, *m, 0.3);
  for (int64_t l = 0; l < m->hp.n_layer; ++l) {
    EXPECT_GE(c.sparsity[l][1], 0.9f) << "layer " << l;
    for (int s : {0, 2, 3}) EXPECT_LT(c.sparsity[l][s], 0.9f) << "layer " << l;
  }

  Profile old = prof;
  old.input_quantiles.clear();
  old.input_energy.clear();
  EXPECT_THROW(allocate_input_sparsity(old, *m, 0.5), Error);  // a profile from before the tables
  EXPECT_THROW(allocate_input_sparsity(prof, *m, 0.99), Error);
}

// The model file at `path` with every layer's tensor `suffix` (F32) times `factor`, as `out`.
std::unique_ptr<Model> with_scaled_tensors(const std::string& path, const std::string& out, const std::string& suffix,
                                           float factor) {
  gguf::Reader r(path);
  gguf::Writer w(r.alignment());
  for (const std::string& k : r.keys()) w.set(k, r.metadata().at(k));
  for (const auto& t : r.tensors()) {
    const TensorView v = r.view(t);
    std::vector<uint8_t> b(v.data, v.data + v.nbytes);
    if (t.name.size() > suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      EXPECT_EQ(v.type, DType::F32);
      float* f = reinterpret_cast<float*>(b.data());
      for (size_t i = 0; i < b.size() / sizeof(float); ++i) f[i] *= factor;
    }
    w.add_tensor(t.name, v.type, std::vector<int64_t>(v.ne, v.ne + v.n_dims), std::move(b));
  }
  w.write(out);
  return load_model(out);
}

// The small synth of one architecture family, with the head counts it needs.
SynthOptions family(const char* arch, uint64_t seed) {
  SynthOptions o = small(DType::F32, seed);
  o.arch = arch;
  o.act = synth_default_activation(arch);
  if (std::string(arch) == "falcon") o.n_head_kv = 1;
  if (std::string(arch) == "opt") o.n_head_kv = o.n_head;
  return o;
}

// The block allocation measures each layer's output. Where a site's matrix barely reaches it
// (wo scaled by 1e-3: the attention adds almost nothing), the site goes to its cap before the
// others spend error, which the input energies cannot see (the energy greedy gives it far less);
// each layer meets its share; the thresholds are the profile's quantiles. On the plain model the
// whole model's logits stay far closer to dense than with the uniform allocation at the same
// share (measured apart from the allocation: a session's logits on other tokens). Against the
// energy greedy this random model shows no steady order (0.84x its error at 25 %, 1.1x at 50 %);
// real models are measured in docs/agreement.md.
TEST(InputAllocation, BlockSpendsErrorWhereTheLayersOutputMovesLeast) {
  const SynthOptions o = small(DType::F32, 6);
  auto plain = load_synth(o, "block.gguf");
  auto quiet = with_scaled_tensors((temp_dir() / "block.gguf").string(), (temp_dir() / "block-quiet.gguf").string(),
                                   "attn_output.weight", 1e-3f);
  ThreadPool pool(2);
  const std::vector<int32_t> calib = random_tokens(256, o.n_vocab, 11);
  BlockAllocationOptions bo;
  bo.tokens = 192;
  bo.chunk = 64;
  const Profile pq = profile_of(*quiet);
  int64_t layers_seen = 0;
  const InputSparsityPlan b = allocate_input_sparsity_by_block(pq, *quiet, 0.3, pool, calib, bo,
                                                               [&](int64_t l, const std::string&) {
                                                                 EXPECT_EQ(l, layers_seen++);
                                                               });
  EXPECT_EQ(layers_seen, quiet->hp.n_layer);
  const InputSparsityPlan g = allocate_input_sparsity(pq, *quiet, 0.3);
  ASSERT_EQ(b.block_error.size(), static_cast<size_t>(quiet->hp.n_layer));
  for (int64_t l = 0; l < quiet->hp.n_layer; ++l) {
    EXPECT_GE(b.sparsity[l][1], 0.949f) << "layer " << l;
    EXPECT_LT(g.sparsity[l][1], 0.7f) << "layer " << l;
    const auto w = input_site_weights(quiet->layers[static_cast<size_t>(l)]);
    double skipped = 0, total = 0;
    for (int s = 0; s < kInputSites; ++s) {
      skipped += w[s] * b.sparsity[l][s], total += w[s];
      EXPECT_FLOAT_EQ(b.thresholds[l][s],
                      b.sparsity[l][s] == 0.0f
                          ? -1.0f
                          : pq.input_quantiles[l][static_cast<size_t>(s * kQuantiles + std::lround(b.sparsity[l][s] * 1000))]);
    }
    EXPECT_NEAR(skipped / total, 0.3, 0.001) << "layer " << l;
    EXPECT_GE(b.block_error[l], 0.0);
    EXPECT_LT(b.block_error[l], 0.5);
  }

  const Profile pp = profile_of(*plain);
  SessionParams sp = test_support::session_params(2, 64, 64);
  Session dense(*plain, sp);
  const Logits want = test_support::session_logits(dense);
  const auto mean_sq = [&](const Logits& got) {
    double e = 0;
    for (size_t t = 0; t < want.size(); ++t)
      for (size_t i = 0; i < want[t].size(); ++i) e += std::pow(static_cast<double>(got[t][i]) - want[t][i], 2);
    return e;
  };
  for (double target : {0.25, 0.5}) {
    const InputSparsityPlan bp = allocate_input_sparsity_by_block(pp, *plain, target, pool, calib, bo);
    EXPECT_NEAR(bp.weighted_sparsity, target, 0.001);
    const double eb = mean_sq(run_input_mode(*plain, bp.thresholds, 2));
    const double eu = mean_sq(run_input_mode(*plain, allocate_input_sparsity(pp, *plain, target,
                                                                             InputAllocation::uniform).thresholds, 2));
    EXPECT_LT(eb, 0.6 * eu) << target;  // measured: 0.32 and 0.54 of it
  }

  // Only sparsify runs the model: the profile-only entry refuses the block allocation; too few
  // tokens are named.
  using test_support::error_of;
  EXPECT_NE(error_of([&] { allocate_input_sparsity(pp, *plain, 0.3, InputAllocation::block); }).find("sparsify"),
            std::string::npos);
  EXPECT_NE(error_of([&] { allocate_input_sparsity_by_block(pp, *plain, 0.3, pool, std::vector<int32_t>(8, 1), bo); })
                .find("at least 16"),
            std::string::npos);
  EXPECT_NE(error_of([&] { allocate_input_sparsity_by_block(pp, *plain, 0.3, pool, std::vector<int32_t>(64, -1), bo); })
                .find("vocabulary"),
            std::string::npos);
  EXPECT_EQ(parse_input_allocation("block"), InputAllocation::block);
  EXPECT_STREQ(input_allocation_name(InputAllocation::block), "block");
}

// A candidate runs the layer only from its site's stage on (the stages before it kept from the
// current plan): the same plan, bit for bit, as running the whole layer for every candidate, on
// every family the blocks build (parallel residual, post-norms, no gate with biases, fused Q/K/V).
TEST(InputAllocation, BlockStagedRunsEqualWholeLayerRuns) {
  for (const char* arch : {"llama", "phi3", "falcon", "gemma3", "opt", "qwen2"}) {
    SynthOptions o = family(arch, 23);
    o.n_layer = 2;
    auto m = load_synth(o, std::string("staged_") + arch + ".gguf");
    const Profile prof = profile_of(*m);
    ThreadPool pool(2);
    const std::vector<int32_t> calib = random_tokens(128, o.n_vocab, 5);
    BlockAllocationOptions bo;
    bo.tokens = 64;
    bo.chunk = 32;
    bo.step = 0.05;
    const InputSparsityPlan staged = allocate_input_sparsity_by_block(prof, *m, 0.4, pool, calib, bo);
    bo.whole_layers = true;
    const InputSparsityPlan whole = allocate_input_sparsity_by_block(prof, *m, 0.4, pool, calib, bo);
    EXPECT_NEAR(staged.weighted_sparsity, 0.4, 0.002) << arch;
    EXPECT_EQ(staged.block_error, whole.block_error) << arch;
    EXPECT_EQ(staged.sparsity, whole.sparsity) << arch;
    for (size_t l = 0; l < staged.block_error.size(); ++l) EXPECT_GT(staged.block_error[l], 0.0) << arch << " " << l;
  }
}

// Where sites' copies can pay (a shape whose four sites all have rows of 2 KiB or more), the
// block allocation spends the share only where a decode token skips the weights: every share it
// gives lies past its site's break-even (input_copy_pays, the executor's rule), decode tokens read
// those sites' copies, and the layer still meets its share. Allocated over every site, some
// shares fall below their break-even: weights counted as skipped that decode reads.
TEST(InputAllocation, BlockSpendsTheShareWhereDecodeSkipsWeights) {
  SynthOptions o = small(DType::F32, 8);
  o.n_embd = 512;  // rows: q|k|v 4 KiB, o 2 KiB, gate|up 8 KiB, down 2 KiB
  o.n_ff = 1024;
  o.n_layer = 2;
  o.n_head = 8;
  o.n_head_kv = 4;
  auto m = load_synth(o, "pays.gguf");
  const Profile prof = profile_of(*m);
  ThreadPool pool(2);
  const std::vector<int32_t> calib = random_tokens(256, o.n_vocab, 11);
  BlockAllocationOptions bo;
  bo.tokens = 128;
  bo.chunk = 64;
  bo.paying_sites_only = true;
  std::array<int64_t, kInputSites> n_in{};
  for (int s = 0; s < kInputSites; ++s) n_in[s] = input_site_matrices(m->layers[0]).site[s][0]->cols();
  for (double target : {0.3, 0.5}) {
    const InputSparsityPlan plan = allocate_input_sparsity_by_block(prof, *m, target, pool, calib, bo);
    EXPECT_NEAR(plan.weighted_sparsity, target, 0.002) << target;
    int64_t below = 0;
    bo.paying_sites_only = false;
    const InputSparsityPlan all = allocate_input_sparsity_by_block(prof, *m, target, pool, calib, bo);
    bo.paying_sites_only = true;
    for (int64_t l = 0; l < o.n_layer; ++l) {
      for (int s = 0; s < kInputSites; ++s) {
        const int64_t mk = input_site_max_kept(m->file_layer(static_cast<size_t>(l)), m->layers[l], s,
                                               cpu::NeuronMajorType::exact);
        ASSERT_NE(mk, kInputCopyNone) << s;
        if (plan.sparsity[l][s] > 0) {
          EXPECT_TRUE(input_copy_pays(mk, plan.sparsity[l][s], n_in[s])) << target << " layer " << l << " site " << s;
        }
        if (all.sparsity[l][s] > 0 && !input_copy_pays(mk, all.sparsity[l][s], n_in[s])) ++below;
      }
    }
    EXPECT_GT(below, 0) << target;
    InputSparsityStats st;
    run_input_mode(*m, plan.thresholds, 2, &st);
    for (int64_t l = 0; l < o.n_layer; ++l)
      for (int s = 0; s < kInputSites; ++s)
        if (plan.sparsity[l][s] > 0) {
          EXPECT_GT(st.copy_tokens[l][s], st.tokens[l][s] / 2) << target << " layer " << l << " site " << s;
        }
  }
}

// Thresholds stored in the model (ember.input_sparsity.thresholds, what `ember sparsify`
// writes) are used when none are given; a wrong count is refused at load; input mode without
// thresholds, or with the hybrid, names what to do.
TEST(InputSparse, ThresholdsFromTheModelFileAndRefusals) {
  SynthOptions o = small(DType::Q4_0, 9);
  gguf::Writer w = synth_model(o);
  std::vector<float> flat;
  for (int l = 0; l < 3; ++l) flat.insert(flat.end(), {0.1f, 0.2f, 0.3f, l == 2 ? 1e6f : 0.01f});
  w.set("ember.input_sparsity.thresholds", gguf::Value::floats(flat));
  const std::string path = (temp_dir() / "with_input_thresholds.gguf").string();
  w.write(path);
  auto m = load_model(path);
  ASSERT_EQ(m->input_thresholds.size(), 3u);
  EXPECT_FLOAT_EQ(m->input_thresholds[1][2], 0.3f);
  SessionParams sp = test_support::session_params(1, 32, 8);
  sp.sparse.mode = FfnMode::input;
  Session s(*m, sp);
  const auto tokens = random_tokens(4, m->hp.n_vocab, 5);
  s.eval(tokens.data(), 3);
  s.eval(tokens.data() + 3, 1);
  const InputSparsityStats& st = s.input_sparse()->stats();
  EXPECT_EQ(st.kept[2][static_cast<int>(InputSite::ffn_hidden)], 0u);  // layer 2 drops every h
  EXPECT_GT(st.kept[1][static_cast<int>(InputSite::ffn_hidden)], 0u);

  EXPECT_TRUE(m->input_sparsity.empty());  // a file without the shares (before they were written)
  // The dropped shares beside the thresholds: 4 per layer, each in [0, 1].
  std::vector<float> shares(12, 0.5f);
  w.set("ember.input_sparsity.sparsity", gguf::Value::floats(shares));
  w.write(path);
  EXPECT_FLOAT_EQ(load_model(path)->input_sparsity[2][3], 0.5f);
  shares[5] = 1.5f;
  w.set("ember.input_sparsity.sparsity", gguf::Value::floats(shares));
  w.write(path);
  EXPECT_NE(test_support::error_of([&] { load_model(path); }).find("must be in [0, 1]"), std::string::npos);
  shares.pop_back();
  w.set("ember.input_sparsity.sparsity", gguf::Value::floats(shares));
  w.write(path);
  EXPECT_NE(test_support::error_of([&] { load_model(path); }).find("4 per layer"), std::string::npos);
  shares.assign(12, 0.5f);
  w.set("ember.input_sparsity.sparsity", gguf::Value::floats(shares));
  flat.pop_back();
  w.set("ember.input_sparsity.thresholds", gguf::Value::floats(flat));
  w.write(path);
  EXPECT_THROW(load_model(path), Error);
  auto plain = load_synth(o, "no_input_thresholds.gguf");
  EXPECT_THROW(Session(*plain, sp), Error);
  SessionParams hy = sp;
  hy.sparse.input_thresholds = InputThresholds(3, {0.f, 0.f, 0.f, 0.f});
  hy.hybrid.vram_budget = 1 << 20;
  EXPECT_THROW(Session(*plain, hy), Error);
  EXPECT_EQ(parse_ffn_mode("input"), FfnMode::input);
}

// `ember sparsify`: every tensor and key of the model unchanged, the plan's thresholds added;
// the result runs input mode without a profile and equals the model with the thresholds given.
TEST(Sparsify, EmbedsThePlansThresholdsAndChangesNothingElse) {
  auto m = load_synth(small(DType::Q4_0, 12), "sparsify_in.gguf");
  const std::string prof = (temp_dir() / "sparsify.profile.gguf").string();
  write_profile(profile_of(*m), prof);
  SparsifyOptions o;
  o.model = m->file->path();
  o.profile = prof;
  o.output = (temp_dir() / "sparsify_out.gguf").string();
  o.sparsity = 0.4;
  const SparsifySummary s = sparsify_model(o);
  EXPECT_NEAR(s.plan.weighted_sparsity, 0.4, 0.006);
  auto out = load_model(o.output);
  EXPECT_EQ(out->input_thresholds, s.plan.thresholds);
  EXPECT_EQ(out->input_sparsity, s.plan.sparsity);  // what a session decides its copies by
  const gguf::Reader &a = *m->file, &b = *out->file;
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const gguf::TensorInfo& t : a.tensors()) {
    const TensorView va = a.view(t), vb = b.view(t.name);
    ASSERT_TRUE(vb.valid()) << t.name;
    ASSERT_EQ(va.nbytes, vb.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(va.data, vb.data, va.nbytes), 0) << t.name;
  }
  for (const std::string& k : a.keys()) EXPECT_TRUE(b.has(k)) << k;
  SessionParams p = test_support::session_params(2, 64, 64);
  p.sparse.mode = FfnMode::input;
  Session embedded(*out, p);
  const Logits got = test_support::session_logits(embedded);
  EXPECT_EQ(got, run_input_mode(*m, s.plan.thresholds, 2));
  o.output = o.model;
  EXPECT_THROW(sparsify_model(o), Error);
}

// Every family the blocks build (fused Q/K/V and gate/up, parallel residual, no gate with
// biases, Q/K norms, post-norms): input mode's decode path and prompt path compute one function,
// and each reaches a real share of skipped weights.
TEST(InputSparse, EveryFamilyRunsOneFunctionOnBothPaths) {
  for (const char* arch : {"phi3", "falcon", "qwen3", "gemma3", "opt", "qwen2"}) {
    const SynthOptions o = family(arch, 21);
    auto m = load_synth(o, std::string("family_") + arch + ".gguf");
    const InputThresholds t = allocate_input_sparsity(profile_of(*m), *m, 0.4).thresholds;
    const std::vector<int32_t> tokens = test_support::session_tokens(*m, 10);
    for (size_t min_row : {kAllCopies, kInputMinRowBytes}) {
    SessionParams p = test_support::session_params(2, 64, 64);
    p.sparse.mode = FfnMode::input;
    p.sparse.input_thresholds = t;
    p.sparse.input_min_row_bytes = min_row;
    p.sparse.input_copy_by_cost = min_row != kAllCopies;
    Session batch(*m, p), single(*m, p);
    const int64_t nv = m->hp.n_vocab;
    std::vector<float> all(tokens.size() * static_cast<size_t>(nv));
    batch.eval_all_logits(tokens.data(), static_cast<int64_t>(tokens.size()), all.data());
    double worst = 0, mag = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      single.eval(&tokens[i], 1);
      for (int64_t v = 0; v < nv; ++v) {
        worst = std::max(worst, static_cast<double>(std::fabs(single.logits()[v] - all[i * nv + v])));
        mag = std::max(mag, static_cast<double>(std::fabs(all[i * nv + v])));
      }
    }
    EXPECT_LT(worst / mag, 1e-3) << arch << " " << min_row;
    EXPECT_GT(single.input_sparse()->stats().sparsity(), 0.2) << arch;
    }
  }
}
