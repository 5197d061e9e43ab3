// Layer-split placement, the baseline llama.cpp's -ngl gives: the first k layers entirely on
// the GPU (attention, KV cache, every neuron or every expert, the predictor), the rest on the CPU, k as large as
// the budget allows, and the output head too once every layer is there. For a device without attention blocks (PlanOptions::attention false) the
// layers' FFNs alone.
#include "core/timer.hpp"
#include "sparse/plan.hpp"

namespace ember {

Plan plan_layer_split(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts) {
  validate(m, dev, opts);
  Timer timer;
  Plan plan;
  plan.method = PlanMethod::layer_split;
  plan.layers.resize(m.layers.size());
  std::vector<int32_t> all(static_cast<size_t>(m.n_ff));
  for (int32_t j = 0; j < static_cast<int32_t>(m.n_ff); ++j) all[static_cast<size_t>(j)] = j;
  bool every_layer = true;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    plan.layers[l].attn_gpu = opts.attention;  // a device without attention blocks: the FFN alone
    plan.layers[l].gpu_neurons = m.layers[l].moe() ? std::vector<int32_t>{} : all;
    if (opts.experts)  // a mixture's layer: every expert
      for (int32_t e = 0; e < static_cast<int32_t>(m.layers[l].expert_p.size()); ++e)
        plan.layers[l].gpu_experts.push_back(e);
    if (gpu_bytes(m, opts, plan) > dev.vram_budget) {
      plan.layers[l] = LayerPlacement{};
      every_layer = false;
      break;
    }
  }
  // The output head last, as llama.cpp's -ngl counts it (n_layer + 1), where it fits.
  if (every_layer && opts.attention && m.output_weights_bytes > 0) {
    plan.output_gpu = true;
    if (gpu_bytes(m, opts, plan) > dev.vram_budget) plan.output_gpu = false;
  }
  return finish_heuristic(m, dev, opts, std::move(plan), "exact", timer.seconds());
}

}  // namespace ember
