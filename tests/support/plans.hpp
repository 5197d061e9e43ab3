// Plans by hand for the hybrid's tests.
#pragma once
#include <functional>

#include "engine/session.hpp"
#include "model/model.hpp"
#include "sparse/plan.hpp"

namespace ember::test_support {

// Every layer's odd neurons on the device, and the attention of the layers `attn` names; a budget
// that takes anything.
inline Plan odd_neurons_plan(const Model& m, const std::function<bool(size_t)>& attn) {
  Plan plan;
  plan.method = PlanMethod::greedy;
  plan.vram_budget = uint64_t{1} << 40;
  plan.layers.resize(m.layers.size());
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    for (int32_t j = 1; j < m.hp.n_ff; j += 2) plan.layers[l].gpu_neurons.push_back(j);
    plan.layers[l].attn_gpu = attn(l);
  }
  return plan;
}

// A session of `threads` threads, a context of 64 and an F16 KV cache running `plan` as given
// (no minimum of neurons a layer), the device's batches of max_batch tokens.
inline SessionParams given_plan_params(const Plan& plan, int64_t max_batch, int threads = 2) {
  SessionParams p;
  p.n_threads = threads;
  p.n_ctx = 64;
  p.kv_type = DType::F16;
  p.hybrid.given = &plan;
  p.hybrid.plan.min_gpu_neurons = 0;
  p.hybrid.plan.max_batch = max_batch;
  return p;
}

}  // namespace ember::test_support
