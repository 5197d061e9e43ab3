// The sparse FFN executor in a whole forward pass: on ReLU synth models with an activation
// profile, oracle mode gives dense mode's logits (exact up to float rounding for float
// weights), measures the profile's sparsity, and does not depend on the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <algorithm>
#include <random>

#include "core/error.hpp"
#include "engine/session.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"
#include "support/ffn_modes.hpp"

using namespace ember;
using test_support::rel_diff;
using test_support::run_ffn_mode;
using test_support::Logits;

namespace {

std::string write_model(DType type, float sparsity, const std::string& name) {
  SynthOptions o;
  o.type = type;
  o.act = FfnActivation::relu;
  o.sparsity = sparsity;
  o.zipf = 1.1f;
  o.n_embd = 128;
  o.n_ff = 352;
  o.n_layer = 3;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.seed = 3;
  o.n_threads = 1;
  auto dir = std::filesystem::temp_directory_path() / "ember-test-sparse-ffn";
  std::filesystem::create_directories(dir);
  std::string path = (dir / (name + ".gguf")).string();
  synth_write(o, path);
  return path;
}

}  // namespace

TEST(SparseFfn, OracleMatchesDenseOnReluModel) {
  for (DType type : {DType::F32, DType::F16, DType::Q4_0}) {
    auto path = write_model(type, 0.9f, std::string(dtype_name(type)));
    auto model = load_model(path);
    auto dense = run_ffn_mode(*model, FfnMode::dense, 2);
    FfnSparsityStats st;
    auto oracle = run_ffn_mode(*model, FfnMode::oracle, 2, &st);
    const double rel = rel_diff(dense, oracle);
    std::printf("%s: max |oracle - dense| / max |logit| = %.2e, sparsity %.3f (layers %.3f %.3f %.3f)\n",
                std::string(dtype_name(type)).c_str(), rel, st.sparsity(), st.layer_sparsity(0), st.layer_sparsity(1),
                st.layer_sparsity(2));
    // Float weights: the same products in another order. Q4_0: the dense down product rounds
    // its activations to 8 bits and the oracle's neuron-major copy is Q8_0, so they differ by
    // 8-bit roundings.
    EXPECT_LT(rel, type == DType::Q4_0 ? 2e-2 : 1e-4) << dtype_name(type);
    EXPECT_NEAR(st.sparsity(), 0.9, 0.05) << dtype_name(type);
    std::filesystem::remove(path);
  }
}

TEST(SparseFfn, OracleIsIdenticalForAnyThreadCount) {
  auto path = write_model(DType::Q4_0, 0.8f, "threads");
  auto model = load_model(path);
  auto a = run_ffn_mode(*model, FfnMode::oracle, 1);
  auto b = run_ffn_mode(*model, FfnMode::oracle, 2);
  auto c = run_ffn_mode(*model, FfnMode::oracle, 3);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  std::filesystem::remove(path);
}

// Single tokens take the fused decode path (gate, firing test, up and each thread's share of
// down in one dispatch, the threads' partial sums then added in thread order): on one thread
// the same bits as the separate steps; on more, the same to rounding (the sum is grouped by
// thread) and the same bits run after run. ReLU (oracle) and SiLU with per-layer thresholds
// (threshold mode), on the weight types with their own one-token kernels.
TEST(SparseFfn, FusedDecodeEqualsSeparateSteps) {
  for (DType type : {DType::F32, DType::Q4_0, DType::Q4_1, DType::Q8_0}) {
    auto path = write_model(type, 0.8f, "fused-" + std::string(dtype_name(type)));
    auto model = load_model(path);
    const auto first = run_ffn_mode(*model, FfnMode::oracle, 1, nullptr, false);
    for (int threads : {1, 2, 3}) {
      FfnSparsityStats a, b;
      auto fused = run_ffn_mode(*model, FfnMode::oracle, threads, &a, true);
      const auto sep = run_ffn_mode(*model, FfnMode::oracle, threads, &b, false);
      EXPECT_EQ(sep, first) << dtype_name(type) << " threads " << threads;  // the separate steps: any thread count
      if (threads == 1) {
        EXPECT_EQ(fused, sep) << dtype_name(type);
      } else {
        EXPECT_LT(rel_diff(fused, sep), 1e-4) << dtype_name(type) << " threads " << threads;
        EXPECT_EQ(fused, run_ffn_mode(*model, FfnMode::oracle, threads, nullptr, true)) << dtype_name(type);
      }
      EXPECT_EQ(a.active, b.active);
    }
    std::filesystem::remove(path);
  }
  // SiLU: nothing is exactly zero; thresholds make it sparse.
  SynthOptions o;
  o.type = DType::Q4_1;
  o.act = FfnActivation::silu;
  o.n_embd = 128, o.n_ff = 352, o.n_layer = 2, o.n_head = 4, o.n_head_kv = 2, o.seed = 4, o.n_threads = 1;
  auto dir = std::filesystem::temp_directory_path() / "ember-test-sparse-ffn";
  const std::string path = (dir / "fused-silu.gguf").string();
  synth_write(o, path);
  auto model = load_model(path);
  Logits ref;
  for (int threads : {1, 2, 3}) {
    Logits got[2];
    FfnSparsityStats st;
    for (bool fused : {false, true}) {
      SessionParams p;
      p.n_threads = threads;
      p.n_ctx = 64;
      p.sparse.mode = FfnMode::threshold;
      p.sparse.layer_thresholds = {0.05f, 0.1f};
      Session s(*model, p);
      s.sparse_ffn()->set_fused_decode(fused);
      got[fused] = test_support::session_logits(s);
      st = s.sparse_ffn()->stats();
    }
    if (threads == 1) {
      EXPECT_EQ(got[1], got[0]);
      ref = got[0];
    } else {
      EXPECT_LT(rel_diff(got[1], got[0]), 1e-4) << "threads " << threads;
    }
    EXPECT_EQ(got[0], ref) << "threads " << threads;
    EXPECT_GT(st.sparsity(), 0.1);
  }
  std::filesystem::remove(path);
}

TEST(SparseFfn, SynthProfileIsAPowerLawWithTheTargetMean) {
  SynthOptions o;
  o.act = FfnActivation::relu;
  o.n_ff = 5632;
  o.sparsity = 0.9f;
  o.zipf = 1.1f;
  auto p = synth_firing_probabilities(o, 0);
  ASSERT_EQ(p.size(), 5632u);
  double mean = 0;
  for (float x : p) mean += x / p.size();
  EXPECT_NEAR(mean, 0.1, 1e-4);
  std::vector<float> sorted = p;
  std::sort(sorted.rbegin(), sorted.rend());
  EXPECT_GT(sorted[0], 0.9f);                 // hot neurons fire nearly always
  EXPECT_LT(sorted[5000], 0.05f);             // the tail rarely
  EXPECT_NE(p, synth_firing_probabilities(o, 1));  // another permutation per layer
  o.act = FfnActivation::silu;
  EXPECT_THROW(validate(o), Error);           // the profile needs ReLU
}
