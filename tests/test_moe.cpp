// Mixture-of-experts FFNs (model/moe.hpp; Mixtral as `llama` with ffn_gate_inp, and qwen3moe):
// the router's choice and weights, that a token reads only its chosen experts, and the clear
// refusal of the parts that do not take experts yet. Agreement with llama.cpp on the same files:
// test_llamacpp_synth.cpp (mixtral_*, qwen3moe_*).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

#include "engine/profile_run.hpp"
#include "engine/session.hpp"
#include "model/model.hpp"
#include "model/moe.hpp"
#include "model/repack.hpp"
#include "model/workspace.hpp"
#include "synth/synth.hpp"
#include "sparse/plan.hpp"
#include "sparse/profile.hpp"
#include "support/synth_files.hpp"
#include "support/errors.hpp"
#include "support/session_logits.hpp"

using namespace ember;

namespace {

std::unique_ptr<Model> load_mixtral(const std::string& arch = "llama", DType type = DType::F32, int64_t n_expert = 6,
                                    int64_t n_used = 2, int64_t n_embd = 64, int64_t n_ff = 96) {
  SynthOptions o;
  o.arch = arch;
  o.type = type;
  o.n_embd = n_embd;
  o.n_ff = n_ff;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.n_expert = n_expert;
  o.n_expert_used = n_used;
  o.seed = 21;
  o.n_threads = 1;
  auto dir = std::filesystem::temp_directory_path() / "ember-test-moe";
  std::filesystem::create_directories(dir);
  const std::string path = test_support::own_test_file(dir, arch + std::string(dtype_name(type)) + std::to_string(n_used));
  synth_write(o, path);
  auto m = load_model(path);
  std::filesystem::remove(path);
  return m;
}

SessionParams params() {
  SessionParams p;
  p.n_threads = 2;
  p.n_ctx = 64;
  return p;
}

}  // namespace

TEST(Moe, RouteTakesTheLargestProbabilitiesAndRenormalises) {
  MoeWeights moe;
  moe.router = matrix_view(DType::F32, nullptr, 4, 8);  // 4 experts (only the count is read)
  moe.experts.resize(4);
  moe.n_used = 2;
  float logits[8] = {0.0f, 2.0f, 1.0f, 2.0f,    // token 0: experts 1 and 3 tie at the top
                     -1.0f, 0.5f, 3.0f, 0.0f};  // token 1: experts 2, then 1
  int32_t ids[4], order[4];
  float w[4];
  moe_route(moe, logits, 2, ids, w, order);
  EXPECT_EQ(ids[0], 1);  // the tie goes to the lower index
  EXPECT_EQ(ids[1], 3);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[1], 0.5f);
  EXPECT_EQ(ids[2], 2);
  EXPECT_EQ(ids[3], 1);
  const double e2 = std::exp(3.0), e1 = std::exp(0.5);
  EXPECT_NEAR(w[2], e2 / (e2 + e1), 1e-6);
  EXPECT_NEAR(w[3], e1 / (e2 + e1), 1e-6);
  // Without renormalisation the weights are the softmax probabilities over all experts.
  float again[8] = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
  moe.norm_weights = false;
  moe_route(moe, again, 2, ids, w, order);
  const double z = std::exp(-1.0) + std::exp(0.5) + std::exp(3.0) + 1.0;
  EXPECT_NEAR(w[2], e2 / z, 1e-6);
}

TEST(Moe, ATokenReadsOnlyItsChosenExperts) {
  for (const std::string arch : {"llama", "qwen3moe"}) {
    SCOPED_TRACE(arch);
    auto m = load_mixtral(arch);
    ASSERT_TRUE(m->layers[0].moe.valid());
    ASSERT_EQ(m->layers[0].moe.n_expert(), 6);
    ASSERT_EQ(m->layers[0].moe.n_used, 2);
    // A router of zeros: every expert equally likely, the two lowest indices chosen.
    std::vector<float> zeros(static_cast<size_t>(64 * 6), 0.0f);
    for (auto& L : m->layers) L.moe.router = matrix_view(DType::F32, zeros.data(), 6, 64);
    Session s1(*m, params());
    const test_support::Logits before = test_support::session_logits(s1, 6, 3);
    // Experts 2..5 replaced by NaN: never read, nothing changes.
    std::vector<float> nan(static_cast<size_t>(96 * 64), std::numeric_limits<float>::quiet_NaN());
    for (auto& L : m->layers)
      for (int64_t e = 2; e < 6; ++e) {
        FfnWeights& f = L.moe.experts[static_cast<size_t>(e)];
        f.gate = f.up = matrix_view(DType::F32, nan.data(), 96, 64);
        f.down = matrix_view(DType::F32, nan.data(), 64, 96);
      }
    Session s2(*m, params());
    const test_support::Logits after = test_support::session_logits(s2, 6, 3);
    for (const auto& l : after)
      for (float v : l) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(test_support::max_rel_diff(after, before), 0.0);
    // And expert 1 does matter: NaN there reaches the logits.
    for (auto& L : m->layers) {
      FfnWeights& f = L.moe.experts[1];
      f.gate = matrix_view(DType::F32, nan.data(), 96, 64);
    }
    Session s3(*m, params());
    const test_support::Logits poisoned = test_support::session_logits(s3, 6, 3);
    EXPECT_TRUE(std::isnan(poisoned[0][0]));
  }
}

// One token runs its chosen experts fused (every gate and up in one dispatch, then every down):
// bit for bit the grouped loop, for the weight types' kernels as a session repacks them, with 2
// and 8 of 10 experts chosen, at 1 and 2 threads.
TEST(Moe, FusedDecodeEqualsTheGroupedLoop) {
  for (DType t : {DType::F32, DType::Q4_0, DType::Q4_K, DType::Q8_0}) {
    for (int64_t used : {2, 8}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::to_string(used));
      auto m = load_mixtral("qwen3moe", t, 10, used, 256, 512);
      repack_for_dense_kernels(*m, RepackScope::all, ResidentWeights::copy);
      std::vector<float> x(256), fused(256), grouped(256);
      std::mt19937 rng(7);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (int round = 0; round < 3; ++round) {
        for (float& v : x) v = nd(rng);
        for (int threads : {1, 2}) {
          ThreadPool pool(threads);
          Workspace ws;
          ws.init(*m, 4, 16, threads);
          const MoeWeights& moe = m->layers[static_cast<size_t>(round % 2)].moe;
          moe_ffn(pool, moe, m->hp.act, x.data(), 1, fused.data(), ws);
          moe_ffn(pool, moe, m->hp.act, x.data(), 1, grouped.data(), ws, true);
          ASSERT_EQ(fused, grouped) << "threads " << threads;
          double mag = 0;
          for (float v : fused) mag += std::fabs(v);
          EXPECT_GT(mag, 0.0);
        }
      }
    }
  }
}

// A prompt runs its tokens grouped by expert in four dispatches (x quantized once, no float
// copied): bit for bit the grouped loop, for the kernels as a session repacks them and as the
// file has them, with blocks of neurons and columns cut short (160 neurons, 96 columns) and
// experts chosen by more tokens than one token block (64).
TEST(Moe, GroupedPromptEqualsTheGroupedLoop) {
  struct Case {
    DType type;
    int64_t n_embd, n_ff;
  };
  for (const Case c : {Case{DType::F32, 96, 160}, Case{DType::Q4_0, 96, 160}, Case{DType::Q4_1, 256, 512},
                       Case{DType::Q8_0, 96, 160}, Case{DType::Q4_K, 256, 512}, Case{DType::Q6_K, 256, 512},
                       // the downs in blocks of 256 (one thread) and 128 (two) columns, the last gate / up block part full
                       Case{DType::Q4_0, 1024, 320}}) {
    for (int64_t used : {2, 8}) {
      for (RepackScope scope : {RepackScope::all, RepackScope::none}) {
        SCOPED_TRACE(std::string(dtype_name(c.type)) + " top " + std::to_string(used) +
                     (scope == RepackScope::all ? " repacked" : " as in the file"));
        auto m = load_mixtral("qwen3moe", c.type, 10, used, c.n_embd, c.n_ff);
        repack_for_dense_kernels(*m, scope, ResidentWeights::copy);
        const int64_t n = 100;
        std::vector<float> x(static_cast<size_t>(n * c.n_embd)), fused(x.size()), grouped(x.size());
        std::mt19937 rng(11);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (float& v : x) v = nd(rng);
        for (int64_t tokens : {int64_t{2}, int64_t{7}, n}) {
          for (int threads : {1, 2}) {
            ThreadPool pool(threads);
            Workspace ws;
            ws.init(*m, n, 16, threads);
            const MoeWeights& moe = m->layers[static_cast<size_t>(tokens % 2)].moe;
            moe_ffn(pool, moe, m->hp.act, x.data(), tokens, fused.data(), ws);
            moe_ffn(pool, moe, m->hp.act, x.data(), tokens, grouped.data(), ws, true);
            ASSERT_EQ(fused, grouped) << tokens << " tokens, threads " << threads;
            double mag = 0;
            for (int64_t i = 0; i < tokens * c.n_embd; ++i) mag += std::fabs(fused[static_cast<size_t>(i)]);
            EXPECT_GT(mag, 0.0);
          }
        }
      }
    }
  }
}

// The profiler runs a mixture's layers itself: the same outputs as the grouped loop, each expert's
// routings counted (n_used per token), its neurons' firings counted inside it (never more than
// the tokens it ran), quantiles over the chosen experts' neurons (so the layer's sparsity lands
// at the one asked for), and the expert counts kept through the profile file.
TEST(Moe, ProfileCountsRoutingsAndTheNeuronsInsideExperts) {
  auto m = load_mixtral("qwen3moe", DType::Q8_0, 6, 2, 64, 96);
  {
    ProfileFfn pf(*m);
    ThreadPool pool(2);
    Workspace ws;
    ws.init(*m, 9, 16, 2);
    std::vector<float> x(9 * 64), a(x.size()), b(x.size());
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& v : x) v = nd(rng);
    const MoeWeights& moe = m->layers[1].moe;
    pf.run_moe(pool, 1, moe, m->hp.act, x.data(), 9, a.data(), ws);
    moe_ffn(pool, moe, m->hp.act, x.data(), 9, b.data(), ws, true);
    EXPECT_EQ(a, b);
  }
  std::vector<int32_t> tokens(70);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 5) % m->hp.n_vocab);
  Session s(*m, params());
  ProfileOptions o;
  o.n_ctx = 32;
  o.sparsity = 0.5f;
  const Profile p = run_profile(s, tokens, o);
  ASSERT_EQ(p.n_expert, 6);
  ASSERT_EQ(p.n_expert_used, 2);
  ASSERT_EQ(p.n_ff, 6 * 96);
  ASSERT_EQ(p.n_tokens, 70u);
  ASSERT_EQ(p.expert_counts.size(), 2u);
  for (int64_t l = 0; l < 2; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    double routed = 0;
    int chosen = 0;
    for (int64_t e = 0; e < 6; ++e) {
      const float ce = p.expert_counts[l][static_cast<size_t>(e)];
      routed += ce;
      chosen += ce > 0;
      for (int64_t j = 0; j < 96; ++j) EXPECT_LE(p.counts[l][static_cast<size_t>(e * 96 + j)], ce);
    }
    EXPECT_EQ(routed, 70.0 * 2);
    EXPECT_GE(chosen, 2);
    EXPECT_NEAR(layer_sparsity(p, l), 0.5, 0.02);
    EXPECT_GT(p.input_quantiles[l].size(), 0u);
  }
  const std::string path = (std::filesystem::temp_directory_path() / "ember-test-moe" / "moe.prof.gguf").string();
  write_profile(p, path);
  const Profile q = read_profile(path);
  std::filesystem::remove(path);
  EXPECT_EQ(q.n_expert, 6);
  EXPECT_EQ(q.n_expert_used, 2);
  EXPECT_EQ(q.expert_counts, p.expert_counts);
  EXPECT_EQ(q.counts, p.counts);
}

TEST(Moe, BytesPerTokenCountTheChosenExpertsOnly) {
  auto m = load_mixtral();
  const size_t all = m->weight_bytes_per_token();
  const FfnWeights& e = m->layers[0].moe.experts[0];
  const size_t expert = e.gate.nbytes + e.up.nbytes + e.down.nbytes;
  EXPECT_EQ(m->expert_bytes_per_token(), 2 * 2 * expert);  // 2 layers of 2 chosen experts
  // Adding one more used expert per layer adds one expert's bytes per layer.
  for (auto& L : m->layers) L.moe.n_used = 3;
  EXPECT_EQ(m->weight_bytes_per_token(), all + 2 * expert);
  EXPECT_EQ(m->expert_bytes_per_token(), 2 * 3 * expert);
}

TEST(Moe, NeuronLevelPartsRefuseExpertsClearly) {
  auto m = load_mixtral();
  SessionParams p = params();
  p.sparse.mode = FfnMode::oracle;
  const std::string sparse = test_support::error_of([&] { Session s(*m, p); });
  EXPECT_NE(sparse.find("mixtures of experts"), std::string::npos) << sparse;
  EXPECT_NE(sparse.find("--sparse-mode oracle"), std::string::npos) << sparse;
  // The planner places whole experts (tests/test_hybrid_moe.cpp), not neurons picked by predictors.
  const std::vector<std::vector<float>> routing(m->layers.size(), std::vector<float>(6, 0.25f));
  const std::string plan = test_support::error_of([&] { plan_model_from(*m, routing, 64, DType::F16, true); });
  EXPECT_NE(plan.find("a mixture of experts runs no predictors"), std::string::npos) << plan;
}
