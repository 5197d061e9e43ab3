// A mixture's experts as units of placement: the planner weighs whole experts by their routing
// probability times their bytes (greedy, ILP, layer-split), counts them exactly (the device's
// arena equals the plan's bytes) and keeps them in plan files; the hybrid executor runs the
// plan's experts on the CPU stand-in while the CPU runs the others and adds every token's outputs
// in ascending expert order, so its logits equal the all-CPU mixture's bit for bit (prompts in
// device chunks, decode, attention on the device or not, 1 and 2 threads). Devices that run no
// experts, unknown experts and unequal experts are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>

#include "device/cpu/cpu_device.hpp"
#include "device/device.hpp"
#include "engine/session.hpp"
#include "model/moe.hpp"
#include "sparse/plan.hpp"
#include "support/errors.hpp"
#include "support/plans.hpp"
#include "support/session_logits.hpp"
#include "support/synth_files.hpp"

using namespace ember;
using test_support::Logits;

namespace {

// 8 experts of 96 neurons, `n_used` chosen, 128 wide, 3 layers.
std::unique_ptr<Model> load_moe(DType type, int64_t n_used, const std::string& name) {
  SynthOptions o;
  o.type = type;
  o.act = FfnActivation::silu;
  o.n_embd = 128;
  o.n_ff = 96;
  o.n_layer = 3;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.n_expert = 8;
  o.n_expert_used = n_used;
  o.seed = 17;
  o.n_threads = 1;
  return test_support::load_synth_in(test_support::test_temp_dir("hybrid-moe"), o, name);
}

// Layer 0: experts 1, 2 and 5 on the device; layer 1: none; layer 2: all; attention as `attn` says.
Plan experts_plan(const Model& m, int attn) {
  Plan plan;
  plan.method = PlanMethod::greedy;
  plan.vram_budget = uint64_t{1} << 40;
  plan.layers.resize(m.layers.size());
  plan.layers[0].gpu_experts = {1, 2, 5};
  for (int32_t e = 0; e < m.layers[2].moe.n_expert(); ++e) plan.layers[2].gpu_experts.push_back(e);
  for (size_t l = 0; l < plan.layers.size(); ++l) plan.layers[l].attn_gpu = attn == 2 || (attn == 1 && l != 1);
  return plan;
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  const std::string e = test_support::error_of(f);
  EXPECT_NE(e.find(part), std::string::npos) << "error: '" << e << "', expected to contain '" << part << "'";
}

}  // namespace

TEST(HybridMoe, StandInEqualsTheAllCpuMixtureBitForBit) {
  for (DType type : {DType::F32, DType::Q4_0, DType::Q8_0})
    for (int64_t n_used : {2, 3}) {
      SCOPED_TRACE(fmt::format("{} top {}", dtype_name(type), n_used));
      auto model = load_moe(type, n_used, fmt::format("split-{}-{}", dtype_name(type), n_used));
      for (int threads : {1, 2}) {
        SCOPED_TRACE(fmt::format("{} threads", threads));
        SessionParams alone;
        alone.n_threads = threads;
        alone.n_ctx = 64;
        alone.kv_type = DType::F16;
        Session cpu(*model, alone);
        const Logits want = test_support::session_logits(cpu);  // a 12-token prompt, 6 decode tokens
        for (int attn : {0, 1, 2})
          for (int64_t max_batch : {16, 5}) {
            SCOPED_TRACE(fmt::format("attention placement {}, device batches of {}", attn, max_batch));
            const Plan plan = experts_plan(*model, attn);
            SessionParams p = test_support::given_plan_params(plan, max_batch, threads);
            p.hybrid.device_kind = "cpu";
            Session s(*model, p);
            EXPECT_EQ(test_support::session_logits(s), want);
            const HybridStats st = s.hybrid()->stats();
            // Every (token, chosen expert) pair ran once, on one side: 18 tokens, 3 layers.
            EXPECT_EQ(st.device_expert_runs + st.cpu_expert_runs, static_cast<uint64_t>(18 * 3 * n_used));
            EXPECT_GE(st.device_expert_runs, static_cast<uint64_t>(18 * n_used));  // layer 2's, at least
            EXPECT_GE(st.cpu_expert_runs, static_cast<uint64_t>(18 * n_used));    // layer 1's, at least
            // The stand-in holds exactly the plan's bytes.
            const auto& dev = dynamic_cast<const CpuDevice&>(s.hybrid()->device());
            EXPECT_EQ(dev.layout().total, s.hybrid()->plan().gpu_bytes);
          }
      }
    }
}

TEST(HybridMoe, PlannersPlaceTheHotExpertsWithinTheBudget) {
  auto model = load_moe(DType::Q4_0, 2, "plan");
  // Routing skewed by layer: expert e of layer l taken with a probability falling with (e + l) % 8.
  std::vector<std::vector<float>> p(3);
  for (size_t l = 0; l < 3; ++l)
    for (int e = 0; e < 8; ++e) p[l].push_back(0.5f / static_cast<float>(1 + (e + l) % 8));
  const PlanModel m = plan_model_from(*model, p, 64);
  ASSERT_TRUE(m.layers[0].moe());
  const uint64_t expert = m.layers[0].expert_bytes;
  const FfnWeights& e0 = model->layers[0].moe.experts[0];
  EXPECT_EQ(expert, gpu_pad(e0.gate.nbytes) + gpu_pad(e0.up.nbytes) + gpu_pad(e0.down.nbytes));
  EXPECT_EQ(m.layers[0].expert_cpu_bytes, e0.gate.nbytes + e0.up.nbytes + e0.down.nbytes);
  PlanOptions opts;
  opts.attention = false;  // experts alone: what fits is counted in experts
  opts.min_gpu_neurons = 0;
  DeviceDesc dev;
  dev.sync_seconds = 0;
  dev.pcie_bandwidth = 1e15;
  // Room for five experts and the experts' scratch.
  dev.vram_budget = 5 * expert + gpu_expert_scratch_bytes(m, opts);
  for (PlanMethod method : {PlanMethod::greedy, PlanMethod::ilp}) {
    SCOPED_TRACE(plan_method_name(method));
    const Plan plan = make_plan(method, m, dev, opts);
    EXPECT_EQ(plan.n_gpu_experts(), 5);
    EXPECT_EQ(plan.gpu_bytes, dev.vram_budget);
    // The five with the largest routing probability: 0.5 (one a layer), then 0.25 (one a layer),
    // then one of the three at 1/6.
    int top = 0, second = 0;
    for (size_t l = 0; l < 3; ++l)
      for (int32_t e : plan.layers[l].gpu_experts) {
        const int rank = (e + static_cast<int>(l)) % 8;
        EXPECT_LE(rank, 2) << "layer " << l << " expert " << e;
        top += rank == 0, second += rank == 1;
      }
    EXPECT_EQ(top, 3);
    EXPECT_EQ(second, 1 + (top == 3 ? 1 : 0));
    EXPECT_GT(plan.objective, 0);
    // Each side reads what the cost model charges: the routed bytes of its experts.
    double gpu = 0;
    for (size_t l = 0; l < 3; ++l) {
      double want = 0;
      for (int32_t e : plan.layers[l].gpu_experts) want += m.layers[l].expert_p[static_cast<size_t>(e)] * expert;
      EXPECT_NEAR(layer_bytes_per_token(m, m.layers[l], plan.layers[l]).gpu, want, 1e-6 * want + 1e-9);
      gpu += want;
    }
    EXPECT_GT(gpu, 0);
    // A plan file keeps the experts.
    const std::string path = (test_support::test_temp_dir("hybrid-moe") / "plan.gguf").string();
    write_plan(plan, m, opts, path);
    const Plan back = read_plan(path, m);
    for (size_t l = 0; l < 3; ++l) EXPECT_EQ(back.layers[l].gpu_experts, plan.layers[l].gpu_experts);
    EXPECT_EQ(back.gpu_bytes, plan.gpu_bytes);
  }
  // Layer-split: whole layers, every expert of each, as far as the budget goes.
  dev.vram_budget = 8 * expert + gpu_expert_scratch_bytes(m, opts);
  const Plan split = make_plan(PlanMethod::layer_split, m, dev, opts);
  EXPECT_EQ(split.layers[0].gpu_experts.size(), 8u);
  EXPECT_TRUE(split.layers[1].gpu_experts.empty());
  // A device without experts: none placed, and a plan that places them is refused.
  opts.experts = false;
  EXPECT_EQ(make_plan(PlanMethod::ilp, m, dev, opts).n_gpu_experts(), 0);
  EXPECT_EQ(make_plan(PlanMethod::greedy, m, dev, opts).n_gpu_experts(), 0);
}

// A hybrid session repacks the experts for the CPU's kernels; a device that holds the file's
// layout (CUDA) is asked about the file's types, so repacking takes nothing from it.
TEST(HybridMoe, RepackedExpertsStayPlaceableOnTheFilesLayout) {
  auto model = load_moe(DType::Q4_0, 2, "repacked");
  repack_for_session(*model, FfnMode::dense, repack_scope_for(FfnMode::dense, /*hybrid=*/true), ResidentWeights::copy,
                     /*hybrid=*/true);
  EXPECT_EQ(model->file_layer(0).moe.experts[0].gate.type, DType::Q4_0);
  const Plan plan = experts_plan(*model, 1);
  EXPECT_EQ(device_refusal(cuda_caps(), *model, plan), "");
  // The stand-in runs the CPU's (repacked) experts: still the all-CPU mixture bit for bit.
  auto plain = load_moe(DType::Q4_0, 2, "repacked-plain");
  repack_for_session(*plain, FfnMode::dense, repack_scope_for(FfnMode::dense, false), ResidentWeights::copy, false);
  SessionParams alone;
  alone.n_threads = 2;
  alone.n_ctx = 64;
  alone.kv_type = DType::F16;
  Session cpu(*plain, alone);
  SessionParams p = test_support::given_plan_params(plan, 16);
  p.hybrid.device_kind = "cpu";
  Session s(*model, p);
  EXPECT_EQ(test_support::session_logits(s), test_support::session_logits(cpu));
}

TEST(HybridMoe, RefusesWhatCannotBeSplit) {
  auto model = load_moe(DType::Q4_0, 2, "refuse");
  Plan plan = experts_plan(*model, 0);
  EXPECT_EQ(device_refusal(cpu_standin_caps(), *model, plan), "");
  EXPECT_EQ(device_refusal(cuda_caps(), *model, plan), "");
  // A device without experts, and experts of a type a device does not read: named with the layer.
  DeviceCaps none = cpu_standin_caps();
  none.experts = false;
  EXPECT_NE(device_refusal(none, *model, plan).find("layer 0 on the cpu-standin device, which runs no experts"),
            std::string::npos) << device_refusal(none, *model, plan);
  {
    Model& k = *model;
    for (FfnWeights& e : k.layers[0].moe.experts) e.gate.type = e.up.type = e.down.type = DType::Q3_K;
    const std::string why = device_refusal(cuda_caps(), k, plan);
    EXPECT_NE(why.find("layer 0's experts have Q3_K matrices; the cuda device reads"), std::string::npos) << why;
    for (FfnWeights& e : k.layers[0].moe.experts) e.gate.type = e.up.type = e.down.type = DType::Q4_0;
  }
  // An expert the layer does not have.
  std::vector<std::vector<float>> p(3, std::vector<float>(8, 0.25f));
  const PlanModel m = plan_model_from(*model, p, 64);
  PlanOptions opts;
  opts.min_gpu_neurons = 0;
  plan.layers[1].gpu_experts = {8};
  expect_error([&] { validate_plan(m, opts, plan, plan.vram_budget); },
                                      "layer 1 names expert 8 (it has 8)");
  // Routing probabilities for another number of experts.
  p[2].resize(6);
  expect_error([&] { plan_model_from(*model, p, 64); }, "layer 2 has 6 routing probabilities for 8");
  // Experts of unequal types cannot be placed (one expert size a layer).
  Model& changed = *model;
  changed.layers[1].moe.experts[3].down.type = DType::F32;
  p[2].resize(8, 0.25f);
  expect_error([&] { plan_model_from(changed, p, 64); }, "layer 1's experts cannot be placed");
}
