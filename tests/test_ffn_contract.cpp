// The FFN contract (model/ffn.hpp) across executors, architectures and file layouts: every
// executor (sparse oracle, threshold at 0, predictor that names every neuron, the hybrid's CPU
// share with a stand-in device holding half the neurons, the profiler) on {llama SiLU, llama
// ReLU, Bamboo, OPT, Gemma 3, Qwen2} x {plain file, PowerInfer's layout (only the neuron-major
// down_t)} gives the dense path's logits: the sparse rule is exact there (threshold 0, every
// firing neuron computed), so only the summation order differs. And the refusals: a device or
// executor that cannot run a model says so, naming what, when the session is built.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "core/error.hpp"
#include "device/device.hpp"
#include "engine/profile_run.hpp"
#include "engine/session.hpp"
#include "model/ffn.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"
#include "ops/cpu/sparse/sparse.hpp"
#include "support/synth_files.hpp"
#include "support/errors.hpp"
#include "support/session_logits.hpp"

using namespace ember;
using test_support::error_of;
using test_support::Logits;

namespace {

struct ModelCase {
  std::string arch;  // a row of the architecture table
  FfnActivation act;
};

// Every architecture of the table with each activation it takes, but those whose layers are
// mixtures of experts (their FFN is the router's, tests/test_moe.cpp).
std::vector<ModelCase> table_cases() {
  std::vector<ModelCase> cases;
  for (const Architecture& a : architectures())
    if (a.synth->experts != SynthExperts::required)
      for (FfnActivation act : a.synth->acts) cases.push_back({a.name, act});
  return cases;
}

std::string case_name(const ModelCase& c) { return fmt::format("{}_{}", c.arch, ffn_activation_name(c.act)); }

std::filesystem::path test_dir() {
  auto dir = std::filesystem::temp_directory_path() / "ember-test-ffn-contract";
  std::filesystem::create_directories(dir);
  return dir;
}

std::unique_ptr<Model> load_case(const ModelCase& c) {
  SynthOptions base;
  base.type = DType::F32;
  base.n_embd = 64;
  base.n_ff = 160;
  base.n_layer = 3;
  base.n_head = 4;
  base.n_head_kv = 2;
  SynthOptions o = synth_options_for(base, c.arch);
  o.act = c.act;
  if (c.act == FfnActivation::relu && find_architecture(c.arch)->synth->profile != SynthProfile::none)
    o.sparsity = 0.7f;  // (synth's activation profile)
  o.seed = 13;
  o.n_threads = 1;
  const std::string path = test_support::own_test_file(test_dir(), case_name(c));
  synth_write(o, path);
  auto m = load_model(path);
  std::filesystem::remove(path);
  return m;
}

// PowerInfer's layout in memory: the down projection only neuron-major (down_t, the same values:
// an F32 copy), down gone.
void to_powerinfer_layout(Model& m, ThreadPool& pool, std::vector<cpu::NeuronMajorMatrix>& keep) {
  for (auto& L : m.layers) {
    keep.push_back(cpu::make_neuron_major(pool, L.ffn.down, DType::F32));
    L.ffn.down_t = keep.back().view;
    L.ffn.down = {};
  }
}

// A predictor that names every neuron: fc1 and fc2 all zero, so every score is 0 >= threshold 0.
void attach_all_firing_predictor(Model& m) {
  const int64_t rank = 32;
  for (auto& L : m.layers) {
    auto& b1 = m.owned_weights.emplace_back(static_cast<size_t>(rank * m.hp.n_embd) * sizeof(float));
    std::memset(b1.data(), 0, b1.size());
    L.ffn.fc1 = matrix_view(DType::F32, b1.data(), rank, m.hp.n_embd);
    auto& b2 = m.owned_weights.emplace_back(static_cast<size_t>(m.hp.n_ff * rank) * sizeof(float));
    std::memset(b2.data(), 0, b2.size());
    L.ffn.fc2 = matrix_view(DType::F32, b2.data(), m.hp.n_ff, rank);
  }
  m.predictor_threshold = 0.0f;
  m.predictor_on_residual = false;
}

SessionParams params() {
  SessionParams p;
  p.n_threads = 2;
  p.n_ctx = 64;
  p.n_batch = 32;
  return p;
}

// Half the neurons of every layer (the even ones) on the stand-in device, attention of layer 1
// there too.
Plan half_plan(const Model& m) {
  Plan p;
  p.method = PlanMethod::greedy;
  p.vram_budget = uint64_t{1} << 40;
  p.layers.resize(m.layers.size());
  for (auto& L : p.layers)
    for (int32_t j = 0; j < m.hp.n_ff; j += 2) L.gpu_neurons.push_back(j);
  p.layers[1].attn_gpu = true;
  return p;
}

}  // namespace

class FfnContract : public ::testing::TestWithParam<ModelCase> {};

TEST_P(FfnContract, EveryExecutorEqualsDenseOnBothLayouts) {
  const ModelCase c = GetParam();
  for (bool pwri : {false, true}) {
    SCOPED_TRACE(pwri ? "PowerInfer layout (down_t only)" : "plain file");
    auto m = load_case(c);
    ThreadPool pool(1);
    std::vector<cpu::NeuronMajorMatrix> keep;
    if (pwri) to_powerinfer_layout(*m, pool, keep);
    ASSERT_EQ(m->layers[0].ffn.down_neuron_major_only(), pwri);
    EXPECT_EQ(m->layers[0].ffn.n_embd(), 64);
    EXPECT_EQ(m->layers[0].ffn.n_ff(), 160);
    attach_all_firing_predictor(*m);

    Session dense_s(*m, params());
    const Logits dense = test_support::session_logits(dense_s);

    struct Exec {
      const char* name;
      SessionParams p;
    };
    std::vector<Exec> execs;
    SessionParams p = params();
    p.sparse.mode = FfnMode::oracle;
    execs.push_back({"oracle", p});
    p.sparse.mode = FfnMode::threshold;
    p.sparse.layer_thresholds.assign(3, 0.0f);
    execs.push_back({"threshold 0", p});
    p = params();
    p.sparse.mode = FfnMode::predictor;
    execs.push_back({"predictor (every neuron)", p});
    const Plan plan = half_plan(*m);
    p = params();
    p.hybrid.given = &plan;
    p.hybrid.device_kind = "cpu";
    p.hybrid.plan.min_gpu_neurons = 1;
    execs.push_back({"hybrid, stand-in device", p});
    for (const Exec& e : execs) {
      SCOPED_TRACE(e.name);
      Session s(*m, e.p);
      const double d = test_support::max_rel_diff(dense, test_support::session_logits(s));
      EXPECT_LT(d, 2e-5);
      if (Session* hs = &s; hs->hybrid()) {
        EXPECT_GT(hs->hybrid()->stats().device_fired, 0u);
        EXPECT_GT(hs->hybrid()->stats().cpu_fired, 0u);
      }
    }
    // The profiler's executor runs the dense rule in steps: the dense logits, and counts for
    // every neuron.
    {
      SessionParams sp = params();
      Session s(*m, sp);
      ProfileFfn prof(*m);
      s.set_ffn_executor(&prof);
      EXPECT_LT(test_support::max_rel_diff(dense, test_support::session_logits(s)), 1e-6);
      s.set_ffn_executor(nullptr);
      EXPECT_GT(prof.histogram(0).total(), 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, FfnContract, ::testing::ValuesIn(table_cases()),
                         [](const auto& info) { return case_name(info.param); });

// The rule itself on one neuron of each gating, against the formulas written out.
TEST(FfnRule, FiringAndNeuronValuesForEveryGating) {
  float bias[3] = {0.5f, -2.0f, 1.0f};
  FfnWeights w;
  w.up_b = matrix_view(DType::F32, bias, 1, 3);
  const int32_t ids[2] = {2, 1};
  for (FfnGating g : {FfnGating::par, FfnGating::sym, FfnGating::none}) {
    SCOPED_TRACE(ffn_gating_name(g));
    w.gating = g;
    float a[2] = {0.75f, -1.5f};  // products of the firing rows (gate, or up without a gate)
    ffn_firing_values(w, cpu::Activation::relu, a, 1, 2, 2, ids);
    const float a0 = g == FfnGating::none ? 0.75f + 1.0f : 0.75f;  // row ids[0] = 2: bias 1
    const float a1 = g == FfnGating::none ? std::max(-1.5f - 2.0f, 0.0f) : 0.0f;
    EXPECT_EQ(a[0], a0);
    EXPECT_EQ(a[1], a1);
    float u[2] = {-3.0f, 4.0f};  // up products (read only with a gate)
    ffn_neuron_values(w, cpu::Activation::relu, a, 2, u, 2, 1, 2, ids);
    const float h0 = g == FfnGating::par   ? a0 * (-3.0f + 1.0f)
                     : g == FfnGating::sym ? a0 * std::max(-3.0f + 1.0f, 0.0f)
                                           : a0;
    EXPECT_EQ(u[0], h0);
    EXPECT_EQ(u[1], 0.0f);  // a silent neuron contributes nothing, whatever its up
  }
}

TEST(FfnContract, RefusedPairsSayWhy) {
  // The CUDA device's capabilities (checked without a GPU): gated FFNs and attention blocks of
  // five weight types, no parallel residual.
  for (const ModelCase& c : {ModelCase{"bamboo", FfnActivation::relu}, ModelCase{"opt", FfnActivation::relu},
                             ModelCase{"llama", FfnActivation::relu}, ModelCase{"falcon", FfnActivation::relu}}) {
    auto m = load_case(c);
    Plan p = half_plan(*m);
    p.layers[1].attn_gpu = false;
    const std::string why = device_refusal(cuda_caps(), *m, p);
    if (c.arch == "bamboo") {
      EXPECT_NE(why.find("symmetric"), std::string::npos) << why;
    } else if (c.arch == "opt") {
      EXPECT_NE(why.find("ungated"), std::string::npos) << why;
    }
    if (c.arch == "llama") {
      EXPECT_EQ(why, "");  // F32, gated: the CUDA kernels run it
      p.layers[2].attn_gpu = true;
      EXPECT_EQ(device_refusal(cuda_caps(), *m, p), "");  // and its attention blocks
      // An attention matrix the CUDA kernels do not read (in the file's layout: what CUDA copies).
      m->layers[2].wk.type = DType::Q3_K;
      const std::string attn_why = device_refusal(cuda_caps(), *m, p);
      EXPECT_NE(attn_why.find("layer 2's attention matrix"), std::string::npos) << attn_why;
      EXPECT_NE(attn_why.find("Q3_K"), std::string::npos) << attn_why;
      // The hybrid asks the same of every layer before it plans (no attention there if one fails).
      EXPECT_EQ(attention_refusal(cuda_caps(), *m, 2), attn_why);
      EXPECT_EQ(attention_refusal(cuda_caps(), *m, 1), "");
      EXPECT_EQ(attention_refusal(cpu_standin_caps(), *m, 2), "");
      EXPECT_EQ(output_refusal(cuda_caps(), *m), "");
      const TensorView head = m->output, file_head = m->file_output;
      m->output.type = m->file_output.type = DType::Q2_K;
      const std::string head_why = output_refusal(cuda_caps(), *m);
      EXPECT_NE(head_why.find("is Q2_K; the cuda device reads F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K"),
                std::string::npos)
          << head_why;
      m->output = head, m->file_output = file_head;
      EXPECT_EQ(device_refusal(cpu_standin_caps(), *m, p), "");
      p.layers[2].attn_gpu = false;
      EXPECT_EQ(device_refusal(cuda_caps(), *m, p), "");  // that layer's attention stays on the CPU
      // An FFN row type the CUDA kernels do not read: a down_t (the device's down rows are the
      // file's) or an up of Q5_0.
      const FfnWeights keep = m->layers[0].ffn;
      m->layers[0].ffn.down_t = m->layers[0].ffn.down;
      m->layers[0].ffn.down_t.type = DType::Q5_0;
      const std::string down_why = device_refusal(cuda_caps(), *m, p);
      EXPECT_NE(down_why.find("layer 0's neuron-major down rows are Q5_0"), std::string::npos) << down_why;
      // Q4_K: the CUDA kernels read its rows, but not as a down's neuron-major rows.
      m->layers[0].ffn.down_t.type = DType::Q4_K;
      const std::string k_why = device_refusal(cuda_caps(), *m, p);
      EXPECT_NE(k_why.find("layer 0's neuron-major down rows are Q4_K; the cuda device reads F32, F16, Q8_0, Q4_0, Q4_1"),
                std::string::npos) << k_why;
      m->layers[0].ffn = keep;
      m->layers[0].ffn.up.type = DType::Q4_K;
      EXPECT_EQ(device_refusal(cuda_caps(), *m, p), "");
      m->layers[0].ffn.up.type = DType::Q3_K;
      EXPECT_NE(device_refusal(cuda_caps(), *m, p).find("layer 0 has Q3_K FFN rows"), std::string::npos);
      EXPECT_EQ(device_refusal(cpu_standin_caps(), *m, p), "");
      m->layers[0].ffn = keep;
    }
    if (c.arch == "falcon") {  // the parallel residual: not in CUDA's attention blocks
      Plan a = p;
      for (auto& L : a.layers) L.gpu_neurons.clear();
      a.layers[0].attn_gpu = true;
      const std::string falcon_why = device_refusal(cuda_caps(), *m, a);
      EXPECT_NE(falcon_why.find("parallel residual"), std::string::npos) << falcon_why;
      EXPECT_EQ(device_refusal(cpu_standin_caps(), *m, a), "");
    }
  }
  // The hybrid executor runs the oracle rule or the model's predictors: the threshold mode is
  // refused when the session is built, and so are predictors a model does not have.
  auto m = load_case({"llama", FfnActivation::relu});
  const Plan plan = half_plan(*m);
  SessionParams p = params();
  p.hybrid.given = &plan;
  p.hybrid.device_kind = "cpu";
  p.hybrid.plan.min_gpu_neurons = 1;
  p.sparse.mode = FfnMode::threshold;
  EXPECT_NE(error_of([&] { Session s(*m, p); }).find("--sparse-mode threshold does not combine"), std::string::npos);
  p.sparse.mode = FfnMode::predictor;
  EXPECT_NE(error_of([&] { Session s(*m, p); }).find("needs a predictor for every layer"), std::string::npos);
  // An executor that refuses the model: the session says so and keeps its own.
  struct Refusing final : FfnExecutor {
    void run(ThreadPool&, int64_t, const FfnWeights&, cpu::Activation, const float*, int64_t, float*,
             Workspace&) override {}
    std::string refusal(const Model& model) const override { return "no " + model.hp.arch + " here"; }
  } refusing;
  Session s(*m, params());
  EXPECT_NE(error_of([&] { s.set_ffn_executor(&refusing); }).find("no llama here"), std::string::npos);
}
