// Input sparsity inside a mixture's experts (sparse/input_sparse.hpp's run_moe): the router reads
// the FFN input whole, each chosen expert's gate and up read it masked at ffn_in's threshold and
// its down its values masked at ffn_hidden's. Held to a double reference of that function on
// every path (one token through each expert's copies, one token and a batch through the
// mixture's fused paths), the session's decode against its prompt path, the dense model where
// every input is kept, thread counts, and the profile and block allocation over experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "engine/profile_run.hpp"
#include "engine/session.hpp"
#include "model/moe.hpp"
#include "model/workspace.hpp"
#include "sparse/input_allocation.hpp"
#include "sparse/input_sparse.hpp"
#include "support/session_logits.hpp"
#include "support/session_params.hpp"
#include "support/synth_files.hpp"

using namespace ember;
using test_support::Logits;

namespace {

// A Mixtral-shaped synth: 6 experts, 2 chosen, 128 wide, experts of 96 neurons.
std::unique_ptr<Model> load_moe(DType type, const std::string& name, int64_t n_used = 2) {
  SynthOptions o;
  o.type = type;
  o.act = FfnActivation::silu;
  o.n_embd = 128;
  o.n_ff = 96;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.n_expert = 6;
  o.n_expert_used = n_used;
  o.seed = 31;
  o.n_threads = 1;
  return test_support::load_synth_in(test_support::test_temp_dir("moe-input-sparse"), o, name);
}

Profile profile_of(const Model& m) {
  Session s(m, test_support::session_params(2, 64, 64));
  ProfileOptions o;
  o.n_ctx = 64;
  o.sparsity = 0.5f;
  return run_profile(s, test_support::random_tokens(128, m.hp.n_vocab, 7), o);
}

constexpr size_t kAllCopies = 0, kAllDense = kInputNoCopies;

double dot(const TensorView& w, int64_t row, const std::vector<double>& x) {
  const auto* r = reinterpret_cast<const float*>(w.row(row));
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += static_cast<double>(r[i]) * x[i];
  return s;
}

// The function in doubles, for one token of an F32 mixture: softmax of the router on x, the
// n_used largest renormalised, each chosen expert's SwiGLU on x masked at t_in with its values
// masked at t_h, summed by weight.
std::vector<double> reference(const MoeWeights& moe, const float* x, float t_in, float t_h) {
  const int64_t d = moe.router.cols(), ne = moe.n_expert();
  std::vector<double> xd(x, x + d), xm(static_cast<size_t>(d)), p(static_cast<size_t>(ne));
  for (int64_t i = 0; i < d; ++i) xm[static_cast<size_t>(i)] = std::fabs(x[i]) > t_in ? x[i] : 0.0;
  double mx = -1e300, sum = 0;
  for (int64_t e = 0; e < ne; ++e) mx = std::max(mx, p[static_cast<size_t>(e)] = dot(moe.router, e, xd));
  for (double& v : p) sum += (v = std::exp(v - mx));
  std::vector<int> order(static_cast<size_t>(ne));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
  double chosen = 0;
  for (int64_t i = 0; i < moe.n_used; ++i) chosen += p[static_cast<size_t>(order[static_cast<size_t>(i)])];
  std::vector<double> out(static_cast<size_t>(d), 0.0);
  for (int64_t i = 0; i < moe.n_used; ++i) {
    const int e = order[static_cast<size_t>(i)];
    const FfnWeights& w = moe.experts[static_cast<size_t>(e)];
    const int64_t n_ff = w.n_ff();
    std::vector<double> h(static_cast<size_t>(n_ff));
    for (int64_t j = 0; j < n_ff; ++j) {
      const double g = dot(w.gate, j, xm), u = dot(w.up, j, xm);
      const double v = g / (1.0 + std::exp(-g)) * u;
      h[static_cast<size_t>(j)] = std::fabs(v) > t_h ? v : 0.0;
    }
    const double weight = p[static_cast<size_t>(e)] / chosen;
    for (int64_t c = 0; c < d; ++c) out[static_cast<size_t>(c)] += weight * dot(w.down, c, h);
  }
  return out;
}

}  // namespace

// Every path of run_moe against the reference: one token through each chosen expert's copies
// (kAllCopies), one token and a batch of 5 through the mixture's fused paths on masked inputs
// (kAllDense), with the thresholds dropping about half of each site's inputs; and the counts.
TEST(MoeInputSparse, EveryPathComputesTheMaskedMixture) {
  auto m = load_moe(DType::F32, "paths.gguf");
  const int64_t d = m->hp.n_embd, n = 5;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * d));
  for (float& v : x) v = nd(rng);
  const float t_in = 0.67f, t_h = 0.02f;  // |N(0,1)| > 0.67: half kept
  InputThresholds t(2, {-1.0f, -1.0f, t_in, t_h});
  ThreadPool pool(2);
  for (size_t min_row : {kAllCopies, kAllDense}) {
    InputSparseExecutor ex(*m, pool, t, cpu::NeuronMajorType::exact, n, min_row, /*by_cost=*/false);
    Workspace ws;
    ws.init(*m, n, 16, pool.size());
    const MoeWeights& moe = m->layers[1].moe;
    std::vector<float> out(static_cast<size_t>(n * d));
    for (int64_t batch : {int64_t{1}, n}) {
      if (batch == n && min_row == kAllCopies) continue;  // batches never read copies
      for (int64_t t0 = 0; t0 < n; t0 += batch)
        ex.run_moe(pool, 1, moe, m->hp.act, x.data() + t0 * d, batch, out.data() + t0 * d, ws);
      double worst = 0, mag = 0;
      for (int64_t tok = 0; tok < n; ++tok) {
        const std::vector<double> want = reference(moe, x.data() + tok * d, t_in, t_h);
        for (int64_t c = 0; c < d; ++c) {
          worst = std::max(worst, std::fabs(want[static_cast<size_t>(c)] - out[static_cast<size_t>(tok * d + c)]));
          mag = std::max(mag, std::fabs(want[static_cast<size_t>(c)]));
        }
      }
      EXPECT_GT(mag, 1e-3);
      EXPECT_LT(worst / mag, 1e-4) << "min_row " << min_row << " batch " << batch;
    }
    // The 5 decode tokens, each read by 2 experts at each FFN site; about half of x kept.
    const InputSparsityStats& st = ex.stats();
    EXPECT_EQ(st.seen[1][2], static_cast<uint64_t>(2 * n * d)) << min_row;
    EXPECT_EQ(st.tokens[1][3], static_cast<uint64_t>(2 * n)) << min_row;
    EXPECT_NEAR(st.sparsity(2), 0.5, 0.1) << min_row;
    EXPECT_GT(st.sparsity(3), 0.05) << min_row;
    EXPECT_EQ(st.copy_tokens[1][2], min_row == kAllCopies ? static_cast<uint64_t>(2 * n) : 0u);
    if (min_row == kAllCopies) EXPECT_GT(ex.copy_bytes(), 0u);
    else EXPECT_EQ(ex.copy_bytes(), 0u);
  }
}

// Every input kept: the input-sparse session is the dense model, bit for bit where it runs the
// dense kernels (no copies), to rounding through the copies (Q4_0: the copies' kernel rounds
// the inputs per segment, the dense kernels per block).
TEST(MoeInputSparse, KeepingEveryInputIsTheDenseMixture) {
  auto m = load_moe(DType::Q4_0, "all.gguf");
  SessionParams p = test_support::session_params(2, 64, 64);
  Session dense(*m, p);
  const Logits want = test_support::session_logits(dense);
  p.sparse.mode = FfnMode::input;
  p.sparse.input_thresholds = InputThresholds(2, {-1.0f, -1.0f, -1.0f, -1.0f});
  for (size_t min_row : {kAllDense, kAllCopies}) {
    p.sparse.input_min_row_bytes = min_row;
    p.sparse.input_copy_by_cost = false;
    Session s(*m, p);
    const Logits got = test_support::session_logits(s);
    if (min_row == kAllDense) EXPECT_EQ(got, want);
    else EXPECT_LT(test_support::max_rel_diff(want, got), 3e-2);
    EXPECT_EQ(s.input_sparse()->stats().sparsity(), 0.0);
  }
}

// From a profile of the mixture to a plan at 50 %, the session's decode tokens (through the
// experts' copies, or the fused paths) give the logits of the same sequence as one batch; the
// decode sparsity is near the plan's; the bytes a token reads fall; thread counts change no bit.
TEST(MoeInputSparse, DecodeAndPromptAgreeFromAProfilesPlan) {
  auto m = load_moe(DType::F32, "plan.gguf");
  const Profile prof = profile_of(*m);
  ASSERT_TRUE(prof.has_input_tables());
  const InputSparsityPlan plan = allocate_input_sparsity(prof, *m, 0.5);
  EXPECT_NEAR(plan.weighted_sparsity, 0.5, 0.01);
  const std::vector<int32_t> tokens = test_support::session_tokens(*m, 14);
  for (size_t min_row : {kAllCopies, kAllDense}) {
    SessionParams p = test_support::session_params(2, 64, 64);
    p.sparse.mode = FfnMode::input;
    p.sparse.input_thresholds = plan.thresholds;
    p.sparse.input_min_row_bytes = min_row;
    p.sparse.input_copy_by_cost = false;
    Session batch(*m, p), single(*m, p);
    const int64_t nv = m->hp.n_vocab;
    std::vector<float> all(tokens.size() * static_cast<size_t>(nv));
    batch.eval_all_logits(tokens.data(), static_cast<int64_t>(tokens.size()), all.data());
    double worst = 0, mag = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      single.eval(&tokens[t], 1);
      for (int64_t i = 0; i < nv; ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(single.logits()[i] - all[t * nv + i])));
        mag = std::max(mag, static_cast<double>(std::fabs(all[t * nv + i])));
      }
    }
    EXPECT_LT(worst / mag, 1e-3) << min_row;
    EXPECT_NEAR(single.input_sparse()->stats().sparsity(), 0.5, 0.1) << min_row;
    const double bytes = single.input_sparse()->weight_bytes_per_token();
    EXPECT_GT(bytes, 0.0);
    if (min_row == kAllCopies) EXPECT_LT(bytes, 0.8 * static_cast<double>(m->weight_bytes_per_token()));
    else EXPECT_EQ(bytes, static_cast<double>(m->weight_bytes_per_token()));
  }

  auto q = load_moe(DType::Q4_0, "threads.gguf");
  const InputThresholds tq = allocate_input_sparsity(profile_of(*q), *q, 0.4).thresholds;
  for (size_t min_row : {kAllCopies, kAllDense}) {
    Logits first;
    for (int threads : {1, 2, 3}) {
      SessionParams p = test_support::session_params(threads, 64, 64);
      p.sparse.mode = FfnMode::input;
      p.sparse.input_thresholds = tq;
      p.sparse.input_min_row_bytes = min_row;
      p.sparse.input_copy_by_cost = false;
      Session s(*q, p);
      const Logits got = test_support::session_logits(s);
      if (threads == 1) first = got;
      else EXPECT_EQ(got, first) << min_row << " threads " << threads;
    }
  }
}

// The block allocation runs a mixture's layers (their FFN whole from either FFN site): it meets
// the target, and its layers' output error is that of a sparsified layer, neither 0 nor a wreck.
TEST(MoeInputSparse, BlockAllocationRunsTheExperts) {
  auto m = load_moe(DType::F32, "block.gguf");
  const Profile prof = profile_of(*m);
  ThreadPool pool(2);
  BlockAllocationOptions o;
  o.tokens = 64;
  o.chunk = 32;
  o.step = 0.05;
  const InputSparsityPlan plan = allocate_input_sparsity_by_block(
      prof, *m, 0.5, pool, test_support::random_tokens(256, m->hp.n_vocab, 4), o);
  EXPECT_NEAR(plan.weighted_sparsity, 0.5, 0.02);
  ASSERT_EQ(plan.block_error.size(), 2u);
  for (double e : plan.block_error) {
    EXPECT_GT(e, 0.0);
    EXPECT_LT(e, 0.5);
  }
  for (const auto& sp : plan.sparsity) EXPECT_GT(sp[2] + sp[3], 0.0f);  // the experts' sites take a share
}
