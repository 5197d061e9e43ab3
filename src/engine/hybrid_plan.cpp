#include "engine/hybrid_plan.hpp"

#include <filesystem>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"

namespace ember {

namespace {

std::string file_stamp(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return path;
  const auto time = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  return fmt::format("{}:{}:{}", std::filesystem::absolute(path).string(), size, ec ? 0 : time);
}


}  // namespace

std::string plan_cache_key(const Model& model, const std::string& profile_source, const HybridOptions& o,
                           int64_t n_ctx) {
  const DeviceDesc& d = o.device;
  const PlanOptions& p = o.plan;
  const std::string all =
      fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", file_stamp(model.file->path()),
                  file_stamp(profile_source), o.vram_budget, d.gpu_bandwidth, d.cpu_bandwidth, d.pcie_bandwidth,
                  d.sync_seconds, p.group_size, p.min_gpu_neurons, p.max_batch, p.time_limit, p.gap_tolerance,
                  plan_method_name(o.method), n_ctx, fmt::format("{}{}", p.attention, p.experts), dtype_name(o.kv_type), o.predictor,
                  static_cast<int>(o.down_type), o.n_seq);
  return fmt::format("{:016x}", fnv1a64(all));
}

Plan hybrid_plan(const Model& model, const HybridOptions& o, int64_t n_ctx, PlanModel* pm_out, PlanOptions* popts) {
  std::string source;
  // A given plan needs the model's sizes to be checked, not its profile; a plan file's session
  // still takes the profile where there is one (the CPU's down copy is chosen by it,
  // hybrid_cpu_down_type), and without one counts every neuron as firing.
  std::vector<std::vector<float>> prob;
  if (!o.given) {
    try {
      prob = plan_probabilities(model, o.profile_path, &source);
    } catch (const Error& e) {
      if (o.plan_path.empty() || !o.profile_path.empty()) throw;  // a profile asked for must be read
      log_info("hybrid: no activation profile ({}); the plan file's session counts every neuron as firing", e.what());
    }
  }
  if (prob.empty())
    for (size_t l = 0; l < model.layers.size(); ++l) prob.emplace_back(static_cast<size_t>(plan_units(model, l)), 1.0f);
  *pm_out = plan_model_from(model, prob, n_ctx, o.kv_type, o.predictor, o.down_type, o.n_seq);
  const PlanModel& pm = *pm_out;
  *popts = o.plan;
  if (o.given) {
    validate_plan(pm, o.plan, *o.given, o.given->vram_budget);
    Plan p = *o.given;
    p.gpu_bytes = gpu_bytes(pm, o.plan, p);
    return p;
  }
  if (!o.plan_path.empty()) {
    Plan p = read_plan(o.plan_path, pm, popts);
    log_info("hybrid: plan {} ({}, {:.1f} MiB on the device)", o.plan_path, plan_method_name(p.method),
             p.gpu_bytes / 1048576.0);
    return p;
  }
  EMBER_CHECK(o.vram_budget > 0, "hybrid: give --vram-budget (bytes or auto) or --plan");
  DeviceDesc dev = o.device;
  dev.vram_budget = o.vram_budget;
  const std::string key = plan_cache_key(model, source, o, pm.n_ctx);
  std::filesystem::path cache(model.file->path());
  cache.replace_extension(".plan-" + key + ".gguf");
  if (o.cache && std::filesystem::exists(cache)) {
    try {
      Plan p = read_plan(cache.string(), pm, popts);
      if (p.key == key) {
        log_info("hybrid: cached plan {} ({:.1f} MiB on the device)", cache.string(), p.gpu_bytes / 1048576.0);
        return p;
      }
    } catch (const Error& e) {
      log_warn("hybrid: ignoring cached plan {}: {}", cache.string(), e.what());
    }
  }
  log_info("hybrid: planning {} for a {:.1f} MiB budget (profile: {})...", plan_method_name(o.method),
           o.vram_budget / 1048576.0, source);
  Plan p = make_plan(o.method, pm, dev, o.plan);
  p.key = key;
  log_info("hybrid: plan {} in {:.2f} s, {} GPU neurons, {} GPU experts, {:.1f} MiB, gap {}", p.status, p.solve_seconds,
           p.n_gpu_neurons(), p.n_gpu_experts(), p.gpu_bytes / 1048576.0, p.gap < 0 ? std::string("-") : fmt::format("{:.2e}", p.gap));
  if (o.cache) {
    try {
      write_plan(p, pm, o.plan, cache.string());
      log_info("hybrid: cached the plan as {}", cache.string());
    } catch (const Error& e) {
      log_warn("hybrid: could not cache the plan ({}); it is computed again next time", e.what());
    }
  }
  return p;
}

}  // namespace ember
