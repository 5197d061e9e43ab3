// Placement: validation of inputs and plans, make_plan. Beside it: placement.cpp (what a plan is
// and puts on the device), plan_cost.cpp (the cost model), plan_inputs.cpp (the model and profile
// a plan is made from), plan_file.cpp (plan files); the solvers in plan_ilp.cpp, plan_greedy.cpp
// and plan_layer_split.cpp.
#include "sparse/plan.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "model/kv_cache.hpp"

namespace ember {

// ---- validation ---------------------------------------------------------------------------

void validate(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts) {
  EMBER_CHECK(!m.layers.empty(), "plan: the model has no layers");
  EMBER_CHECK(m.n_embd > 0 && m.n_ff > 0 && m.n_head > 0 && m.q_dim > 0 && m.kv_dim > 0 && m.n_ctx > 0,
              "plan: model shape must be positive (n_embd {}, n_ff {}, n_head {}, q_dim {}, kv_dim {}, n_ctx {})",
              m.n_embd, m.n_ff, m.n_head, m.q_dim, m.kv_dim, m.n_ctx);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const PlanLayer& L = m.layers[l];
    if (L.moe()) {
      EMBER_CHECK(L.p.empty() && L.expert_bytes > 0 && L.expert_cpu_bytes > 0,
                  "plan: layer {} is a mixture with neuron probabilities or experts of no bytes", l);
      for (size_t e = 0; e < L.expert_p.size(); ++e)
        EMBER_CHECK(std::isfinite(L.expert_p[e]) && L.expert_p[e] >= 0.0f && L.expert_p[e] <= 1.0f,
                    "plan: layer {} expert {} has routing probability {} (must be in [0, 1]); is the profile corrupt?",
                    l, e, L.expert_p[e]);
      continue;
    }
    EMBER_CHECK(static_cast<int64_t>(L.p.size()) == m.n_ff, "plan: layer {} has {} firing probabilities, expected n_ff = {}",
                l, L.p.size(), m.n_ff);
    EMBER_CHECK(L.up_row > 0 && L.down_row > 0 && L.cpu_down_row > 0, "plan: layer {} has a zero neuron row size",
                l);  // gate: 0 without one
    for (size_t j = 0; j < L.p.size(); ++j)
      EMBER_CHECK(std::isfinite(L.p[j]) && L.p[j] >= 0.0f && L.p[j] <= 1.0f,
                  "plan: layer {} neuron {} has firing probability {} (must be in [0, 1]); is the profile corrupt?", l,
                  j, L.p[j]);
  }
  for (double v : {dev.gpu_bandwidth, dev.cpu_bandwidth, dev.pcie_bandwidth})
    EMBER_CHECK(std::isfinite(v) && v > 0, "plan: device bandwidths must be positive, got {}", v);
  EMBER_CHECK(std::isfinite(dev.sync_seconds) && dev.sync_seconds >= 0, "plan: sync time must be >= 0, got {}",
              dev.sync_seconds);
  EMBER_CHECK(opts.group_size >= 1 && opts.group_size <= (int64_t{1} << 20), "plan: group size must be in [1, 2^20], got {}",
              opts.group_size);
  EMBER_CHECK(opts.min_gpu_neurons >= 0, "plan: minimum GPU neurons must be >= 0, got {}", opts.min_gpu_neurons);
  EMBER_CHECK(opts.max_batch >= 1 && opts.max_batch <= 4096, "plan: GPU batch must be in [1, 4096], got {}",
              opts.max_batch);
  EMBER_CHECK(std::isfinite(opts.time_limit) && opts.time_limit > 0, "plan: solver time limit must be > 0 s, got {}",
              opts.time_limit);
  EMBER_CHECK(opts.gap_tolerance >= 0 && opts.gap_tolerance < 1, "plan: gap tolerance must be in [0, 1), got {}",
              opts.gap_tolerance);
}

void validate_plan(const PlanModel& m, const PlanOptions& opts, const Plan& plan, uint64_t budget) {
  EMBER_CHECK(plan.layers.size() == m.layers.size(), "plan has {} layers but the model has {}; was it made for another model?",
              plan.layers.size(), m.layers.size());
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    const auto& ids = plan.layers[l].gpu_neurons;
    const int64_t n_ff = static_cast<int64_t>(m.layers[l].p.size()), min_n = layer_min_neurons(m.layers[l], opts);
    for (size_t i = 0; i < ids.size(); ++i) {
      EMBER_CHECK(ids[i] >= 0 && ids[i] < n_ff, "plan: layer {} names neuron {} (it has {})", l, ids[i], n_ff);
      EMBER_CHECK(i == 0 || ids[i] > ids[i - 1], "plan: layer {} neuron ids are not sorted and unique (at {})", l, i);
    }
    const auto& ex = plan.layers[l].gpu_experts;
    const auto n_expert = static_cast<int32_t>(m.layers[l].expert_p.size());
    for (size_t i = 0; i < ex.size(); ++i) {
      EMBER_CHECK(ex[i] >= 0 && ex[i] < n_expert, "plan: layer {} names expert {} (it has {})", l, ex[i], n_expert);
      EMBER_CHECK(i == 0 || ex[i] > ex[i - 1], "plan: layer {} expert ids are not sorted and unique (at {})", l, i);
    }
    EMBER_CHECK(opts.experts || ex.empty(), "plan: layer {} puts experts on a device that runs no experts", l);
    EMBER_CHECK(opts.attention || !plan.layers[l].attn_gpu,
                "plan: layer {} puts attention on a device that runs no attention blocks", l);
    if (plan.layer_uses_gpu(l))
      EMBER_CHECK(static_cast<int64_t>(ids.size()) >= min_n,
                  "plan: layer {} uses the GPU with {} neurons, fewer than the minimum {}", l, ids.size(), min_n);
  }
  EMBER_CHECK(!plan.output_gpu || opts.attention, "plan: the output head on a device that holds no hidden state "
              "(no attention blocks)");
  EMBER_CHECK(!plan.output_gpu || m.output_weights_bytes > 0, "plan: the output head on the device, but this model's "
              "head cannot go there");
  const uint64_t b = gpu_bytes(m, opts, plan);
  EMBER_CHECK(b <= budget, "plan needs {} bytes of GPU memory, more than the budget of {} bytes", b, budget);
}

Plan make_plan(PlanMethod method, const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts) {
  switch (method) {
    case PlanMethod::ilp: return plan_ilp(m, dev, opts);
    case PlanMethod::greedy: return plan_greedy(m, dev, opts);
    case PlanMethod::layer_split: return plan_layer_split(m, dev, opts);
  }
  fail("unknown placement method");
}

}  // namespace ember
