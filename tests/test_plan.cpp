// Placement (sparse/plan.*): no solver ever exceeds the budget over hundreds of random models
// and budgets; the ILP is never worse than greedy and reaches the brute-force optimum on small
// cases; layer-split matches a hand-computed case; the minimum neuron count holds; plan files
// round-trip and bad inputs give clear errors.
#include "sparse/plan.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>

#include "core/error.hpp"
#include "device/cuda/cuda_scratch.hpp"
#include "gguf/writer.hpp"
#include "synth/synth.hpp"
#include "support/errors.hpp"

using namespace ember;

namespace {

std::string tmp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "ember-test-plan";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

// A random model of awkward shapes: 1-6 layers, n_ff not a multiple of anything, row sizes of
// real weight types, power-law firing probabilities with some dead neurons.
PlanModel random_model(std::mt19937& rng, bool predictor) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  PlanModel m;
  m.name = "random";
  const int n_layer = pick(1, 6);
  m.n_embd = 32 * pick(1, 8);
  m.n_ff = pick(5, 300);
  m.n_head = pick(1, 4);
  m.q_dim = m.n_embd;
  m.kv_dim = m.n_embd / pick(1, 2);
  m.n_ctx = pick(1, 512);
  m.output_bytes = static_cast<uint64_t>(pick(1000, 100000));
  if (pick(0, 1)) {  // an output head that may go on the device
    m.n_vocab = pick(10, 5000);
    m.output_weights_bytes = gpu_pad(m.output_bytes) + gpu_pad(static_cast<uint64_t>(m.n_embd) * 4);
  }
  const DType types[] = {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1};
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int l = 0; l < n_layer; ++l) {
    PlanLayer L;
    const DType t = types[pick(0, 4)];
    L.gate_row = L.up_row = row_bytes(t, m.n_embd);
    L.down_row = row_bytes(t == DType::F32 || t == DType::F16 ? t : DType::Q8_0, m.n_embd);
    L.cpu_down_row = t == DType::Q4_0 || t == DType::Q4_1 ? row_bytes(t, m.n_embd) : L.down_row;  // the 4-bit copy
    L.attn_bytes = gpu_pad(4 * row_bytes(t, m.n_embd) * static_cast<uint64_t>(m.n_embd));
    L.kv_bytes = 2 * gpu_pad(static_cast<uint64_t>(m.n_ctx * m.kv_dim) * 4);
    L.predictor_bytes = predictor ? gpu_pad(static_cast<uint64_t>(pick(1, 100000))) : 0;
    const float zipf = 0.5f + 1.5f * u(rng);
    L.p.resize(static_cast<size_t>(m.n_ff));
    for (auto& p : L.p) {
      const float r = 1.0f + u(rng) * static_cast<float>(m.n_ff);
      p = u(rng) < 0.1f ? 0.0f : std::min(1.0f, std::pow(r, -zipf) * 3.0f);
    }
    m.layers.push_back(std::move(L));
  }
  return m;
}

Plan all_on_gpu(const PlanModel& m) {
  Plan p;
  p.layers.resize(m.layers.size());
  for (auto& L : p.layers) {
    L.attn_gpu = true;
    for (int32_t j = 0; j < m.n_ff; ++j) L.gpu_neurons.push_back(j);
  }
  return p;
}

DeviceDesc random_device(std::mt19937& rng, uint64_t budget) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  DeviceDesc d;
  d.vram_budget = budget;
  d.cpu_bandwidth = 20e9 + 80e9 * u(rng);
  d.gpu_bandwidth = d.cpu_bandwidth * (1.5 + 30 * u(rng));
  d.pcie_bandwidth = 8e9 + 50e9 * u(rng);
  d.sync_seconds = 1e-7 * u(rng);
  return d;
}

// Three layers of 4 neurons, every row 256 bytes on the GPU (the CPU's copy of down 128, as a
// 4-bit copy against the device's 8-bit rows), attention 1024 and KV 512 bytes: sizes the tests
// below work out by hand.
PlanModel hand_model() {
  PlanModel m;
  m.name = "hand";
  m.n_embd = 64, m.n_ff = 4, m.n_head = 2, m.q_dim = 64, m.kv_dim = 32, m.n_ctx = 8;
  for (int l = 0; l < 3; ++l) {
    PlanLayer L;
    L.attn_bytes = 1024;
    L.kv_bytes = 512;
    L.gate_row = L.up_row = L.down_row = 256;
    L.cpu_down_row = 128;
    L.p = {0.5f, 0.25f, 0.125f, 0.0f};
    m.layers.push_back(L);
  }
  return m;
}

void expect_min_neurons(const PlanModel& m, const PlanOptions& o, const Plan& p) {
  for (size_t l = 0; l < p.layers.size(); ++l)
    if (p.layer_uses_gpu(l)) {
      EXPECT_GE(static_cast<int64_t>(p.layers[l].gpu_neurons.size()), std::min(o.min_gpu_neurons, m.n_ff));
    }
}

}  // namespace

TEST(Plan, NeverExceedsBudgetRandomModelsAndBudgets) {
  std::mt19937 rng(123);
  int n_ilp = 0, n_used = 0;
  std::map<std::string, int> status_count;
  for (int trial = 0; trial < 300; ++trial) {
    const PlanModel m = random_model(rng, trial % 2 == 1);
    PlanOptions o;
    o.group_size = std::uniform_int_distribution<int>(1, 40)(rng);
    o.min_gpu_neurons = std::uniform_int_distribution<int>(0, 80)(rng);
    o.max_batch = std::uniform_int_distribution<int>(1, 20)(rng);
    o.time_limit = 0.25;
    const uint64_t full = gpu_bytes(m, o, all_on_gpu(m));
    // Budgets from nothing to more than everything, many near the interesting middle.
    const uint64_t budget =
        static_cast<uint64_t>(std::uniform_real_distribution<double>(0.0, 1.2)(rng) * static_cast<double>(full));
    const DeviceDesc dev = random_device(rng, budget);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " budget " << budget << " of " << full);
    const Plan g = plan_greedy(m, dev, o), s = plan_layer_split(m, dev, o);
    for (const Plan* p : {&g, &s}) {
      EXPECT_LE(gpu_bytes(m, o, *p), budget);
      EXPECT_EQ(p->gpu_bytes, gpu_bytes(m, o, *p));
      EXPECT_NO_THROW(validate_plan(m, o, *p, budget));
      expect_min_neurons(m, o, *p);
    }
    // The cost model's objective is the CPU time minus the plan's time.
    EXPECT_NEAR(g.objective, predict_cpu_seconds_per_token(m, dev) - predict_seconds_per_token(m, dev, g),
                1e-12 + 1e-9 * g.seconds_per_token);
    if (budget >= full) {
      EXPECT_EQ(s.n_gpu_neurons(), m.n_ff * static_cast<int64_t>(m.layers.size()));
    }
    if (trial % 3 == 0) {  // the ILP on a third (each solve takes CBC some milliseconds)
      const Plan i = plan_ilp(m, dev, o);
      ++n_ilp;
      EXPECT_LE(gpu_bytes(m, o, i), budget);
      EXPECT_NO_THROW(validate_plan(m, o, i, budget));
      expect_min_neurons(m, o, i);
      EXPECT_GE(i.objective, g.objective - 1e-15);
      EXPECT_GE(i.objective, 0.0);
      ++status_count[i.status];
      EXPECT_GE(i.gap, 0.0);
      if (i.status == "optimal") {
        EXPECT_LE(i.gap, o.gap_tolerance + 1e-9);
      }
      n_used += i.n_gpu_neurons() > 0;
    }
  }
  EXPECT_GT(n_used, n_ilp / 3);
  for (auto& [k, v] : status_count) std::printf("ILP %s: %d\n", k.c_str(), v);  // the budgets were not all too small to matter
}

// A device that holds no attention blocks (the CUDA device so far): no solver places attention
// there, each still uses the budget for neurons, and validation refuses a plan that does.
TEST(Plan, DeviceWithoutAttentionGetsNone) {
  std::mt19937 rng(77);
  int with_neurons = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const PlanModel m = random_model(rng, trial % 2 == 1);
    PlanOptions o;
    o.group_size = 8;
    o.min_gpu_neurons = 0;
    o.time_limit = 0.25;
    o.attention = false;
    const uint64_t budget = gpu_bytes(m, o, all_on_gpu(m)) / 2;
    const DeviceDesc dev = random_device(rng, budget);
    for (const Plan& p : {plan_greedy(m, dev, o), plan_layer_split(m, dev, o), plan_ilp(m, dev, o)}) {
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << plan_method_name(p.method));
      for (const auto& L : p.layers) EXPECT_FALSE(L.attn_gpu);
      EXPECT_LE(p.gpu_bytes, budget);
      with_neurons += p.n_gpu_neurons() > 0;
    }
  }
  EXPECT_GT(with_neurons, 60);
  const PlanModel m = random_model(rng, false);
  Plan p;
  p.layers.resize(m.layers.size());
  p.layers[0].attn_gpu = true;
  PlanOptions o;
  o.min_gpu_neurons = 0;
  o.attention = false;
  EXPECT_THROW(validate_plan(m, o, p, ~uint64_t{0}), Error);
}

// Brute force over every choice of groups and attention on a tiny model, with the ILP's own
// (conservative) memory row: the ILP must find the optimum.
TEST(Plan, IlpReachesBruteForceOptimum) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 25; ++trial) {
    PlanModel m = random_model(rng, trial % 2 == 0);
    m.layers.resize(std::min<size_t>(m.layers.size(), 2));
    m.n_ff = std::uniform_int_distribution<int>(3, 9)(rng);
    for (auto& L : m.layers) L.p.resize(static_cast<size_t>(m.n_ff));
    PlanOptions o;
    o.group_size = 2;
    o.gap_tolerance = 0;
    o.min_gpu_neurons = std::uniform_int_distribution<int>(1, 4)(rng);
    o.max_batch = 1;
    const uint64_t full = gpu_bytes(m, o, all_on_gpu(m));
    DeviceDesc dev = random_device(rng, static_cast<uint64_t>(std::uniform_real_distribution<double>(0.1, 1.3)(rng) * full));
    const Plan ilp = plan_ilp(m, dev, o);
    ASSERT_EQ(ilp.status, "optimal");

    std::vector<NeuronGroups> groups;
    int n_bits = 0;
    for (const auto& L : m.layers) groups.push_back(neuron_groups(L, o.group_size)), n_bits += 1 + groups.back().size();
    const bool head_can_go = m.output_weights_bytes > 0;
    n_bits += head_can_go;  // the last bit: the output head
    double best = 0;  // nothing on the GPU saves 0
    for (uint32_t mask = 0; mask < (1u << n_bits); ++mask) {
      Plan p;
      p.layers.resize(m.layers.size());
      int bit = 0;
      double linear = 0;
      bool any = false, any_attn = false, ok = true;
      for (size_t l = 0; l < m.layers.size(); ++l) {
        const PlanLayer& L = m.layers[l];
        std::vector<char> chosen(groups[l].size());
        for (auto& c : chosen) c = (mask >> bit++) & 1;
        p.layers[l].gpu_neurons = neurons_of_groups(groups[l], chosen);
        p.layers[l].attn_gpu = (mask >> bit++) & 1;
        const double k = static_cast<double>(p.layers[l].gpu_neurons.size());
        if (!p.layer_uses_gpu(l)) continue;
        ok &= k >= std::min<double>(o.min_gpu_neurons, m.n_ff);
        any = true;
        any_attn |= p.layers[l].attn_gpu;
        linear += (p.layers[l].attn_gpu ? L.attn_bytes + L.kv_bytes : 0) + L.predictor_bytes + 4.0 * (kGpuAlign - 1) +
                  k * (L.gate_row + L.up_row + L.down_row + 4);
      }
      p.output_gpu = head_can_go && ((mask >> bit) & 1);
      linear += (any ? gpu_ffn_scratch_bytes(m, o) : 0) + (any_attn || p.output_gpu ? gpu_attn_scratch_bytes(m, o) : 0) +
                (p.output_gpu ? gpu_output_bytes(m, o) : 0);
      if (!ok || linear > static_cast<double>(dev.vram_budget)) continue;
      finish_plan(m, dev, o, p);
      best = std::max(best, p.objective);
    }
    EXPECT_GE(ilp.objective, best - 1e-9 * std::max(1e-9, best)) << "trial " << trial;
  }
}

// Three layers of 4 neurons, every row 256 bytes, sizes worked out by hand.
TEST(Plan, LayerSplitHandComputed) {
  PlanModel m = hand_model();
  PlanOptions o;
  o.scratch = &cuda_scratch();  // the scratch CUDA's kernels keep; the common buffers below
  o.max_batch = 1;
  o.min_gpu_neurons = 1;
  // FFN share: 3 x pad(4 * 256) + pad(4 * 4) = 3072 + 256; layer = 1024 + 512 + 3328 = 4864.
  EXPECT_EQ(gpu_ffn_share_bytes(m.layers[0], 4), 3328u);
  EXPECT_EQ(gpu_layer_bytes(m.layers[0], true, 4, 0), 4864u);
  // FFN scratch: 2 pad(64 * 4) + 2 pad(4 * 4) + pad(4 * 4) + pad(6 * 4) = 512 + 512 + 512, the
  // down axpy's partial sums, kAxpyChunks (64) x 64 x 4 = 16384, x in 2 Q8_1 blocks -> 256, and
  // the firing counts (8 + 4 x 4 -> 256).
  EXPECT_EQ(gpu_ffn_scratch_bytes(m, o), 18432u);
  // Attention scratch: the hidden state, the norm's and the block's outputs 3 x 256, q 256, k and
  // v 128 -> 256 each, output 256, scores 2 * 8 * 4 -> 256, two RoPE tables of head_dim 32 / 2 =
  // 16 doubles -> 256 each, the inputs in 2 Q8_1 blocks -> 256, and the attention's partial
  // results, one chunk per head: 2 x (2 + 32) floats -> 512, the rows' positions -> 256.
  EXPECT_EQ(gpu_attn_scratch_bytes(m, o), 3584u);
  // The common buffers alone (the stand-in's): x and out 2 x 256, act and h 2 x 256, active 256;
  // no attention scratch.
  PlanOptions common = o;
  common.scratch = nullptr;
  EXPECT_EQ(gpu_ffn_scratch_bytes(m, common), 1280u);
  EXPECT_EQ(gpu_attn_scratch_bytes(m, common), 0u);
  DeviceDesc dev;
  // Scratch 18432 + 3584 = 22016 once, then 4864 per layer.
  const std::pair<uint64_t, int> cases[] = {{0, 0},      {26879, 0}, {26880, 1}, {31743, 1},
                                            {31744, 2}, {36607, 2}, {36608, 3}, {1 << 20, 3}};
  for (auto [budget, layers] : cases) {
    dev.vram_budget = budget;
    const Plan p = plan_layer_split(m, dev, o);
    int on = 0;
    for (size_t l = 0; l < 3; ++l) {
      if (p.layer_uses_gpu(l)) {
        ++on;
        EXPECT_TRUE(p.layers[l].attn_gpu);
        EXPECT_EQ(p.layers[l].gpu_neurons.size(), 4u);
      }
    }
    EXPECT_EQ(on, layers) << "budget " << budget;
    EXPECT_EQ(p.gpu_bytes, layers == 0 ? 0u : 22016u + 4864u * layers);
    for (int l = 0; l < layers; ++l) EXPECT_TRUE(p.layer_uses_gpu(static_cast<size_t>(l)));  // the first layers
  }
  // Cost model by hand for all three layers on the GPU: per layer attention 1024 + 256 (half
  // the KV) bytes, and the FFN rows the executor reads, at GPU speed, plus the synchronization.
  // Without predictors the gate decides: all 4 gate rows (1024 bytes) and 0.875 of each firing
  // neuron's up and down (GPU 512 bytes, CPU 384: its copy of down is smaller); with them (and
  // no predictor bytes here) 0.875 of gate, up and down (GPU 768, CPU 640).
  dev.vram_budget = 1 << 20;
  dev.cpu_bandwidth = 1e9, dev.gpu_bandwidth = 1e10, dev.pcie_bandwidth = 1e9, dev.sync_seconds = 1e-6;
  for (bool predicted : {false, true}) {
    m.predicted = predicted;
    const Plan p = plan_layer_split(m, dev, o);
    const double fixed = predicted ? 0 : 1024, gpu_row = predicted ? 768 : 512, cpu_row = predicted ? 640 : 384;
    const double sync = 1e-6 + 2 * 64 * 4 / 1e9;
    EXPECT_NEAR(p.seconds_per_token, 3 * ((1280.0 + fixed + 0.875 * gpu_row) / 1e10 + sync), 1e-15);
    EXPECT_NEAR(predict_cpu_seconds_per_token(m, dev), 3 * (1280.0 + fixed + 0.875 * cpu_row) / 1e9, 1e-15);
    // Half the neurons on the GPU (0 and 3: firing mass 0.5 there, 0.375 on the CPU): each
    // neuron's rows are read where they are, in that side's bytes.
    Plan half = p;
    for (auto& L : half.layers) L.attn_gpu = false, L.gpu_neurons = {0, 3};
    EXPECT_NEAR(predict_seconds_per_token(m, dev, half),
                3 * ((1280.0 + fixed / 2 + 0.375 * cpu_row) / 1e9 + (fixed / 2 + 0.5 * gpu_row) / 1e10 + sync), 1e-15);
    EXPECT_NEAR(neuron_seconds_saved(m, dev, m.layers[0], 0.5, 2),
                0.5 * (cpu_row / 1e9 - gpu_row / 1e10) + fixed / 2 * (1 / 1e9 - 1 / 1e10), 1e-18);
  }
}

// The output head on the device, by hand: three layers as above, a vocabulary of 100 rows of 64
// bytes.
TEST(Plan, OutputHeadHandComputed) {
  PlanModel m = hand_model();
  m.n_vocab = 100;
  m.output_bytes = 6400;
  m.output_weights_bytes = gpu_pad(64 * 4) + gpu_pad(6400);  // norm 256 + matrix 6400
  PlanOptions o;
  o.scratch = &cuda_scratch();
  o.max_batch = 1;
  o.min_gpu_neurons = 1;
  // Weights 6656 and the logits of one row, 100 floats -> 512.
  EXPECT_EQ(gpu_output_bytes(m, o), 7168u);
  // The layer split takes the head once every layer is there: scratch 22016 + 3 x 4864 + 7168.
  DeviceDesc dev;
  for (auto [budget, head] : {std::pair<uint64_t, bool>{43775, false}, {43776, true}}) {
    dev.vram_budget = budget;
    const Plan p = plan_layer_split(m, dev, o);
    EXPECT_EQ(p.output_gpu, head) << budget;
    EXPECT_EQ(p.gpu_bytes, head ? 43776u : 36608u);
  }
  // Alone, it still needs the hidden state's buffers: the attention scratch (3584) with it.
  Plan head_only;
  head_only.layers.resize(3);
  head_only.output_gpu = true;
  EXPECT_EQ(gpu_bytes(m, o, head_only), 3584u + 7168u);
  // The cost model: the matrix read at the GPU's bandwidth, one synchronization, the hidden state
  // up and the logits down.
  dev.vram_budget = 1 << 20;
  dev.cpu_bandwidth = 1e9, dev.gpu_bandwidth = 1e10, dev.pcie_bandwidth = 1e9, dev.sync_seconds = 1e-6;
  const double saved = 6400 * (1 / 1e9 - 1 / 1e10) - 1e-6 - (64 + 100) * 4 / 1e9;
  EXPECT_NEAR(output_seconds_saved(m, dev), saved, 1e-15);
  Plan none;
  none.layers.resize(3);
  EXPECT_NEAR(predict_seconds_per_token(m, dev, none) - predict_seconds_per_token(m, dev, head_only), saved, 1e-15);
  // Greedy and the ILP take it when it pays, and not when a synchronization costs more.
  for (PlanMethod method : {PlanMethod::ilp, PlanMethod::greedy}) {
    EXPECT_TRUE(make_plan(method, m, dev, o).output_gpu) << plan_method_name(method);
    DeviceDesc slow = dev;
    slow.sync_seconds = 1e-3;
    EXPECT_FALSE(make_plan(method, m, slow, o).output_gpu) << plan_method_name(method);
    // A device without attention blocks holds no hidden state: no head either.
    PlanOptions no_attn = o;
    no_attn.attention = false;
    EXPECT_FALSE(make_plan(method, m, dev, no_attn).output_gpu) << plan_method_name(method);
  }
  PlanOptions no_attn = o;
  no_attn.attention = false;
  EXPECT_NE(test_support::error_of([&] { validate_plan(m, no_attn, head_only, 1 << 20); }).find("output head"),
            std::string::npos);
  PlanModel headless = m;
  headless.output_weights_bytes = 0;
  EXPECT_NE(test_support::error_of([&] { validate_plan(headless, o, head_only, 1 << 20); }).find("output head"),
            std::string::npos);
  // A plan file keeps it.
  Plan p = plan_greedy(m, dev, o);
  ASSERT_TRUE(p.output_gpu);
  const std::string path = tmp_path("head.plan.gguf");
  write_plan(p, m, o, path);
  PlanOptions back = o;
  EXPECT_TRUE(read_plan(path, m, &back).output_gpu);
  // A session on a device of another scratch (the stand-in's common buffers) refuses it.
  EXPECT_NE(test_support::error_of([&] { read_plan(path, m); }).find("made for the cuda device, this session runs the cpu device"), std::string::npos);
}

TEST(Plan, MinimumNeuronsAndSyncCost) {
  std::mt19937 rng(5);
  PlanModel m = random_model(rng, false);
  PlanOptions o;
  o.min_gpu_neurons = m.n_ff / 2 + 1;
  o.group_size = 3;
  const uint64_t full = gpu_bytes(m, o, all_on_gpu(m));
  for (double frac : {0.05, 0.2, 0.5, 0.9}) {
    DeviceDesc dev;
    dev.vram_budget = static_cast<uint64_t>(frac * full);
    for (PlanMethod method : {PlanMethod::ilp, PlanMethod::greedy}) {
      const Plan p = make_plan(method, m, dev, o);
      expect_min_neurons(m, o, p);
    }
  }
  // A synchronization dearer than anything the GPU can save: nothing goes there.
  DeviceDesc dev;
  dev.vram_budget = full;
  dev.sync_seconds = 10.0;
  for (PlanMethod method : {PlanMethod::ilp, PlanMethod::greedy}) {
    const Plan p = make_plan(method, m, dev, o);
    EXPECT_EQ(p.gpu_bytes, 0u) << plan_method_name(method);
    EXPECT_EQ(p.objective, 0.0);
  }
}

// The CPU's copy of a 4-bit down: the shared-scale layout where enough neurons of a block fire
// to pay for its scale table, Q8_0 rows where they are too few. By hand for 64 neurons of 2048
// outputs: a firing neuron's codes 1024 bytes (Q8_0: 2176), a block's table 4096.
TEST(Plan, CpuDownCopyByExpectedBytes) {
  const int64_t n_embd = 2048;
  FfnWeights w;
  w.down.type = DType::Q4_0;
  std::vector<int32_t> all(64), first(32);
  std::iota(all.begin(), all.end(), 0);
  std::iota(first.begin(), first.end(), 0);
  for (float q : {0.02f, 0.05f, 0.2f, 0.5f}) {
    const std::vector<float> p(64, q);
    const double mass = 64.0 * q, blocks = 2 * (1 - std::pow(1.0 - q, 32));
    EXPECT_NEAR(neuron_major_expected_bytes(DType::Q4_0_NM, n_embd, p, all), mass * 1024 + blocks * 4096, 1e-6);
    EXPECT_NEAR(neuron_major_expected_bytes(DType::Q8_0, n_embd, p, all), mass * 2176, 1e-6);
    EXPECT_NEAR(neuron_major_expected_bytes(DType::Q4_0_NM, n_embd, p, first), mass / 2 * 1024 + blocks / 2 * 4096,
                1e-6);
    // Break-even, the shared-scale kernel reading at kNm4AxpyRate of the other's rate: about 5
    // firing neurons a block.
    EXPECT_EQ(hybrid_cpu_down_type(w, n_embd, cpu::NeuronMajorType::exact, p, all),
              (32 * q * 1024 + 4096 * (1 - std::pow(1.0 - q, 32))) / kNm4AxpyRate < 32 * q * 2176 ? DType::Q4_0_NM
                                                                                                 : DType::Q8_0)
        << q;
  }
  const std::vector<float> cold(64, 0.02f), warm(64, 0.5f);
  EXPECT_EQ(hybrid_cpu_down_type(w, n_embd, cpu::NeuronMajorType::exact, cold, all), DType::Q8_0);
  EXPECT_EQ(hybrid_cpu_down_type(w, n_embd, cpu::NeuronMajorType::exact, warm, all), DType::Q4_0_NM);
  EXPECT_EQ(hybrid_cpu_down_type(w, n_embd, cpu::NeuronMajorType::q8_0, warm, all), DType::Q8_0);
  EXPECT_EQ(hybrid_device_down_type(w, n_embd), DType::Q8_0);
  // A file's own neuron-major down_t is what both sides read.
  w.down_t = w.down;
  w.down_t.data = reinterpret_cast<const uint8_t*>(&w);
  EXPECT_EQ(hybrid_cpu_down_type(w, n_embd, cpu::NeuronMajorType::exact, cold, all), DType::Q4_0);
  EXPECT_EQ(hybrid_device_down_type(w, n_embd), DType::Q4_0);
}

TEST(Plan, IlpTimeLimitGivesValidPlanAndGap) {
  // A 7B-shaped problem with small groups and a very short limit.
  std::vector<std::vector<float>> p;
  SynthOptions so = synth_preset("7b");
  so.act = FfnActivation::relu;
  so.sparsity = 0.9f;
  so.n_layer = 8;
  for (int64_t l = 0; l < so.n_layer; ++l) p.push_back(synth_firing_probabilities(so, l));
  const PlanModel m = plan_model_from_shapes("7b", so.n_embd, so.n_ff, so.n_layer, so.n_head, so.n_head_kv, so.n_vocab,
                                             DType::Q4_0, 4096, p);
  PlanOptions o;
  o.group_size = 16;
  o.time_limit = 0.2;
  DeviceDesc dev;
  dev.vram_budget = gpu_bytes(m, o, all_on_gpu(m)) / 3;
  const Plan g = plan_greedy(m, dev, o);
  const Plan i = plan_ilp(m, dev, o);
  EXPECT_LE(i.gpu_bytes, dev.vram_budget);
  EXPECT_GE(i.objective, g.objective);
  EXPECT_TRUE(i.status == "optimal" || i.status == "time limit" || i.status == "stopped") << i.status;
  if (i.status != "optimal") {
    EXPECT_GE(i.gap, 0.0);
  }
  EXPECT_LT(i.solve_seconds, 30.0);
}

TEST(Plan, FileRoundTripAndValidation) {
  std::mt19937 rng(11);
  const PlanModel m = random_model(rng, true);
  PlanOptions o;
  o.min_gpu_neurons = 3;
  o.group_size = 4;
  DeviceDesc dev;
  dev.vram_budget = gpu_bytes(m, o, all_on_gpu(m)) / 2;
  Plan p = plan_ilp(m, dev, o);
  p.key = "some-key";
  const std::string path = tmp_path("roundtrip.plan.gguf");
  write_plan(p, m, o, path);
  PlanOptions o2;
  const Plan q = read_plan(path, m, &o2);
  EXPECT_EQ(q.method, PlanMethod::ilp);
  EXPECT_EQ(q.key, "some-key");
  EXPECT_EQ(q.gpu_bytes, p.gpu_bytes);
  EXPECT_EQ(q.vram_budget, dev.vram_budget);
  EXPECT_EQ(o2.group_size, 4);
  EXPECT_EQ(o2.min_gpu_neurons, 3);
  ASSERT_EQ(q.layers.size(), p.layers.size());
  for (size_t l = 0; l < p.layers.size(); ++l) {
    EXPECT_EQ(q.layers[l].attn_gpu, p.layers[l].attn_gpu);
    EXPECT_EQ(q.layers[l].gpu_neurons, p.layers[l].gpu_neurons);
  }
  // A plan made for an executor without predictors does not load into one with them (their
  // memory and costs differ), and the other way round.
  PlanModel with = m;
  with.predicted = true;
  EXPECT_NE(test_support::error_of([&] { read_plan(path, with); }).find("made for an executor without predictors"),
            std::string::npos);
  // Another model's shape, or other weights (bytes differ): clear errors.
  PlanModel other = m;
  other.layers.push_back(m.layers[0]);
  EXPECT_THROW(
      {
        try {
          read_plan(path, other);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("layers"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  PlanModel heavier = m;
  for (auto& L : heavier.layers) L.gate_row += 512;
  if (p.n_gpu_neurons() > 0) {
    EXPECT_THROW(read_plan(path, heavier), Error);
  }
  // A plan that does not fit its own budget is refused.
  Plan over = p;
  over.layers = all_on_gpu(m).layers;
  over.gpu_bytes = gpu_bytes(m, o, over);
  write_plan(over, m, o, path);
  EXPECT_THROW(read_plan(path, m), Error);
  // Not a plan at all.
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("llama"));
  w.write(path);
  EXPECT_THROW(read_plan(path, m), Error);
}

TEST(Plan, BadInputsGiveClearErrors) {
  std::mt19937 rng(3);
  const PlanModel good = random_model(rng, false);
  DeviceDesc dev;
  dev.vram_budget = 1 << 20;
  PlanOptions o;
  auto expect_error = [&](const PlanModel& m, const DeviceDesc& d, const PlanOptions& op, const char* needle) {
    for (PlanMethod method : {PlanMethod::ilp, PlanMethod::greedy, PlanMethod::layer_split}) {
      try {
        make_plan(method, m, d, op);
        ADD_FAILURE() << "no error for " << needle;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    }
  };
  PlanModel m = good;
  m.layers[0].p[0] = 1.5f;
  expect_error(m, dev, o, "probability");
  m = good;
  m.layers[0].p[0] = std::nanf("");
  expect_error(m, dev, o, "probability");
  m = good;
  m.layers[0].p.pop_back();
  expect_error(m, dev, o, "firing probabilities");
  m = good;
  m.layers.clear();
  expect_error(m, dev, o, "no layers");
  DeviceDesc d = dev;
  d.cpu_bandwidth = -1;
  expect_error(good, d, o, "bandwidth");
  PlanOptions op = o;
  op.group_size = 0;
  expect_error(good, dev, op, "group size");
  op = o;
  op.time_limit = 0;
  expect_error(good, dev, op, "time limit");

  EXPECT_EQ(parse_byte_size("4GiB"), uint64_t{4} << 30);
  EXPECT_EQ(parse_byte_size("512M"), uint64_t{512} << 20);
  EXPECT_EQ(parse_byte_size("1.5GB"), 1500000000u);
  EXPECT_EQ(parse_byte_size("123"), 123u);
  for (const char* bad : {"", "GiB", "4 GiB", "-1G", "4XB", "1e99G", "1.2.3M"}) EXPECT_THROW(parse_byte_size(bad), Error) << bad;
  EXPECT_THROW(parse_plan_method("best"), Error);
}

// The inputs from a real file: row sizes from the tensors' types, the synth profile.
TEST(Plan, ModelFromSynthFileAndProfile) {
  SynthOptions so;
  so.type = DType::Q4_0;
  so.act = FfnActivation::relu;
  so.sparsity = 0.8f;
  so.n_embd = 64, so.n_ff = 96, so.n_layer = 3, so.n_threads = 1, so.seed = 4;
  const std::string path = tmp_path("synth-q4_0.gguf");
  synth_write(so, path);
  auto model = load_model(path);
  const auto p = synth_profile_probabilities(*model);
  ASSERT_EQ(p.size(), 3u);
  for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(p[static_cast<size_t>(l)], synth_firing_probabilities(so, l));
  const PlanModel m = plan_model_from(*model, p, 100);
  EXPECT_EQ(m.n_ctx, 100);
  EXPECT_EQ(m.layers[0].gate_row, 2u * 18u);  // 64 values = 2 Q4_0 blocks of 18 bytes
  EXPECT_EQ(m.layers[0].down_row, 2u * 34u);  // the device's neuron-major down rows in Q8_0
  // The CPU's, for the whole layer there: at this profile's density (a fifth of the neurons fire)
  // the file's codes (32 bytes) and, per firing neuron, its share of the scale tables (128 bytes
  // for each of the 3 blocks of 32 neurons that has a firing one).
  {
    const auto& pl = p[0];
    double mass = 0, tables = 0;
    for (int b = 0; b < 3; ++b) {
      double silent = 1;
      for (int j = 32 * b; j < 32 * b + 32; ++j) mass += pl[j], silent *= 1 - pl[j];
      tables += (1 - silent) * 128;
    }
    EXPECT_EQ(m.layers[0].cpu_down_row, static_cast<uint64_t>(std::llround((32 * mass + tables) / kNm4AxpyRate / mass)));
    EXPECT_LT(m.layers[0].cpu_down_row, 2u * 34u);
  }
  EXPECT_EQ(plan_model_from(*model, p, 100, DType::F16, false, cpu::NeuronMajorType::q8_0).layers[0].cpu_down_row,
            2u * 34u);
  EXPECT_EQ(m.layers[0].kv_bytes, 2u * 100 * 32 * 2);  // n_head_kv 2 x head_dim 16, F16 (the engine's default)
  EXPECT_EQ(plan_model_from(*model, p, 100, DType::F32).layers[0].kv_bytes, 2u * 100 * 32 * 4);
  // Three sequences at once: three caches a layer; a plan file keeps the count and a session of
  // another refuses it.
  const PlanModel m3 = plan_model_from(*model, p, 100, DType::F16, false, cpu::NeuronMajorType::exact, 3);
  EXPECT_EQ(m3.n_seq, 3);
  EXPECT_EQ(m3.layers[0].kv_bytes, 3 * m.layers[0].kv_bytes);
  {
    DeviceDesc dev;
    dev.vram_budget = 1 << 20;
    const std::string seqs_path = tmp_path("seqs.plan.gguf");
    write_plan(plan_greedy(m3, dev, PlanOptions{}), m3, PlanOptions{}, seqs_path);
    EXPECT_EQ(read_plan(seqs_path, m3).layers.size(), 3u);
    const std::string e = test_support::error_of([&] { read_plan(seqs_path, m); });
    EXPECT_NE(e.find("made for 3 sequence(s) at once, the session runs 1"), std::string::npos) << e;
  }
  EXPECT_GT(m.layers[0].attn_bytes, 0u);

  // A profile file in the agreed format gives counts / n_tokens.
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("ember-profile"));
  w.set("ember.profile.n_tokens", gguf::Value::u64(50));
  w.set("ember.profile.n_layer", gguf::Value::u64(3));
  w.set("ember.profile.n_ff", gguf::Value::u64(96));
  for (int l = 0; l < 3; ++l) {
    std::vector<float> c(96);
    for (int j = 0; j < 96; ++j) c[static_cast<size_t>(j)] = static_cast<float>((j * 7 + l) % 51);
    std::vector<uint8_t> bytes(c.size() * 4);
    std::memcpy(bytes.data(), c.data(), bytes.size());
    w.add_tensor(fmt::format("blk.{}.ffn_act_count", l), DType::F32, {96}, std::move(bytes));
  }
  const std::string prof = tmp_path("profile.gguf");
  w.write(prof);
  const auto q = read_profile_probabilities(prof, 3, 96);
  EXPECT_FLOAT_EQ(q[2][5], static_cast<float>((5 * 7 + 2) % 51) / 50.0f);
  EXPECT_THROW(read_profile_probabilities(prof, 4, 96), Error);
  EXPECT_THROW(read_profile_probabilities(path, 3, 96), Error);  // a model, not a profile
}
