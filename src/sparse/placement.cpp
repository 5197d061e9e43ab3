// What a placement is and puts on the device (sparse/placement.hpp).
#include "sparse/placement.hpp"

#include <algorithm>

#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "model/kv_cache.hpp"

namespace ember {

namespace {
constexpr EnumName<PlanMethod> kPlanMethods[] = {
    {PlanMethod::ilp, "ilp"}, {PlanMethod::greedy, "greedy"}, {PlanMethod::layer_split, "layer-split"}};
}  // namespace

PlanMethod parse_plan_method(const std::string& s) { return parse_enum(kPlanMethods, s, "placement method"); }
const char* plan_method_name(PlanMethod m) { return enum_name(kPlanMethods, m); }

int64_t Plan::n_gpu_neurons() const {
  int64_t n = 0;
  for (const auto& L : layers) n += static_cast<int64_t>(L.gpu_neurons.size());
  return n;
}

int64_t Plan::n_gpu_experts() const {
  int64_t n = 0;
  for (const auto& L : layers) n += static_cast<int64_t>(L.gpu_experts.size());
  return n;
}

// ---- byte accounting ----------------------------------------------------------------------

ArenaTake arena_cursor(uint64_t& off) {
  return [&off](uint64_t bytes) {
    const uint64_t at = off;
    off += gpu_pad(bytes);
    return at;
  };
}

namespace {

// The bytes a layout takes, each buffer padded as the arena pads it.
template <class LayOut>
uint64_t arena_bytes(const LayOut& lay_out) {
  uint64_t off = 0;
  lay_out(arena_cursor(off));
  return off;
}

}  // namespace

FfnShareLayout lay_out_ffn_share(const PlanLayer& L, int64_t n, const ArenaTake& take) {
  FfnShareLayout s;
  s.n = n;
  const uint64_t k = static_cast<uint64_t>(n);
  s.gate = take(k * L.gate_row);
  s.up = take(k * L.up_row);
  s.down = take(k * L.down_row);
  if (L.bias_row) s.up_b = take(k * L.bias_row);
  s.rows = take(k * sizeof(int32_t));
  return s;
}

uint64_t gpu_ffn_share_bytes(const PlanLayer& L, int64_t n) {
  if (n <= 0) return 0;
  return arena_bytes([&](const ArenaTake& take) { lay_out_ffn_share(L, n, take); });
}

const char* PlanOptions::scratch_name() const { return scratch ? scratch->name() : "cpu"; }

FfnScratch lay_out_ffn_scratch(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) {
  const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
  FfnScratch s;
  s.x = take(b * m.n_embd * f);
  s.out = take(b * m.n_embd * f);
  s.act = take(b * m.n_ff * f);
  s.h = take(b * m.n_ff * f);
  s.active = take(m.n_ff * sizeof(int32_t));
  if (m.predicted) s.px = take(b * m.n_embd * f);
  s.ffn_own = take(0);
  if (opts.scratch) opts.scratch->ffn(m, opts, take);
  return s;
}

uint64_t gpu_ffn_scratch_bytes(const PlanModel& m, const PlanOptions& opts) {
  return arena_bytes([&](const ArenaTake& take) { lay_out_ffn_scratch(m, opts, take); });
}

bool gpu_needs_ffn_scratch(const PlanModel& m, const Plan& plan) {
  for (const auto& P : plan.layers)
    if (!P.gpu_neurons.empty() || (m.predicted && P.attn_gpu)) return true;
  return false;
}

AttnScratch lay_out_attn_scratch(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) {
  AttnScratch s;
  s.attn_own = take(0);
  if (opts.scratch) opts.scratch->attention(m, opts, take);
  return s;
}

uint64_t gpu_attn_scratch_bytes(const PlanModel& m, const PlanOptions& opts) {
  return arena_bytes([&](const ArenaTake& take) { lay_out_attn_scratch(m, opts, take); });
}

bool gpu_needs_attn_scratch(const Plan& plan) {
  if (plan.output_gpu) return true;
  for (const auto& P : plan.layers)
    if (P.attn_gpu) return true;
  return false;
}

ExpertScratch lay_out_expert_scratch(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) {
  const uint64_t f = sizeof(float), slots = static_cast<uint64_t>(opts.max_batch * m.n_expert_used);
  ExpertScratch s;
  s.ex_x = take(slots * m.n_embd * f);
  s.ex_out = take(slots * m.n_embd * f);
  s.experts_own = take(0);
  if (opts.scratch) opts.scratch->experts(m, opts, take);
  return s;
}

uint64_t gpu_expert_scratch_bytes(const PlanModel& m, const PlanOptions& opts) {
  return arena_bytes([&](const ArenaTake& take) { lay_out_expert_scratch(m, opts, take); });
}

bool gpu_needs_expert_scratch(const Plan& plan) {
  for (const auto& P : plan.layers)
    if (!P.gpu_experts.empty()) return true;
  return false;
}

uint64_t gpu_output_bytes(const PlanModel& m, const PlanOptions& opts) {
  return m.output_weights_bytes +
         gpu_pad(static_cast<uint64_t>(opts.max_batch) * static_cast<uint64_t>(m.n_vocab) * sizeof(float));
}

uint64_t gpu_layer_bytes(const PlanLayer& L, bool attn, int64_t n_neurons, int64_t n_experts) {
  uint64_t b = gpu_ffn_share_bytes(L, n_neurons) + static_cast<uint64_t>(n_experts) * L.expert_bytes;
  if (attn) b += L.attn_bytes + L.kv_bytes;
  if (attn || n_neurons > 0) b += L.predictor_bytes;
  return b;
}

uint64_t gpu_ffn_bytes(const PlanModel& m, const PlanOptions& opts, const Plan& plan) {
  EMBER_CHECK(plan.layers.size() == m.layers.size(), "plan has {} layers, the model {}", plan.layers.size(),
              m.layers.size());
  uint64_t total = 0;
  for (size_t l = 0; l < m.layers.size(); ++l)
    total += gpu_ffn_share_bytes(m.layers[l], static_cast<int64_t>(plan.layers[l].gpu_neurons.size()));
  return gpu_needs_ffn_scratch(m, plan) ? total + gpu_ffn_scratch_bytes(m, opts) : 0;
}

uint64_t gpu_bytes(const PlanModel& m, const PlanOptions& opts, const Plan& plan) {
  EMBER_CHECK(plan.layers.size() == m.layers.size(), "plan has {} layers, the model {}", plan.layers.size(),
              m.layers.size());
  uint64_t total = 0;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const auto& P = plan.layers[l];
    total += gpu_layer_bytes(m.layers[l], P.attn_gpu, static_cast<int64_t>(P.gpu_neurons.size()),
                             static_cast<int64_t>(P.gpu_experts.size()));
  }
  if (plan.output_gpu) total += gpu_output_bytes(m, opts);
  if (gpu_needs_ffn_scratch(m, plan)) total += gpu_ffn_scratch_bytes(m, opts);
  if (gpu_needs_attn_scratch(plan)) total += gpu_attn_scratch_bytes(m, opts);
  if (gpu_needs_expert_scratch(plan)) total += gpu_expert_scratch_bytes(m, opts);
  return total;
}

DType hybrid_device_down_type(const FfnWeights& w, int64_t n_embd) {
  if (w.down_t.data) return w.down_t.type;
  return cpu::neuron_major_dtype(w.down.type, cpu::NeuronMajorType::exact, n_embd);
}

}  // namespace ember
