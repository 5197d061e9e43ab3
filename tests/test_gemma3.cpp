// Gemma 3: the forward pass against an independent double-precision reference
// (support/reference_gemma3.hpp) on small synthetic gemma3 models (head size != n_embd / n_head,
// grouped KV heads, local layers with a window the prompt crosses, soft-capping), through the
// Session as generation uses it; and the real Gemma-3-270M file's hyperparameters and weights
// (skipped when the model is not installed: scripts/get_model.sh gemma3).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "engine/session.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"
#include "support/synth_files.hpp"
#include "support/paths.hpp"
#include "support/reference_gemma3.hpp"
#include "support/session_params.hpp"

using namespace ember;

namespace {

struct Case {
  DType type;
  bool tied;
  float softcap;
};

std::string case_name(const Case& c) {
  return fmt::format("{}_{}{}", dtype_name(c.type), c.tied ? "tied" : "untied", c.softcap > 0 ? "_softcap" : "");
}

// Largest |logit difference| over all positions, relative to the largest |logit|.
double compare(const Case& c, int threads, int64_t n_batch, bool emulate_int8 = false) {
  SynthOptions o;
  o.arch = "gemma3";
  o.type = c.type;
  o.tied = c.tied;
  o.final_softcap = c.softcap;
  o.seed = 17;
  o.n_threads = 1;
  o.n_embd = 256;
  o.n_ff = 512;
  o.n_head = 8;
  o.n_head_kv = 2;
  o.head_dim = 64;  // n_head * head_dim = 512 != n_embd
  o.n_layer = 4;    // layers 0, 1, 3 local (window 4), layer 2 global
  o.sliding_window = 4;
  o.swa_period = 3;
  o.rope_base = 1e6f;
  o.rms_eps = 1e-6f;
  auto dir = std::filesystem::temp_directory_path() / "ember-test-gemma3";
  std::filesystem::create_directories(dir);
  std::string path = test_support::own_test_file(dir, case_name(c));
  synth_write(o, path);
  auto model = load_model(path);
  EXPECT_EQ(model->hp.arch, "gemma3");
  EXPECT_EQ(model->hp.swa_layers, (std::vector<bool>{true, true, false, true}));

  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(model->hp.n_vocab - 1));
  std::vector<int32_t> tokens(11);
  for (auto& t : tokens) t = pick(rng);
  auto ref = test_support::reference_gemma3_logits(*model, tokens, emulate_int8);

  Session s(*model, test_support::session_params(threads, 64, n_batch));
  const int64_t nv = model->hp.n_vocab;
  std::vector<float> all(8 * nv);
  s.eval_all_logits(tokens.data(), 8, all.data());
  double max_ref = 0, max_diff = 0;
  auto check = [&](const float* l, int64_t t) {
    for (int64_t i = 0; i < nv; ++i) {
      max_ref = std::max(max_ref, std::fabs(ref[t][i]));
      max_diff = std::max(max_diff, std::fabs(l[i] - ref[t][i]));
    }
  };
  for (int64_t t = 0; t < 8; ++t) check(all.data() + t * nv, t);
  for (int64_t t = 8; t < 11; ++t) {
    s.eval(&tokens[t], 1);
    check(s.logits(), t);
  }
  EXPECT_GT(max_ref, 0.1) << "degenerate logits";
  if (c.softcap > 0) {
    EXPECT_LE(max_ref, c.softcap);
  }
  std::filesystem::remove(path);
  return max_diff / max_ref;
}

double tolerance(DType t) { return t == DType::F32 ? 1e-5 : 0.05; }

}  // namespace

class Gemma3Reference : public ::testing::TestWithParam<Case> {};

TEST_P(Gemma3Reference, LogitsMatchDoublePrecision) {
  const Case c = GetParam();
  const double rel = compare(c, 2, 512);
  std::printf("gemma3 %s: max |logit - reference| / max |logit| = %.2e\n", case_name(c).c_str(), rel);
  EXPECT_LT(rel, tolerance(c.type));
  const double rel8 = compare(c, 2, 512, true);
  std::printf("gemma3 %s: same, 8-bit activations emulated in the reference = %.2e\n", case_name(c).c_str(), rel8);
  // Where no activation lands on an 8-bit rounding boundary this is ~1e-7 (float vs double);
  // one activation rounded the other way (the engine's float value vs the reference's double)
  // moves the logits by up to ~1.5e-2 on these small random gemma3 models (observed: which
  // types hit such a tie changes with the kernel's summation order), so the bound stays loose;
  // the F32 cases and test_matmul check the arithmetic tightly.
  EXPECT_LT(rel8, 3e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Types, Gemma3Reference,
    ::testing::Values(Case{DType::F32, true, 0.f}, Case{DType::F32, false, 3.f}, Case{DType::Q8_0, true, 0.f},
                      Case{DType::Q5_0, true, 0.f}, Case{DType::Q5_0, false, 0.f}, Case{DType::Q6_K, true, 0.f}, Case{DType::Q6_K, false, 30.f}, Case{DType::Q5_1, false, 0.f}, Case{DType::Q4_K, true, 0.f},
                      Case{DType::Q5_K, false, 0.f}, Case{DType::Q6_K, true, 30.f}, Case{DType::Q2_K, true, 0.f},
                      Case{DType::Q3_K, false, 0.f}),
    [](const ::testing::TestParamInfo<Case>& info) { return case_name(info.param); });

TEST(Gemma3, ChunkingAndThreadsDoNotChangeResults) {
  Case c{DType::Q4_K, true, 0.f};
  EXPECT_EQ(compare(c, 1, 512), compare(c, 3, 3));
}

// ---- the real Gemma-3-270M file ----------------------------------------------------------

TEST(Gemma3, RealModelHparams) {
  const std::string path = test_support::model_path(test_support::kGemma3);
  if (path.empty()) GTEST_SKIP() << "Gemma 3 model not installed (scripts/get_model.sh gemma3)";
  auto m = load_model(path);
  const Hparams& hp = m->hp;
  EXPECT_EQ(hp.n_layer, 18);
  EXPECT_EQ(hp.n_embd, 640);
  EXPECT_EQ(hp.n_head, 4);
  EXPECT_EQ(hp.n_head_kv, 1);
  EXPECT_EQ(hp.head_dim, 256);
  EXPECT_EQ(hp.n_vocab, 262144);
  EXPECT_EQ(hp.sliding_window, 512);
  for (int64_t il = 0; il < 18; ++il) EXPECT_EQ(hp.swa_layers[il], il % 6 != 5) << il;
  EXPECT_EQ(hp.rope.base, 1e6);
  EXPECT_EQ(hp.rope_local.base, 1e4);
  EXPECT_EQ(hp.rope.layout, cpu::RopeLayout::neox);
  EXPECT_FLOAT_EQ(hp.attn_scale, 1.0f / 16.0f);
  EXPECT_FLOAT_EQ(hp.norm_eps, 1e-6f);
  EXPECT_EQ(hp.final_softcap, 0.0f);
  EXPECT_EQ(m->output.data, m->tok_embd.data);  // tied
}

// Dequantized values of the file's Q4_K, Q5_0, Q6_K and Q8_0 tensors equal those of gguf-py's
// reference dequantizer (llama.cpp d32676d7, gguf-py/gguf/quants.py): row 5's first six values,
// the sum of row 7 and the sum of |w| over the whole tensor.
TEST(Gemma3, RealModelDequantizesLikeGgufPy) {
  const std::string path = test_support::model_path(test_support::kGemma3);
  if (path.empty()) GTEST_SKIP() << "Gemma 3 model not installed (scripts/get_model.sh gemma3)";
  gguf::Reader r(path);
  struct Want {
    const char* name;
    DType type;
    float row5[6];
    double sum7, sum_abs;
  };
  const Want wants[] = {
      {"blk.0.attn_output.weight", DType::Q4_K,
       {0.008610725402832031f, -0.019036531448364258f, 0.008610725402832031f, -0.08815467357635498f,
        -0.04668378829956055f, -0.019036531448364258f},
       -1.0875028371810913, 18307.241332113743},
      {"blk.0.attn_q.weight", DType::Q5_0,
       {-0.027099609375f, -0.027099609375f, 0.027099609375f, -0.0406494140625f, 0.010162353515625f,
        0.02032470703125f},
       0.03350830078125, 17306.232625961304},
      {"blk.3.ffn_down.weight", DType::Q4_K,
       {0.021494150161743164f, 0.010303974151611328f, 0.015899062156677246f, -0.0008862018585205078f,
        0.010303974151611328f, -0.006481289863586426f},
       -0.02168428897857666, 13531.793139874935},
      {"blk.0.attn_v.weight", DType::Q8_0,
       {0.0f, -0.004174232482910156f, 0.007652759552001953f, 0.04661226272583008f, 0.05496072769165039f,
        0.0027828216552734375f},
       0.25618648529052734, 5098.4886202812195},
  };
  for (const Want& w : wants) {
    TensorView t = r.view(w.name);
    ASSERT_TRUE(t.valid()) << w.name;
    ASSERT_EQ(t.type, w.type) << w.name;
    std::vector<float> row(t.cols());
    double sum_abs = 0;
    for (int64_t i = 0; i < t.rows(); ++i) {
      dequantize_row(t.type, t.row(i), row.data(), t.cols());
      if (i == 5) {
        for (int j = 0; j < 6; ++j) EXPECT_EQ(row[j], w.row5[j]) << w.name << " " << j;
      }
      if (i == 7) {
        double s = 0;
        for (float v : row) s += v;
        EXPECT_NEAR(s, w.sum7, 1e-6) << w.name;
      }
      for (float v : row) sum_abs += std::fabs(v);
    }
    EXPECT_NEAR(sum_abs, w.sum_abs, 1e-6 * w.sum_abs) << w.name;
  }
}
