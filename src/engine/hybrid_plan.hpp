// The options of a hybrid session and the plan it runs: given, read from a plan file, read from
// the cache beside the model, or computed by the planner (sparse/plan.hpp) and cached.
#pragma once
#include <cstdint>
#include <string>

#include "model/model.hpp"
#include "sparse/plan.hpp"

namespace ember {

struct HybridOptions {
  // Device memory the process may take (its runtime's context included, DeviceMemory::reserve);
  // the plan gets that less the reserve, checked against the free memory (device_plan_budget).
  uint64_t vram_budget = 0;   // > 0 (or vram_auto, or plan_path set): run hybrid
  bool vram_auto = false;     // the budget is the device's free memory less a margin
  int64_t vram_reserve = -1;  // the runtime's reserve in bytes; -1: the device's own figure
  uint64_t standin_vram = 0;  // the memory the CPU stand-in reports (0: the host's available memory)
  std::string plan_path;      // a precomputed plan (`ember plan -o`); empty: computed at load
  std::string profile_path;   // profile to plan with (empty: plan_probabilities' defaults)
  bool cache = true;          // cache a computed plan beside the model (and reuse a cached one)
  PlanMethod method = PlanMethod::ilp;
  DeviceDesc device;          // throughputs of the cost model (vram_budget is taken from above)
  PlanOptions plan;
  float threshold = 0.0f;     // firing threshold on |act(gate)|
  bool predictor = false;     // run the model's predictors (the plan counts and charges them)
  std::string device_kind = "auto";  // "auto" (CUDA when built and a GPU is present, else the
                                     // CPU stand-in), "cuda" or "cpu"
  int device_threads = 1;     // threads of the CPU stand-in device
  DType kv_type = DType::F16; // the session's KV cache values: the device's cache holds the same, the plan counts them
  // The CPU's copy of a down without down_t (hybrid_cpu_down_type; the session's --sparse-down).
  cpu::NeuronMajorType down_type = cpu::NeuronMajorType::exact;
  int64_t n_seq = 1;          // sequences at once (the session's): a device holds a KV cache for each
  const Plan* given = nullptr;  // tests: use this plan as is (validated)
};

// The plan for a hybrid session: given, read from plan_path, read from the cache, or computed
// (and cached as <model>.plan-<key>.gguf). `pm` receives the plan's view of the model.
Plan hybrid_plan(const Model& model, const HybridOptions& opts, int64_t n_ctx, PlanModel* pm, PlanOptions* popts);
// The cache key of a computed plan: model and profile files (path, size, time), budget, device, options.
std::string plan_cache_key(const Model& model, const std::string& profile_source, const HybridOptions& opts,
                           int64_t n_ctx);

}  // namespace ember
