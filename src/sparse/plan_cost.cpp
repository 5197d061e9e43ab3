// Placement's cost model: predicted seconds per token and what each placement saves
// (sparse/plan.hpp).
#include "sparse/plan.hpp"

#include <algorithm>
#include <numeric>

#include "ops/cpu/nm4/nm4.hpp"

namespace ember {
// ---- cost model ---------------------------------------------------------------------------

namespace {

double attn_read_bytes(const PlanLayer& L) { return static_cast<double>(L.attn_bytes) + 0.5 * L.kv_bytes; }
// Bytes read per firing neuron, and per neuron whether it fires or not (the gate, where it decides).
double neuron_bytes(const PlanModel& m, const PlanLayer& L, bool cpu) {
  return static_cast<double>((m.predicted ? L.gate_row : 0) + L.up_row + (cpu ? L.cpu_down_row : L.down_row));
}
double neuron_fixed_bytes(const PlanModel& m, const PlanLayer& L) {
  return m.predicted ? 0.0 : static_cast<double>(L.gate_row);
}
double sync_seconds(const PlanModel& m, const DeviceDesc& dev) {
  return dev.sync_seconds + 2.0 * m.n_embd * sizeof(float) / dev.pcie_bandwidth;
}

}  // namespace

LayerTraffic layer_bytes_per_token(const PlanModel& m, const PlanLayer& L, const LayerPlacement& P) {
  LayerTraffic r;
  const bool uses = P.attn_gpu || !P.gpu_neurons.empty() || !P.gpu_experts.empty();
  (P.attn_gpu ? r.gpu : r.cpu) += attn_read_bytes(L);
  (uses ? r.gpu : r.cpu) += static_cast<double>(L.predictor_bytes);
  std::vector<char> on(L.p.size(), 0);
  for (int32_t j : P.gpu_neurons) on[static_cast<size_t>(j)] = 1;
  double mass_cpu = 0, mass_gpu = 0;
  for (size_t j = 0; j < L.p.size(); ++j) (on[j] ? mass_gpu : mass_cpu) += L.p[j];
  const double n_gpu = static_cast<double>(P.gpu_neurons.size()), n_cpu = static_cast<double>(L.p.size()) - n_gpu;
  r.cpu += mass_cpu * neuron_bytes(m, L, true) + neuron_fixed_bytes(m, L) * n_cpu;
  r.gpu += mass_gpu * neuron_bytes(m, L, false) + neuron_fixed_bytes(m, L) * n_gpu;
  if (L.moe()) {
    r.cpu += static_cast<double>(L.router_bytes);
    on.assign(L.expert_p.size(), 0);
    for (int32_t e : P.gpu_experts) on[static_cast<size_t>(e)] = 1;
    for (size_t e = 0; e < L.expert_p.size(); ++e)
      (on[e] ? r.gpu : r.cpu) += L.expert_p[e] * static_cast<double>(on[e] ? L.expert_bytes : L.expert_cpu_bytes);
  }
  return r;
}

double predict_seconds_per_token(const PlanModel& m, const DeviceDesc& dev, const Plan& plan) {
  double t = static_cast<double>(m.output_bytes) / dev.cpu_bandwidth;
  if (plan.output_gpu) t -= output_seconds_saved(m, dev);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerTraffic r = layer_bytes_per_token(m, m.layers[l], plan.layers[l]);
    t += r.cpu / dev.cpu_bandwidth + r.gpu / dev.gpu_bandwidth;
    if (plan.layer_uses_gpu(l)) t += sync_seconds(m, dev);
  }
  return t;
}

double predict_cpu_seconds_per_token(const PlanModel& m, const DeviceDesc& dev) {
  Plan none;
  none.layers.resize(m.layers.size());
  return predict_seconds_per_token(m, dev, none);
}

void finish_plan(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts, Plan& plan) {
  plan.vram_budget = dev.vram_budget;
  plan.gpu_bytes = gpu_bytes(m, opts, plan);
  plan.seconds_per_token = predict_seconds_per_token(m, dev, plan);
  plan.objective = predict_cpu_seconds_per_token(m, dev) - plan.seconds_per_token;
}

NeuronGroups neuron_groups(const PlanLayer& L, int64_t group_size) {
  NeuronGroups gr;
  gr.order.resize(L.p.size());
  std::iota(gr.order.begin(), gr.order.end(), 0);
  std::stable_sort(gr.order.begin(), gr.order.end(), [&](int32_t a, int32_t b) { return L.p[a] > L.p[b]; });
  const int64_t n = static_cast<int64_t>(L.p.size());
  for (int64_t b = 0; b < n; b += group_size) {
    gr.begin.push_back(b);
    double s = 0;
    for (int64_t i = b; i < std::min(n, b + group_size); ++i) s += L.p[static_cast<size_t>(gr.order[i])];
    gr.mass.push_back(s);
  }
  gr.begin.push_back(n);
  return gr;
}

Plan finish_heuristic(const PlanModel& m, const DeviceDesc& dev, const PlanOptions& opts, Plan plan,
                      const char* status, double seconds) {
  finish_plan(m, dev, opts, plan);
  plan.status = status;
  plan.gap = -1;
  plan.solve_seconds = seconds;
  validate_plan(m, opts, plan, dev.vram_budget);
  return plan;
}

std::vector<int32_t> neurons_of_groups(const NeuronGroups& groups, const std::vector<char>& chosen) {
  std::vector<int32_t> ids;
  for (size_t g = 0; g < groups.size(); ++g)
    if (chosen[g])
      for (int64_t i = groups.begin[g]; i < groups.begin[g + 1]; ++i) ids.push_back(groups.order[i]);
  std::sort(ids.begin(), ids.end());
  return ids;
}

double neuron_seconds_saved(const PlanModel& m, const DeviceDesc& dev, const PlanLayer& L, double mass, int64_t count) {
  return mass * (neuron_bytes(m, L, true) / dev.cpu_bandwidth - neuron_bytes(m, L, false) / dev.gpu_bandwidth) +
         static_cast<double>(count) * neuron_fixed_bytes(m, L) * (1.0 / dev.cpu_bandwidth - 1.0 / dev.gpu_bandwidth);
}

double attn_seconds_saved(const DeviceDesc& dev, const PlanLayer& L) {
  return attn_read_bytes(L) * (1.0 / dev.cpu_bandwidth - 1.0 / dev.gpu_bandwidth);
}

double expert_seconds_saved(const DeviceDesc& dev, const PlanLayer& L, size_t e) {
  return L.expert_p[e] * (static_cast<double>(L.expert_cpu_bytes) / dev.cpu_bandwidth -
                          static_cast<double>(L.expert_bytes) / dev.gpu_bandwidth);
}

int64_t layer_min_neurons(const PlanLayer& L, const PlanOptions& opts) {
  return std::min<int64_t>(opts.min_gpu_neurons, static_cast<int64_t>(L.p.size()));
}

double output_seconds_saved(const PlanModel& m, const DeviceDesc& dev) {
  return static_cast<double>(m.output_bytes) * (1.0 / dev.cpu_bandwidth - 1.0 / dev.gpu_bandwidth) - dev.sync_seconds -
         static_cast<double>(m.n_embd + m.n_vocab) * sizeof(float) / dev.pcie_bandwidth;
}

double layer_fixed_seconds(const PlanModel& m, const DeviceDesc& dev, const PlanLayer& L) {
  return sync_seconds(m, dev) - static_cast<double>(L.predictor_bytes) * (1.0 / dev.cpu_bandwidth - 1.0 / dev.gpu_bandwidth);
}

}  // namespace ember
