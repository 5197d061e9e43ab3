// The hybrid FFN executor (issue 5, "Execution"): per layer, the plan's GPU neurons run on a
// device (engine/device.hpp) while the CPU computes its own neurons concurrently; the two
// partial sums are added in a fixed order (CPU first, then the device's), so results are
// deterministic for fixed thread counts. Both sides use the oracle rule of SparseFfn: a neuron
// fires for a token when |act(gate . x)| > threshold (exact for ReLU models at threshold 0), and
// a batch takes the union of its tokens' firing neurons. Layers whose plan puts no neuron on the
// device run entirely on the CPU. Batches longer than the plan's max_batch go in chunks.
//
// Not yet: attention placed on the GPU by a plan runs on the CPU (the plan counts its memory;
// the executor covers the FFN), and there is no predictor path (the gate decides).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.hpp"
#include "model/ffn.hpp"
#include "model/forward.hpp"
#include "sparse/plan.hpp"

namespace ember {

struct HybridOptions {
  uint64_t vram_budget = 0;   // > 0 (or plan_path set): run hybrid
  std::string plan_path;      // a precomputed plan (`ember plan -o`); empty: computed at load
  std::string profile_path;   // profile to plan with (empty: plan_probabilities' defaults)
  bool cache = true;          // cache a computed plan beside the model (and reuse a cached one)
  PlanMethod method = PlanMethod::ilp;
  DeviceDesc device;          // throughputs of the cost model (vram_budget is taken from above)
  PlanOptions plan;
  float threshold = 0.0f;     // firing threshold on |act(gate)|
  std::string device_kind = "auto";  // "auto" (CUDA when built and a GPU is present, else the
                                     // CPU stand-in), "cuda" or "cpu"
  int device_threads = 1;     // threads of the CPU stand-in device
  const Plan* given = nullptr;  // tests: use this plan as is (validated)
};

// The plan for a hybrid session: given, read from plan_path, read from the cache, or computed
// (and cached as <model>.plan-<key>.gguf). `pm` receives the plan's view of the model.
Plan hybrid_plan(const Model& model, const HybridOptions& opts, int64_t n_ctx, PlanModel* pm, PlanOptions* popts);
// The cache key of a computed plan: model and profile files (path, size, time), budget, device, options.
std::string plan_cache_key(const Model& model, const std::string& profile_source, const HybridOptions& opts,
                           int64_t n_ctx);

// The device of HybridOptions::device_kind; throws naming why when "cuda" cannot be had.
std::unique_ptr<Device> make_device(const HybridOptions& opts);

struct HybridStats {
  uint64_t device_fired = 0, cpu_fired = 0;  // (token, neuron) pairs that fired on each side
  uint64_t device_layer_calls = 0;           // layer-chunks the device took part in
};

class HybridFfn final : public FfnExecutor {
 public:
  HybridFfn(const Model& model, ThreadPool& pool, const HybridOptions& opts, int64_t n_ctx,
            std::unique_ptr<Device> device = nullptr);  // null: make_device(opts)

  void run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act, const float* x, int64_t n,
           float* out, Workspace& ws) override;

  const Plan& plan() const { return plan_; }
  const Device& device() const { return *device_; }
  HybridStats stats() const;
  void reset_stats();
  size_t cpu_bytes() const;  // what the CPU side holds beyond the model (down copies, scratch)

 private:
  const Model& model_;
  Plan plan_;
  PlanModel pm_;
  PlanOptions popts_;
  float threshold_;
  std::unique_ptr<Device> device_;
  std::vector<cpu::NeuronMajorMatrix> down_nm_;  // per layer, when the file has no down_t
  std::vector<TensorView> down_views_;
  std::vector<std::vector<int32_t>> cpu_rows_;    // per layer: the CPU's neurons
  AlignedBuffer<float> act_, h_, partial_, axpy_;
  AlignedBuffer<int32_t> active_, pos_;
  uint64_t cpu_fired_ = 0, device_calls_ = 0;
};

}  // namespace ember
