// `ember plan`: places a model's attention blocks and FFN neurons (a mixture's experts) on a GPU of a given memory
// budget (sparse/plan.hpp), prints the chosen plan per layer and the three placements (ILP,
// greedy, layer-split) side by side with the cost model's predicted speed, and writes the
// chosen one as a plan file. `--synth-preset` plans a synth model from its shapes and known
// profile without writing the model (a 7B file is not needed to plan one).
#include <fmt/format.h>

#include <cmath>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "synth/synth.hpp"
#include "model/kv_cache.hpp"
#include "device/make_device.hpp"
#include "sparse/plan.hpp"
#include "sparse/predictor.hpp"

namespace ember::cli {
namespace {

struct PlanFlags {
  std::string model_path, profile_path, out_path, budget = "", method = "ilp";
  std::string synth_preset, synth_type = "q4_0";
  float synth_sparsity = 0.9f, synth_zipf = 1.1f;
  double gpu_gbps = 1500, cpu_gbps = 50, pcie_gbps = 25, sync_us = 20;
  int64_t ctx = 4096;
  int64_t parallel = 1;
  std::string kv_type = "f16";
  std::string device = "auto";
  PlanOptions opts;
  bool verbose = false;
};

std::string mib(uint64_t b) { return fmt::format("{:.1f}", b / 1048576.0); }

std::string gap_text(const Plan& p) { return p.gap < 0 ? "-" : fmt::format("{:.2e}", p.gap); }

void print_layers(const PlanModel& m, const Plan& p) {
  const bool moe = !m.layers.empty() && m.layers[0].moe();
  fmt::print("{:>5} {:>5} {:>8} {:>7} {:>11} {:>12} {:>12}\n", "layer", "attn", moe ? "experts" : "neurons",
             moe ? "route %" : "mass %", "GPU MiB", "CPU MB/tok", "GPU MB/tok");
  double cpu = 0, gpu = 0;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const auto& L = m.layers[l];
    const auto& P = p.layers[l];
    const auto& prob = moe ? L.expert_p : L.p;
    const auto& ids = moe ? P.gpu_experts : P.gpu_neurons;
    double mass = 0, all = 0;
    for (float x : prob) all += x;
    for (int32_t j : ids) mass += prob[static_cast<size_t>(j)];
    const LayerTraffic t = layer_bytes_per_token(m, L, P);
    cpu += t.cpu, gpu += t.gpu;
    fmt::print("{:>5} {:>5} {:>8} {:>7.1f} {:>11} {:>12.2f} {:>12.2f}\n", l, P.attn_gpu ? "GPU" : "CPU",
               moe ? fmt::format("{}/{}", ids.size(), prob.size()) : fmt::format("{}", ids.size()),
               all > 0 ? 100.0 * mass / all : 0.0,
               mib(gpu_layer_bytes(L, P.attn_gpu, static_cast<int64_t>(P.gpu_neurons.size()),
                                   static_cast<int64_t>(P.gpu_experts.size()))),
               t.cpu / 1e6, t.gpu / 1e6);
  }
  fmt::print("{:>5} {:>5} {:>8} {:>7} {:>11} {:>12.2f} {:>12.2f}\n", "all", "", "", "", mib(p.gpu_bytes), cpu / 1e6,
             gpu / 1e6);
}

void run_plan(const PlanFlags& f) {
  if (f.verbose) set_log_level(LogLevel::debug);
  EMBER_CHECK(!f.model_path.empty() || !f.synth_preset.empty(), "plan: give a model (-m) or --synth-preset");
  EMBER_CHECK(f.model_path.empty() || f.synth_preset.empty(), "plan: give either -m or --synth-preset, not both");
  DeviceDesc dev;
  dev.vram_budget = parse_byte_size(f.budget);
  dev.gpu_bandwidth = f.gpu_gbps * 1e9;
  dev.cpu_bandwidth = f.cpu_gbps * 1e9;
  dev.pcie_bandwidth = f.pcie_gbps * 1e9;
  dev.sync_seconds = f.sync_us * 1e-6;
  // The device the plan is for: what it holds, and the scratch its kernels keep.
  PlanOptions opts = f.opts;
  const DeviceCaps caps = device_kind_caps(f.device);
  opts.attention = caps.attention;
  opts.experts = caps.experts;
  opts.scratch = caps.scratch;

  PlanModel m;
  std::string source;
  std::unique_ptr<Model> model;
  if (!f.synth_preset.empty()) {
    SynthOptions so = synth_preset(f.synth_preset);
    so.act = FfnActivation::relu;
    so.sparsity = f.synth_sparsity;
    so.zipf = f.synth_zipf;
    const auto type = dtype_from_name(f.synth_type);
    EMBER_CHECK(type.has_value(), "plan: unknown --synth-type '{}' (f32, f16, q8_0, q4_0, q4_1, q6_k, ...)", f.synth_type);
    so.type = *type;
    validate(so);
    std::vector<std::vector<float>> p;
    for (int64_t l = 0; l < so.n_layer; ++l) p.push_back(synth_firing_probabilities(so, l));
    EMBER_CHECK(!p.empty() && !p[0].empty(), "plan: --synth-sparsity must be in (0, 1), got {}", f.synth_sparsity);
    m = plan_model_from_shapes("synth-" + f.synth_preset, so.n_embd, so.n_ff, so.n_layer, so.n_head, so.n_head_kv,
                               so.n_vocab, so.type, std::min(f.ctx, so.n_ctx), p, parse_kv_type(f.kv_type));
    set_plan_sequences(m, f.parallel);
    source = fmt::format("synth profile (sparsity {}, zipf {})", f.synth_sparsity, f.synth_zipf);
  } else {
    model = load_model(f.model_path);
    // As the hybrid runs it: with the model's predictors where it has them.
    m = plan_model_from(*model, plan_probabilities(*model, f.profile_path, &source), f.ctx, parse_kv_type(f.kv_type),
                        has_predictors(*model), cpu::NeuronMajorType::exact, f.parallel);
    if (m.predicted) source += "; with the model's predictors";
  }
  const PlanMethod chosen = parse_plan_method(f.method);
  Plan all;
  all.layers.resize(m.layers.size());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    all.layers[l].attn_gpu = true;
    for (size_t j = 0; j < m.layers[l].p.size(); ++j) all.layers[l].gpu_neurons.push_back(static_cast<int32_t>(j));
    for (size_t e = 0; e < m.layers[l].expert_p.size(); ++e) all.layers[l].gpu_experts.push_back(static_cast<int32_t>(e));
  }
  const uint64_t full = gpu_bytes(m, opts, all);
  log_info("plan: {} ({} layers, n_ff {}, context {}{}), profile: {}; budget {} MiB of {} MiB for everything", m.name,
           m.layers.size(), m.n_ff, m.n_ctx, m.n_seq > 1 ? fmt::format(" x {} sequences", m.n_seq) : "", source,
           mib(dev.vram_budget), mib(full));

  std::vector<Plan> plans;
  for (PlanMethod method : {PlanMethod::ilp, PlanMethod::greedy, PlanMethod::layer_split}) {
    log_info("plan: solving ({})...", plan_method_name(method));
    plans.push_back(make_plan(method, m, dev, opts));
  }
  const Plan& best = plans[static_cast<size_t>(chosen)];
  fmt::print("plan ({}):\n", plan_method_name(chosen));
  print_layers(m, best);
  const double cpu_s = predict_cpu_seconds_per_token(m, dev);
  fmt::print("\nall on the CPU: {:.2f} tok/s predicted\n", 1.0 / cpu_s);
  fmt::print("{:<12} {:<11} {:>9} {:>8} {:>10} {:>9} {:>8} {:>6} {:>5} {:>10} {:>8}\n", "method", "status", "gap",
             "solve s", "GPU MiB", "neurons", "experts", "attn", "head", "tok/s", "vs CPU");
  for (const Plan& p : plans) {
    int attn = 0;
    for (const auto& L : p.layers) attn += L.attn_gpu;
    fmt::print("{:<12} {:<11} {:>9} {:>8.3f} {:>10} {:>9} {:>8} {:>6} {:>5} {:>10.2f} {:>7.2f}x\n",
               plan_method_name(p.method), p.status, gap_text(p), p.solve_seconds, mib(p.gpu_bytes), p.n_gpu_neurons(),
               p.n_gpu_experts(), attn,
               p.output_gpu ? "GPU" : "CPU", 1.0 / p.seconds_per_token, cpu_s / p.seconds_per_token);
  }
  fmt::print("(speeds are the cost model's predictions, not measurements)\n");
  if (!f.out_path.empty()) {
    write_plan(best, m, opts, f.out_path);
    log_info("plan: wrote {} ({}, {} MiB on the GPU)", f.out_path, plan_method_name(chosen), mib(best.gpu_bytes));
  }
}

}  // namespace

void add_plan(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  auto* cmd = app.add_subcommand("plan", "place attention and FFN neurons on a GPU of a given memory budget");
  cmd->add_option("-m,--model", f->model_path, "GGUF model file");
  cmd->add_option("--profile", f->profile_path,
                  "activation profile (`ember profile`); default: a synth model's own, else MODEL.profile.gguf");
  cmd->add_option("--vram-budget", f->budget, "GPU memory Ember may use, e.g. 4GiB")->required();
  cmd->add_option("-o,--output", f->out_path, "write the chosen plan here (GGUF)");
  cmd->add_option("--method", f->method, "placement written with -o")
      ->check(CLI::IsMember({"ilp", "greedy", "layer-split"}))
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", f->ctx, "context size the KV cache is sized for")->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--parallel", f->parallel,
                  "sequences at once the plan is for (`ember serve --parallel`): a KV cache each on the GPU")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--hybrid-device", f->device,
                  "the device the plan is for (its memory and scratch): auto (CUDA if built and present), cuda, or cpu "
                  "(the stand-in)")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
      ->capture_default_str();
  cmd->add_option("--kv-type", f->kv_type, "KV cache values the plan counts: f16 (the engine's default) or f32")
      ->check(CLI::IsMember({"f16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--gpu-bw", f->gpu_gbps, "GPU memory bandwidth, GB/s")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--cpu-bw", f->cpu_gbps, "CPU memory bandwidth, GB/s")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--pcie-bw", f->pcie_gbps, "PCIe bandwidth, GB/s")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--sync-us", f->sync_us, "cost of one GPU layer's synchronization, microseconds")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--group-size", f->opts.group_size, "neurons per ILP variable")->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--min-neurons", f->opts.min_gpu_neurons, "fewest GPU neurons of a layer that uses the GPU")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--max-batch", f->opts.max_batch, "tokens per GPU pass (sizes the scratch)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--time-limit", f->opts.time_limit, "seconds the ILP solver may take")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--gap", f->opts.gap_tolerance, "ILP: stop at this relative optimality gap")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  cmd->add_option("--synth-preset", f->synth_preset, "plan a synth preset (tiny, smollm2-135m, 1.1b, 7b) from its shapes");
  cmd->add_option("--synth-type", f->synth_type, "--synth-preset: weight type")->capture_default_str();
  cmd->add_option("--synth-sparsity", f->synth_sparsity, "--synth-preset: ReLU sparsity of its profile")
      ->check(CLI::Range(0.01f, 0.99f))
      ->capture_default_str();
  cmd->add_option("--synth-zipf", f->synth_zipf, "--synth-preset: power-law exponent of its profile")
      ->check(CLI::Range(0.1f, 5.0f))
      ->capture_default_str();
  cmd->add_flag("-v,--verbose", f->verbose, "more log output");
  cmd->callback([f] { run_plan(*f); });
}

}  // namespace ember::cli
