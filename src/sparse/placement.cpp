// What a placement is and puts on the device (sparse/placement.hpp).
#include "sparse/placement.hpp"

#include <algorithm>

#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "model/kv_cache.hpp"
#include "ops/cuda/cuda_blocks.hpp"
#include "ops/cuda/cuda_ops.hpp"

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

uint64_t gpu_ffn_share_bytes(const PlanLayer& L, int64_t n) {
  if (n <= 0) return 0;
  const uint64_t k = static_cast<uint64_t>(n);
  return gpu_pad(k * L.gate_row) + gpu_pad(k * L.up_row) + gpu_pad(k * L.down_row) +
         (L.bias_row ? gpu_pad(k * L.bias_row) : 0) + gpu_pad(k * sizeof(int32_t));
}

uint64_t gpu_ffn_counts_bytes(const PlanModel& m) {
  return sizeof(uint64_t) + static_cast<uint64_t>(m.n_ff) * sizeof(int32_t);
}

uint64_t gpu_ffn_scratch_bytes(const PlanModel& m, const PlanOptions& opts) {
  const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
  // x in, partial out (n_embd each), gate and up activations (n_ff each; the up buffer holds
  // the predictor's scores first), the active neurons' rows (n_ff) and their positions in the
  // share (n_ff, then two counters: active, fired).
  // Then the down axpy's partial sums (cuda::sparse_axpy: kAxpyChunks rows of n_embd), x
  // rounded to 8 bits for the quantized gate and up rows (gpu_q8_bytes), and the firing counts
  // per position (gpu_ffn_counts_bytes).
  uint64_t t = 2 * gpu_pad(b * m.n_embd * f) + 2 * gpu_pad(b * m.n_ff * f) + gpu_pad(m.n_ff * sizeof(int32_t)) +
               gpu_pad((m.n_ff + 2) * sizeof(int32_t)) +
               gpu_pad(static_cast<uint64_t>(cuda::kAxpyChunks) * m.n_embd * f) +
               gpu_pad(gpu_q8_bytes(m.n_embd, opts.max_batch)) + gpu_pad(gpu_ffn_counts_bytes(m));
  // With predictors: their input (n_embd: the residual, where it is not the FFN input), hidden
  // layer (rank), the prediction of the layer's neurons per token (max_batch x n_ff bytes) and
  // the predicted share rows (n_ff, then their count and a spare: cuda::compact's totals), then
  // the input and the hidden layer rounded to 8 bits.
  if (m.predicted)
    t += gpu_pad(b * m.n_embd * f) + gpu_pad(b * static_cast<uint64_t>(m.predictor_rank) * f) + gpu_pad(b * m.n_ff) +
         gpu_pad((m.n_ff + 2) * sizeof(int32_t)) + gpu_pad(gpu_q8_bytes(m.n_embd, opts.max_batch)) +
         gpu_pad(gpu_q8_bytes(m.predictor_rank, opts.max_batch));
  return t;
}

bool gpu_needs_ffn_scratch(const PlanModel& m, const Plan& plan) {
  for (const auto& P : plan.layers)
    if (!P.gpu_neurons.empty() || (m.predicted && P.attn_gpu)) return true;
  return false;
}

uint64_t gpu_attn_scratch_bytes(const PlanModel& m, const PlanOptions& opts) {
  const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
  // The hidden state, the norm's output and the block's output; q, k, v, the attention's
  // output, the scores of every head over the context; the RoPE tables (global, local) of
  // head_dim / 2 inverse frequencies (doubles) each. device_arena_layout lays them out in this order.
  // Then the block's inputs rounded to 8 bits for quantized matrices (n_embd or q_dim values),
  // the attention's partial results over chunks of the context (cuda_blocks.hpp), and the
  // positions of the rows' sequences (max_batch int32, read by the kernels on the device).
  const uint64_t rope = gpu_pad(static_cast<uint64_t>(m.q_dim / m.n_head / 2) * sizeof(double));
  const uint64_t partial = static_cast<uint64_t>(
      cuda::attention_partial_floats(opts.max_batch, m.n_head, m.q_dim / m.n_head, m.n_ctx));
  return 3 * gpu_pad(b * m.n_embd * f) + gpu_pad(b * m.q_dim * f) + 2 * gpu_pad(b * m.kv_dim * f) +
         gpu_pad(b * m.q_dim * f) + gpu_pad(b * m.n_head * m.n_ctx * f) + 2 * rope +
         gpu_pad(gpu_q8_bytes(std::max(m.n_embd, m.q_dim), opts.max_batch)) + gpu_pad(partial * f) +
         gpu_pad(b * sizeof(int32_t));
}

bool gpu_needs_attn_scratch(const Plan& plan) {
  if (plan.output_gpu) return true;
  for (const auto& P : plan.layers)
    if (P.attn_gpu) return true;
  return false;
}

uint64_t gpu_expert_scratch_bytes(const PlanModel& m, const PlanOptions& opts) {
  const uint64_t f = sizeof(float), slots = static_cast<uint64_t>(opts.max_batch * m.n_expert_used);
  const auto n_slots = static_cast<int64_t>(slots);
  return gpu_pad(slots * m.n_embd * f) + gpu_pad(gpu_q8_bytes(m.n_embd, n_slots)) +
         gpu_pad(slots * static_cast<uint64_t>(m.n_ff_expert) * f) + gpu_pad(gpu_q8_bytes(m.n_ff_expert, n_slots)) +
         gpu_pad(slots * m.n_embd * f);
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
