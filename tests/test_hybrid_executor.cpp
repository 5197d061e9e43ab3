// The hybrid FFN executor with a second CPU device standing in for the GPU: for several plans
// (by hand, ILP at load with its cache, layer-split from a file, greedy with short GPU batches)
// the logits equal the all-CPU sparse executor's to rounding and, on ReLU models, the dense
// ones; results repeat bit for bit; the device holds exactly the bytes the plan counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.hpp"
#include "device/cpu/cpu_device.hpp"
#include "device/cuda/cuda_scratch.hpp"
#include "device/device.hpp"
#include "engine/session.hpp"
#include "gguf/writer.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"
#include "support/errors.hpp"
#include "support/plans.hpp"
#include "support/session_logits.hpp"
#include "support/synth_files.hpp"

using namespace ember;

namespace {

std::filesystem::path test_dir() {
  auto dir = std::filesystem::temp_directory_path() / "ember-test-hybrid";
  std::filesystem::create_directories(dir);
  return dir;
}

std::string write_model(DType type, FfnActivation act, const std::string& name) {
  SynthOptions o;
  o.type = type;
  o.act = act;
  if (act == FfnActivation::relu) o.sparsity = 0.8f;
  o.n_embd = 128;
  o.n_ff = 352;
  o.n_layer = 3;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.seed = 5;
  o.n_threads = 1;
  std::string path = (test_dir() / (name + ".gguf")).string();
  synth_write(o, path);
  return path;
}

using test_support::Logits;

// The logits of test_support::session_logits, and the executors' counters.
Logits run(const Model& m, const SessionParams& p, HybridStats* hs = nullptr, FfnSparsityStats* ss = nullptr) {
  Session s(m, p);
  Logits out = test_support::session_logits(s);
  if (hs && s.hybrid()) *hs = s.hybrid()->stats();
  if (ss && s.sparse_ffn()) *ss = s.sparse_ffn()->stats();
  return out;
}

double rel_diff(const Logits& a, const Logits& b) { return test_support::max_rel_diff(a, b); }

SessionParams base_params(int threads = 2) {
  SessionParams p;
  p.n_threads = threads;
  p.n_ctx = 64;
  // A model this small saves less than a real synchronization costs: make it free, so that the
  // solvers do put neurons on the device.
  p.hybrid.device.sync_seconds = 0;
  p.hybrid.device.pcie_bandwidth = 1e15;
  p.hybrid.device_kind = "cpu";  // the stand-in, GPU or not (test_cuda_ops.cpp covers CUDA)
  p.kv_type = DType::F16;        // as the plans below count it (plan_model_from's default)
  return p;
}

// A plan by hand: layer 0 a random third of its neurons, layer 1 none, layer 2 all.
Plan hand_plan(const Model& m) {
  Plan p;
  p.method = PlanMethod::greedy;
  p.vram_budget = uint64_t{1} << 40;
  p.layers.resize(3);
  std::mt19937 rng(2);
  for (int32_t j = 0; j < m.hp.n_ff; ++j) {
    if (rng() % 3 == 0) p.layers[0].gpu_neurons.push_back(j);
    p.layers[2].gpu_neurons.push_back(j);
  }
  return p;
}

}  // namespace

TEST(HybridExecutor, EqualsAllCpuForSeveralPlans) {
  for (DType type : {DType::F32, DType::Q4_0}) {
    const std::string path = write_model(type, FfnActivation::relu, std::string("relu-") + std::string(dtype_name(type)));
    for (const auto& f : std::filesystem::directory_iterator(test_dir()))  // no stale cached plans
      if (f.path().string().find(".plan-") != std::string::npos) std::filesystem::remove(f.path());
    auto model = load_model(path);
    SessionParams dense = base_params(), sparse = base_params();
    sparse.sparse.mode = FfnMode::oracle;
    FfnSparsityStats ss;
    // The hybrid devices hold row-wise Q8_0 copies of a quantized down (their shares are rows);
    // the all-CPU reference and the hybrid's CPU side use the same here, not their default
    // shared-scale copy (the last case below).
    const auto down = type != DType::F32 ? cpu::NeuronMajorType::q8_0 : cpu::NeuronMajorType::exact;
    sparse.sparse.down_type = down;
    const Logits ref_dense = run(*model, dense), ref_sparse = run(*model, sparse, nullptr, &ss);
    uint64_t sparse_fired = 0;
    for (uint64_t a : ss.active) sparse_fired += a;

    // The budgets are fractions of everything-on-the-GPU for this model.
    PlanModel pm = plan_model_from(*model, plan_probabilities(*model, ""), 64);
    Plan everything;
    everything.layers.resize(3);
    for (auto& L : everything.layers) {
      L.attn_gpu = true;
      for (int32_t j = 0; j < model->hp.n_ff; ++j) L.gpu_neurons.push_back(j);
    }
    const uint64_t full = gpu_bytes(pm, PlanOptions{}, everything);

    const Plan hand = hand_plan(*model);
    struct Case {
      std::string name;
      SessionParams p;
    };
    std::vector<Case> cases;
    {
      SessionParams p = base_params();
      p.hybrid.given = &hand;
      p.hybrid.plan.min_gpu_neurons = 1;
      cases.push_back({"hand", p});
    }
    {
      SessionParams p = base_params();
      p.hybrid.vram_budget = full * 3 / 10;
      p.hybrid.plan.min_gpu_neurons = 32;
      p.hybrid.plan.time_limit = 2;
      p.hybrid.device_threads = 2;
      cases.push_back({"ilp 30%", p});
      cases.push_back({"ilp 30% cached", p});
    }
    const std::string split_path = (test_dir() / "split.plan.gguf").string();
    {
      DeviceDesc dev;
      dev.vram_budget = full * 2 / 3;  // the scratch of a tiny model weighs as much as a layer
      const Plan split = plan_layer_split(pm, dev, PlanOptions{});
      ASSERT_GT(split.n_gpu_neurons(), 0);
      write_plan(split, pm, PlanOptions{}, split_path);
      SessionParams p = base_params();
      p.hybrid.plan_path = split_path;
      cases.push_back({"layer-split file", p});
      // A plan file's session takes the profile where there is one, but one asked for must exist.
      SessionParams missing = p;
      missing.hybrid.profile_path = (test_dir() / "no-such.profile.gguf").string();
      EXPECT_THROW(Session(*model, missing), Error);
    }
    {
      SessionParams p = base_params(1);
      p.hybrid.vram_budget = full * 6 / 10;
      p.hybrid.method = PlanMethod::greedy;
      p.hybrid.plan.max_batch = 5;  // a 12-token prompt goes in chunks of 5, 5, 2
      p.hybrid.plan.min_gpu_neurons = 16;
      cases.push_back({"greedy 60%, batch 5", p});
    }
    for (auto& c : cases) c.p.sparse.down_type = down;
    for (const auto& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " " + c.name);
      HybridStats hs;
      const Logits h = run(*model, c.p, &hs);
      const double vs_sparse = rel_diff(ref_sparse, h), vs_dense = rel_diff(ref_dense, h);
      std::printf("%s %s: |hybrid - sparse| %.2e, |hybrid - dense| %.2e, fired device %llu + cpu %llu (sparse %llu)\n",
                  std::string(dtype_name(type)).c_str(), c.name.c_str(), vs_sparse, vs_dense,
                  static_cast<unsigned long long>(hs.device_fired), static_cast<unsigned long long>(hs.cpu_fired),
                  static_cast<unsigned long long>(sparse_fired));
      // The same products as the all-CPU sparse executor, summed in another order.
      EXPECT_LT(vs_sparse, 1e-5);
      // ReLU: the oracle is exact, so dense too (Q4_0: 8-bit roundings, see test_sparse_ffn).
      EXPECT_LT(vs_dense, type == DType::Q4_0 ? 2e-2 : 1e-4);
      EXPECT_GT(hs.device_fired, 0u);
      EXPECT_GT(hs.cpu_fired, 0u);
      const double fired = static_cast<double>(hs.device_fired + hs.cpu_fired);
      EXPECT_NEAR(fired, static_cast<double>(sparse_fired), 1e-3 * sparse_fired);
      // Bit-identical when run again.
      EXPECT_EQ(run(*model, c.p), h);
    }
    if (type == DType::Q4_0) {
      // The default: the CPU reads the file's 4-bit codes and scales (Q4_0_NM, as the all-CPU
      // sparse executor does), the device its rows in Q8_0. Against the all-CPU executor with
      // that same copy: the device's neurons differ by Q8_0's second rounding and the CPU's by
      // nothing but the order of the sums.
      SessionParams p = cases[0].p;
      p.sparse.down_type = cpu::NeuronMajorType::exact;
      SessionParams nm4 = base_params();
      nm4.sparse.mode = FfnMode::oracle;
      HybridStats hs;
      const Logits h = run(*model, p, &hs), ref_nm4 = run(*model, nm4);
      const double vs_nm4 = rel_diff(ref_nm4, h), vs_q8 = rel_diff(ref_sparse, h), vs_dense = rel_diff(ref_dense, h);
      std::printf("Q4_0 hand, shared-scale CPU copy: |hybrid - sparse nm4| %.2e, |hybrid - sparse q8_0| %.2e, "
                  "|hybrid - dense| %.2e (|sparse nm4 - dense| %.2e)\n", vs_nm4, vs_q8, vs_dense,
                  rel_diff(ref_nm4, ref_dense));
      EXPECT_GT(vs_q8, 0.0);  // the CPU's copy did change
      // 8-bit roundings in other places (the factors per segment on the CPU, the values on the
      // device): as far from either all-CPU result as those are from dense.
      EXPECT_LT(vs_nm4, 2e-2);
      EXPECT_LT(vs_dense, 2e-2);
      EXPECT_GT(hs.device_fired, 0u);
      EXPECT_GT(hs.cpu_fired, 0u);
      EXPECT_EQ(run(*model, p), h);
    }
    // The ILP and greedy plans were cached beside the model, keyed, and fit their budgets.
    int cached = 0;
    for (const auto& f : std::filesystem::directory_iterator(test_dir()))
      if (f.path().string().find(".plan-") != std::string::npos) {
        ++cached;
        const Plan p = read_plan(f.path().string(), pm);
        EXPECT_LE(p.gpu_bytes, p.vram_budget);
        EXPECT_TRUE(p.vram_budget == full * 3 / 10 || p.vram_budget == full * 6 / 10) << p.vram_budget;
        EXPECT_EQ(p.key.size(), 16u);
      }
    EXPECT_EQ(cached, 2);
    std::filesystem::remove(path);
  }
}

TEST(HybridExecutor, SiluModelEqualsDense) {
  // SwiGLU at threshold 0: every neuron fires (silu is rarely exactly 0), the split is the
  // whole story.
  const std::string path = write_model(DType::F32, FfnActivation::silu, "silu");
  auto model = load_model(path);
  const Logits dense = run(*model, base_params());
  // A given plan needs no profile.
  const Plan hand = hand_plan(*model);
  SessionParams h = base_params();
  h.hybrid.given = &hand;
  h.hybrid.plan.min_gpu_neurons = 1;
  EXPECT_LT(rel_diff(dense, run(*model, h)), 1e-4);
  // Planning at load does: a SiLU synth model has none of its own...
  SessionParams b = base_params();
  b.hybrid.vram_budget = 1 << 20;
  b.hybrid.cache = false;
  b.hybrid.plan.min_gpu_neurons = 8;
  try {
    run(*model, b);
    ADD_FAILURE() << "no error without a profile";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ember profile"), std::string::npos) << e.what();
  }
  // ... and a profile file beside the model is found.
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("ember-profile"));
  w.set("ember.profile.n_tokens", gguf::Value::u64(10));
  w.set("ember.profile.n_layer", gguf::Value::u64(3));
  w.set("ember.profile.n_ff", gguf::Value::u64(352));
  for (int l = 0; l < 3; ++l) {
    std::vector<float> c(352);
    for (size_t j = 0; j < c.size(); ++j) c[j] = static_cast<float>((j * 13 + l) % 11);
    std::vector<uint8_t> bytes(c.size() * 4);
    std::memcpy(bytes.data(), c.data(), bytes.size());
    w.add_tensor(fmt::format("blk.{}.ffn_act_count", l), DType::F32, {352}, std::move(bytes));
  }
  std::filesystem::path prof(path);
  prof.replace_extension(".profile.gguf");
  w.write(prof.string());
  HybridStats hs;
  EXPECT_LT(rel_diff(dense, run(*model, b, &hs)), 1e-4);
  EXPECT_GT(hs.device_fired, 0u);
  std::filesystem::remove(path);
  std::filesystem::remove(prof);
}

TEST(HybridExecutor, DeviceHoldsExactlyThePlannedBytes) {
  const std::string path = write_model(DType::Q4_0, FfnActivation::relu, "bytes");
  auto model = load_model(path);
  const PlanModel pm = plan_model_from(*model, plan_probabilities(*model, ""), 64);
  std::vector<cpu::NeuronMajorMatrix> nm;
  std::vector<TensorView> views;
  ThreadPool pool(1);
  for (const auto& L : model->layers) {
    nm.push_back(cpu::make_neuron_major(pool, L.ffn.down, DType::Q8_0));
    views.push_back(nm.back().view);
  }
  std::mt19937 rng(4);
  for (int trial = 0; trial < 10; ++trial) {
    PlanOptions o;
    o.max_batch = 1 + static_cast<int64_t>(rng() % 20);
    o.min_gpu_neurons = 0;
    Plan p;
    p.layers.resize(3);
    uint64_t attn_bytes = 0;
    int64_t attn_layers = 0;
    for (size_t l = 0; l < 3; ++l) {
      auto& L = p.layers[l];
      for (int32_t j = 0; j < model->hp.n_ff; ++j)
        if (rng() % (1 + trial) == 0) L.gpu_neurons.push_back(j);
      L.attn_gpu = rng() % 2 == 0;
      if (L.attn_gpu) attn_bytes += pm.layers[l].attn_bytes, ++attn_layers;
    }
    p.output_gpu = rng() % 2 == 0;
    CpuDevice dev(1);
    DeviceLoad what;
    what.pm = &pm;
    what.opts = &o;
    what.plan = &p;
    std::vector<cpu::NeuronMajorMatrix> rows;  // the device's neurons' rows, in the plan's order
    for (size_t l = 0; l < 3; ++l) {
      const auto& ids = p.layers[l].gpu_neurons;
      rows.push_back(cpu::neuron_major_rows(pool, views[l], ids.data(), static_cast<int64_t>(ids.size()), DType::Q8_0));
      what.down_rows.push_back(ids.empty() ? TensorView{} : rows.back().view);
    }
    what.kv_type = DType::F16;
    what.n_batch = 8;
    if (trial == 1) {  // rows that are not the plan's share are refused, naming the layer
      for (size_t l = 0; l < 3; ++l)
        if (!p.layers[l].gpu_neurons.empty()) {
          DeviceLoad bad = what;
          bad.down_rows[l] = views[l];  // every neuron's row
          CpuDevice other(1);
          const std::string e = test_support::error_of([&] { other.load(*model, bad); });
          EXPECT_NE(e.find(fmt::format("layer {}'s down rows are 352 x 128 Q8_0", l)), std::string::npos) << e;
          break;
        }
    }
    dev.load(*model, what);
    EXPECT_EQ(dev.layout().ffn_total, gpu_ffn_bytes(pm, o, p));
    EXPECT_EQ(dev.layout().attn_weights, attn_bytes);
    // The stand-in keeps no attention scratch in its arena (its workspace is its own); CUDA's by
    // hand: hidden state, norm output, block output (n_embd each), q, k, v,
    // attention output, scores over the context, two RoPE tables of head_dim / 2 doubles, the
    // block's inputs rounded to 8 bits (4 Q8_1 blocks of 36 bytes per row of 128), the attention's
    // partial results (one chunk of the 64 positions per token and head: max, sum, 32 values),
    // the positions of the rows' sequences (an int32 per row).
    const uint64_t b = static_cast<uint64_t>(o.max_batch), hd = static_cast<uint64_t>(model->hp.head_dim);
    const uint64_t q = static_cast<uint64_t>(model->hp.n_head) * hd, kv = static_cast<uint64_t>(model->hp.n_head_kv) * hd;
    const uint64_t attn_scratch =
        attn_layers == 0 && !p.output_gpu ? 0
                         : 3 * gpu_pad(b * 128 * 4) + 2 * gpu_pad(b * q * 4) + 2 * gpu_pad(b * kv * 4) +
                               gpu_pad(b * static_cast<uint64_t>(model->hp.n_head) * 64 * 4) + 2 * gpu_pad(hd / 2 * 8) +
                               gpu_pad(b * 4 * 36) + gpu_pad(b * static_cast<uint64_t>(model->hp.n_head) * (hd + 2) * 4) +
                               gpu_pad(b * 4);
    EXPECT_EQ(dev.layout().attn_scratch, 0u);
    PlanOptions on_cuda = o;
    on_cuda.scratch = &cuda_scratch();
    EXPECT_EQ(attn_layers == 0 && !p.output_gpu ? 0 : gpu_attn_scratch_bytes(pm, on_cuda), attn_scratch);
    // The head: the norm (128 floats), the matrix, the logits of max_batch rows.
    const uint64_t head = !p.output_gpu ? 0
                                        : gpu_pad(128 * 4) + gpu_pad(model->output.nbytes) +
                                              gpu_pad(b * static_cast<uint64_t>(model->hp.n_vocab) * 4);
    EXPECT_EQ(dev.layout().output, head);
    EXPECT_EQ(dev.stats().bytes, gpu_ffn_bytes(pm, o, p) + attn_bytes + head +
                               2 * static_cast<uint64_t>(attn_layers * 64 * model->hp.n_head_kv * model->hp.head_dim) * 2);
    EXPECT_EQ(dev.stats().bytes, gpu_bytes(pm, o, p));
    // And its share computes what the CPU computes over the same neurons.
    for (size_t l = 0; l < 3; ++l) {
      const auto& ids = p.layers[l].gpu_neurons;
      if (ids.empty()) continue;
      std::vector<float> x(static_cast<size_t>(o.max_batch * 128));
      for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
      dev.ffn_begin(static_cast<int64_t>(l), x.data(), o.max_batch, ShareRule{});
      const float* got = dev.ffn_end();
      std::vector<float> act(static_cast<size_t>(o.max_batch * 352)), h(act.size()), out(x.size()),
          axpy(cpu::sparse_axpy_scratch_floats(128, o.max_batch, 1, cpu::AxpySplit::columns));
      std::vector<int32_t> active(352);
      AlignedBuffer<uint8_t> mm(cpu::gather_matmul_scratch_bytes(DType::Q4_0, 128, o.max_batch) + 64);
      const FfnShareScratch sc{act.data(), h.data(), active.data(), mm.data(), axpy.data()};
      FfnWeights w = model->layers[l].ffn;
      w.down = {};
      w.down_t = views[l];
      ffn_share_partial(pool, w, ids.data(), static_cast<int64_t>(ids.size()), cpu::Activation::relu, 0.0f, x.data(),
                        o.max_batch, out.data(), sc);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(got[i], out[i]) << "layer " << l << " at " << i;
    }
  }
  std::filesystem::remove(path);
}

// Attention blocks placed on the stand-in device (which runs the CPU's own block functions on
// its own copies, KV cache and threads) change no bit of the output, for FFN splits of none and
// some neurons and attention on no, some and all layers; the hidden state crosses only where
// consecutive blocks change device. Every architecture of the table but mixtures of experts,
// ReLU where it takes it: Llama (Q4_0, RoPE), Bamboo (ReLU on gate and up), Gemma 3 (QK-norm,
// post-norms, sliding window, local RoPE), OPT (LayerNorm, biases, learned positions, no gate),
// Qwen2 (Q/K/V biases, NeoX RoPE), Qwen3 (Q/K-norm), Phi-3 (fused QKV and gate/up, LongRoPE
// factors), Falcon (LayerNorm, fused QKV, parallel residual with two norms, ReLU without a gate);
// and a llama with a parallel residual (the FFN's input taken before attention, on the device).
TEST(HybridExecutor, AttentionOnTheStandInChangesNoBit) {
  std::vector<std::string> variants;  // every row of the table whose layers the hybrid runs (not mixtures of experts)
  for (const Architecture& a : architectures())
    if (a.synth->experts != SynthExperts::required) variants.push_back(a.name);
  variants.push_back("llama-parallel");
  for (const std::string& variant : variants) {
    SCOPED_TRACE(variant);
    const std::string arch = variant == "llama-parallel" ? "llama" : variant;
    const ArchSynth& as = *find_architecture(arch)->synth;
    SynthOptions o = synth_options_for(SynthOptions{}, arch);
    if (std::find(as.acts.begin(), as.acts.end(), FfnActivation::relu) != as.acts.end()) o.act = FfnActivation::relu;
    if (o.act == FfnActivation::relu && as.profile != SynthProfile::none) o.sparsity = 0.7f;
    o.type = arch == "llama" ? DType::Q4_0 : DType::F32;
    o.n_embd = 128;
    o.n_ff = 288;
    o.n_layer = 3;
    o.n_head = 4;
    o.n_head_kv = as.grouped_kv ? 2 : 4;
    o.seed = 8;
    o.n_threads = 1;
    const std::string path = (test_dir() / ("attn-" + variant + ".gguf")).string();
    synth_write(o, path);
    auto model = load_model(path);
    model->hp.parallel_residual = variant == "llama-parallel";
    for (int64_t max_batch : {16, 5})
    for (bool split : {false, true}) {
      SCOPED_TRACE(split ? "half the neurons on the device" : "no neurons on the device");
      SCOPED_TRACE("device batches of " + std::to_string(max_batch) + " tokens");
      Logits first;
      // Attention on no layer, on layers 0 and 2, on all; on all with the output head; the head alone.
      for (int placement = 0; placement < 5; ++placement) {
        Plan plan;
        plan.method = PlanMethod::greedy;
        plan.vram_budget = uint64_t{1} << 40;
        plan.layers.resize(3);
        for (size_t l = 0; l < 3; ++l) {
          if (split)
            for (int32_t j = 1; j < model->hp.n_ff; j += 2) plan.layers[l].gpu_neurons.push_back(j);
          plan.layers[l].attn_gpu = placement == 2 || placement == 3 || (placement == 1 && l != 1);
        }
        plan.output_gpu = placement >= 3;
        SessionParams p = base_params();
        p.kv_type = DType::F16;
        p.hybrid.given = &plan;
        p.hybrid.plan.min_gpu_neurons = 0;  // attention without neurons
        p.hybrid.plan.max_batch = max_batch;  // the device takes the 12-token prompt in chunks of this many
        Session s(*model, p);
        const Logits got = test_support::session_logits(s);  // 1 prompt pass + 6 decode passes
        const CrossingStats c = s.hybrid()->device().stats().crossings;
        // Chunks of a pass (the prompt's, then one per decode token), each run of device layers
        // taking the hidden state in and out once a chunk; the head takes its rows in once a
        // chunk, but where the last run was one chunk it reads them where they are.
        const uint64_t prompt_chunks = (12 + static_cast<uint64_t>(max_batch) - 1) / static_cast<uint64_t>(max_batch);
        const uint64_t chunks = prompt_chunks + 6;
        const uint64_t runs = placement == 0 || placement == 4 ? 0 : placement == 1 ? 2 : 1;
        const uint64_t head_in = placement == 4 ? chunks : placement == 3 && prompt_chunks > 1 ? prompt_chunks : 0;
        EXPECT_EQ(c.hidden_in, chunks * runs + head_in) << "placement " << placement;
        EXPECT_EQ(c.hidden_out, chunks * runs) << "placement " << placement;
        // The host keeps no KV cache for the layers whose attention is on the device.
        const int64_t attn_layers = placement == 0 || placement == 4 ? 0 : placement == 1 ? 2 : 3;
        EXPECT_EQ(s.kv_bytes(), KvCache::bytes_for(3 - attn_layers, s.n_ctx(),
                                                   model->hp.n_head_kv * model->hp.head_dim, DType::F16));
        if (placement == 0) {
          first = got;
          continue;
        }
        EXPECT_EQ(got, first) << "placement " << placement << ": the attention's device changed the logits";
      }
    }
    std::filesystem::remove(path);
  }
}

// Several sequences at once (`ember serve --parallel`): the device holds a KV cache per sequence
// for each of its attention layers; prompts of different lengths one sequence at a time, then
// steps of all of them together (one token each, then 3 + 1 + 2 tokens, whose device chunks of 5
// rows cut through the sequences) give every sequence's logits bit for bit as with attention on
// the CPU; the device holds the plan's bytes, three caches per attention layer, and the host none.
TEST(HybridExecutor, SeveralSequencesKeepTheirCachesOnTheDevice) {
  for (const std::string arch : {"llama", "gemma3"}) {
    SCOPED_TRACE(arch);
    auto model = test_support::load_synth_in(test_dir(), test_support::small_attention_synth(arch, 9, 1),
                                             "seqs-" + arch + ".gguf");
    for (int64_t max_batch : {16, 5}) {
      SCOPED_TRACE("device batches of " + std::to_string(max_batch));
      Logits first;
      for (int placement = 0; placement < 3; ++placement) {  // attention on no layer, layers 0 and 2, all
        const Plan plan =
            test_support::odd_neurons_plan(*model, [&](size_t l) { return placement == 2 || (placement == 1 && l != 1); });
        SessionParams p = base_params();
        p.n_seq = 3;
        p.n_batch = 16;
        p.hybrid.given = &plan;
        p.hybrid.plan.min_gpu_neurons = 0;
        p.hybrid.plan.max_batch = max_batch;
        Session s(*model, p);
        const Logits got = test_support::session_logits_seqs(s);
        const int64_t attn_layers = placement == 0 ? 0 : placement == 1 ? 2 : 3;
        const int64_t kv_dim = model->hp.n_head_kv * model->hp.head_dim;
        EXPECT_EQ(s.kv_bytes(), 3 * KvCache::bytes_for(3 - attn_layers, s.n_ctx(), kv_dim, DType::F16));
        const PlanModel pm = plan_model_from(*model, std::vector<std::vector<float>>(3, std::vector<float>(288, 1.0f)),
                                             s.n_ctx(), DType::F16, false, cpu::NeuronMajorType::exact, 3);
        PlanOptions po = p.hybrid.plan;
        EXPECT_EQ(s.hybrid()->device().stats().bytes, gpu_bytes(pm, po, plan));
        if (placement == 0) {
          first = got;
          continue;
        }
        EXPECT_EQ(got, first) << "placement " << placement << ": a sequence's attention on the device changed its logits";
        if (placement == 2) {  // and each sequence as in a session of its own (the kernels' batch sizes apart)
          EXPECT_LT(test_support::max_rel_diff(test_support::session_logits_seqs_alone(*model, p), got), 1e-4);
        }
      }
    }
    std::filesystem::remove(model->file->path());
  }
}

// PowerInfer's layout through the hybrid (a file with only ffn_down_t): the same logits as the
// all-CPU oracle on that file (the merge once covered one float per token: top-1 agreement 64 %).
TEST(HybridExecutor, PowerInferFileEqualsOracle) {
  SynthOptions o;
  o.act = FfnActivation::relu;
  o.sparsity = 0.8f;
  o.powerinfer = true;
  o.type = DType::Q4_0;
  o.n_embd = 128;
  o.n_ff = 352;
  o.n_layer = 3;
  o.seed = 6;
  o.n_threads = 1;
  const std::string path = (test_dir() / "pwri.gguf").string();
  synth_write(o, path);
  auto model = load_model(path);
  ASSERT_TRUE(model->layers[0].ffn.down_neuron_major_only());
  SessionParams oracle = base_params();
  oracle.sparse.mode = FfnMode::oracle;
  const Plan hand = hand_plan(*model);
  SessionParams h = base_params();
  h.hybrid.given = &hand;
  h.hybrid.plan.min_gpu_neurons = 1;
  EXPECT_LT(rel_diff(run(*model, oracle), run(*model, h)), 1e-5);
  std::filesystem::remove(path);
}

// With predictors: the device runs the predictor of every layer that uses it (its rows and the
// CPU's prediction), the CPU those of the other layers; the logits equal the all-CPU predictor
// mode's to rounding, for predictors reading the residual (on the host, and the device's own
// hidden state where it holds attention) and the FFN input; the device holds exactly the plan's
// bytes, predictors and their scratch included.
TEST(HybridExecutor, PredictorsOnBothSidesEqualTheAllCpuPredictorMode) {
  SynthOptions o;
  o.type = DType::F32;
  o.act = FfnActivation::relu;
  o.sparsity = 0.8f;
  o.powerinfer = true;  // a predictor per layer (F16), PowerInfer's layout
  o.n_embd = 128, o.n_ff = 352, o.n_layer = 3, o.n_head = 4, o.n_head_kv = 2, o.seed = 9, o.n_threads = 1;
  const std::string path = (test_dir() / "pwri-pred.gguf").string();
  synth_write(o, path);
  for (bool residual : {true, false}) {
    SCOPED_TRACE(residual ? "predictor reads the residual" : "predictor reads the FFN input");
    auto model = load_model(path);
    ASSERT_TRUE(model->predictor_on_residual);  // PowerInfer's files
    model->predictor_on_residual = residual;
    SessionParams cpu = base_params();
    cpu.sparse.mode = FfnMode::predictor;
    cpu.sparse.mirrored_predictors = false;
    FfnSparsityStats ss;
    const Logits ref = run(*model, cpu, nullptr, &ss);
    uint64_t predicted = 0;
    for (uint64_t v : ss.predicted) predicted += v;
    ASSERT_GT(predicted, 0u);

    for (bool attn : {false, true}) {
      SCOPED_TRACE(attn ? "attention of layers 0 and 2 on the device" : "FFN shares only");
      Plan plan = hand_plan(*model);  // layer 0: a third, layer 1: none (its predictor on the CPU), layer 2: all
      plan.layers[0].attn_gpu = plan.layers[2].attn_gpu = attn;
      SessionParams p = base_params();
      p.sparse.mode = FfnMode::predictor;
      p.hybrid.given = &plan;
      p.hybrid.plan.min_gpu_neurons = 1;
      // A batch takes the union of its tokens' predictions: no chunks, so that both sides see the
      // all-CPU mode's batches.
      p.hybrid.plan.max_batch = 64;
      Session s(*model, p);
      const Logits got = test_support::session_logits(s);
      EXPECT_LT(rel_diff(ref, got), 2e-5);
      const HybridStats st = s.hybrid()->stats();
      EXPECT_GT(st.device_fired, 0u);
      EXPECT_GT(st.cpu_fired, 0u);
      EXPECT_GT(st.cpu_predicted, 0u);
      // Layer 2's neurons are all on the device: the CPU computes fewer gates than the all-CPU mode.
      EXPECT_LT(st.cpu_predicted, predicted);
      // The device's bytes are the plan's: the predictors of layers 0 and 2 and their scratch in.
      PlanModel pm = plan_model_from(*model, plan_probabilities(*model, ""), 64, DType::F16, true);
      EXPECT_EQ(s.hybrid()->device().stats().bytes, gpu_bytes(pm, p.hybrid.plan, plan));
      PlanModel without = plan_model_from(*model, plan_probabilities(*model, ""), 64, DType::F16, false);
      EXPECT_EQ(gpu_bytes(pm, p.hybrid.plan, plan) - gpu_bytes(without, p.hybrid.plan, plan),
                pm.layers[0].predictor_bytes + pm.layers[2].predictor_bytes +
                    gpu_ffn_scratch_bytes(pm, p.hybrid.plan) - gpu_ffn_scratch_bytes(without, p.hybrid.plan));
    }
  }
  std::filesystem::remove(path);
}

// Budgets of the real process: the runtime's reserve comes out of a given budget, which must fit
// the device's free memory; auto takes the free memory less a margin.
TEST(HybridExecutor, BudgetsOfTheRealProcess) {
  const uint64_t MiB = uint64_t{1} << 20;
  const DeviceMemory gpu{4096 * MiB, 8192 * MiB, 512 * MiB};
  EXPECT_EQ(device_free_margin(gpu), 256 * MiB);
  EXPECT_EQ(device_plan_budget(gpu, 0, "cuda"), 3840 * MiB);             // free less the margin
  EXPECT_EQ(device_plan_budget(gpu, 2048 * MiB, "cuda"), 1536 * MiB);    // less the context
  EXPECT_EQ(device_plan_budget(gpu, 4352 * MiB, "cuda"), 3840 * MiB);    // the most that fits
  const DeviceMemory odd{4096 * MiB + 12345, 8192 * MiB, 0};
  EXPECT_EQ(device_plan_budget(odd, 0, "cuda") % (16 * MiB), 0u);        // auto: a stable key
  for (uint64_t bad : {uint64_t{512} * MiB, uint64_t{100} * MiB, uint64_t{4353} * MiB}) {
    try {
      device_plan_budget(gpu, bad, "cuda");
      ADD_FAILURE() << bad << " bytes accepted";
    } catch (const Error& e) {
      const std::string why = e.what();
      EXPECT_TRUE(why.find("context") != std::string::npos) << why;
      if (bad > gpu.free) {
        EXPECT_NE(why.find("4096.0 MiB free"), std::string::npos) << why;
      }
    }
  }
  // A small stand-in: the margin is a sixteenth of its free memory.
  const DeviceMemory small{16 * MiB, 16 * MiB, 0};
  EXPECT_EQ(device_free_margin(small), MiB);
  EXPECT_EQ(device_plan_budget(small, 0, "cpu-standin"), 15 * MiB);

  // Through a session: a stand-in reporting 1 MiB, the plan made for what auto leaves.
  const std::string path = write_model(DType::F32, FfnActivation::relu, "budget");
  auto model = load_model(path);
  SessionParams p = base_params();
  p.hybrid.cache = false;
  p.hybrid.method = PlanMethod::greedy;
  p.hybrid.plan.min_gpu_neurons = 8;
  p.hybrid.standin_vram = MiB;
  p.hybrid.vram_auto = true;
  {
    Session s(*model, p);
    const Plan& plan = s.hybrid()->plan();
    EXPECT_EQ(plan.vram_budget, device_plan_budget({MiB, MiB, 0}, 0, "cpu-standin"));
    EXPECT_LE(plan.gpu_bytes, plan.vram_budget);
    EXPECT_GT(plan.n_gpu_neurons(), 0);
    EXPECT_EQ(s.hybrid()->device().stats().bytes, plan.gpu_bytes);
  }
  // A budget larger than the device has free is refused, naming the free memory.
  p.hybrid.vram_auto = false;
  p.hybrid.vram_budget = 2 * MiB;
  try {
    Session s(*model, p);
    ADD_FAILURE() << "a 2 MiB budget on a 1 MiB device was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1.0 MiB free"), std::string::npos) << e.what();
  }
  // The runtime's reserve comes out of the budget: 2 MiB less a 1.5 MiB reserve plans 0.5 MiB.
  p.hybrid.vram_reserve = static_cast<int64_t>(3 * MiB / 2);
  {
    Session s(*model, p);
    EXPECT_EQ(s.hybrid()->plan().vram_budget, MiB / 2);
  }
  // A plan file larger than the free memory is refused too.
  Plan big;
  big.method = PlanMethod::greedy;
  big.vram_budget = uint64_t{1} << 40;
  big.layers.resize(3);
  for (auto& L : big.layers) {
    L.attn_gpu = true;
    for (int32_t j = 0; j < model->hp.n_ff; ++j) L.gpu_neurons.push_back(j);
  }
  SessionParams g = base_params();
  g.hybrid.given = &big;
  g.hybrid.standin_vram = MiB;
  try {
    Session s(*model, g);
    ADD_FAILURE() << "a plan larger than the device was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MiB free"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

// What a device counts for a decode token (DeviceCounters), on the stand-in, attention and the
// output head on the device: the hidden state up once and back once, the logits back, and an FFN
// input down and a partial output up for each layer where the CPU computes neurons, none where
// the device holds them all; the stand-in launches nothing and its waits are the caller's for
// its thread (one per layer whose share it computes).
TEST(HybridExecutor, DeviceCountsWhatADecodeTokenCrosses) {
  SynthOptions o;
  o.act = FfnActivation::relu;
  o.sparsity = 0.7f;
  o.type = DType::Q4_0;
  o.n_embd = 128, o.n_ff = 288, o.n_layer = 3, o.n_head = 4, o.n_head_kv = 2, o.seed = 8, o.n_threads = 1;
  const std::string path = (test_dir() / "counters.gguf").string();
  synth_write(o, path);
  auto model = load_model(path);
  const uint64_t f = sizeof(float), d = 128, vocab = static_cast<uint64_t>(model->hp.n_vocab);
  for (bool all_on_device : {true, false}) {
    SCOPED_TRACE(all_on_device ? "every neuron on the device" : "half the neurons on the CPU");
    Plan plan;
    plan.method = PlanMethod::greedy;
    plan.vram_budget = uint64_t{1} << 40;
    plan.layers.resize(3);
    for (size_t l = 0; l < 3; ++l) {
      for (int32_t j = all_on_device ? 0 : 1; j < model->hp.n_ff; j += all_on_device ? 1 : 2)
        plan.layers[l].gpu_neurons.push_back(j);
      plan.layers[l].attn_gpu = true;
    }
    plan.output_gpu = true;
    SessionParams p = base_params();
    p.hybrid.given = &plan;
    p.hybrid.plan.min_gpu_neurons = 0;
    Session s(*model, p);
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
    s.eval(prompt.data(), static_cast<int64_t>(prompt.size()));
    s.hybrid()->reset_stats();
    const int32_t next = 6;
    s.eval(&next, 1);
    const DeviceCounters c = s.hybrid()->device().stats().counters;
    const uint64_t cpu_layers = all_on_device ? 0 : 3;
    EXPECT_EQ(c.launches, 0u);
    EXPECT_EQ(c.graphs, 0u);
    EXPECT_EQ(c.bytes_in, d * f + cpu_layers * d * f);
    EXPECT_EQ(c.bytes_out, d * f + vocab * f + cpu_layers * d * f);
    EXPECT_EQ(c.host_waits, 3u);
    s.hybrid()->reset_stats();
    EXPECT_EQ(s.hybrid()->device().stats().counters.bytes_in, 0u);
  }
  std::filesystem::remove(path);
}
