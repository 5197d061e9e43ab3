// The scratch CUDA's kernels keep in its arena (sparse/placement.hpp's DeviceScratch), known in
// every build (a plan for a CUDA device is made and checked anywhere).
#include "device/cuda/cuda_scratch.hpp"

#include <algorithm>

#include "ops/cuda/cuda_blocks.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace ember {
namespace {

// Beside the common buffers of each side: the FFN's share positions (n_ff, then two counters:
// active, fired), the down axpy's partial sums (cuda::sparse_axpy: kAxpyChunks rows of n_embd),
// the input in 8 bits, the firing counts (gpu_ffn_counts_bytes); with predictors their hidden
// layer (rank), the prediction per token (max_batch x n_ff bytes), the predicted share rows (n_ff,
// then their count and a spare: cuda::compact's totals), the input and the hidden layer in 8
// bits. The attention side: the hidden state, the norm's output, the block's output (n_embd floats
// each), q, k, v, the attention's output, the scores ([max_batch][n_head][n_ctx]), the RoPE
// tables' inverse frequencies (head_dim / 2 doubles, global then local), the block's inputs in 8
// bits (n_embd or q_dim values), the attention's partial results over chunks of the context
// (cuda_blocks.hpp), and the positions of the rows' sequences (max_batch int32). The experts'
// side: the slots' inputs and neuron values (n_ff_expert floats) in 8 bits, and those values.
class CudaScratch final : public DeviceScratch {
 public:
  const char* name() const override { return "cuda"; }

  FfnScratch ffn(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) const override {
    const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
    FfnScratch s = common_ffn_scratch(m, opts, take);
    s.pos = take((m.n_ff + 2) * sizeof(int32_t));
    s.partial = take(static_cast<uint64_t>(cuda::kAxpyChunks) * m.n_embd * f);
    s.xq = take(gpu_q8_bytes(m.n_embd, opts.max_batch));
    s.counts = take(gpu_ffn_counts_bytes(m));
    if (m.predicted) {
      s.hid = take(b * static_cast<uint64_t>(m.predictor_rank) * f);
      s.mask = take(b * static_cast<uint64_t>(m.n_ff));
      s.cand = take((m.n_ff + 2) * sizeof(int32_t));
      s.pxq = take(gpu_q8_bytes(m.n_embd, opts.max_batch));
      s.hidq = take(gpu_q8_bytes(m.predictor_rank, opts.max_batch));
    }
    return s;
  }

  AttnScratch attention(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) const override {
    const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
    const uint64_t rope = static_cast<uint64_t>(m.q_dim / m.n_head / 2) * sizeof(double);
    AttnScratch s;
    s.x_hidden = take(b * m.n_embd * f);
    s.xn = take(b * m.n_embd * f);
    s.o = take(b * m.n_embd * f);
    s.q = take(b * m.q_dim * f);
    s.k = take(b * m.kv_dim * f);
    s.v = take(b * m.kv_dim * f);
    s.att = take(b * m.q_dim * f);
    s.scores = take(b * m.n_head * m.n_ctx * f);
    s.rope = take(rope);
    s.rope_local = take(rope);
    s.aq = take(gpu_q8_bytes(std::max(m.n_embd, m.q_dim), opts.max_batch));
    s.attn_partial = take(
        static_cast<uint64_t>(cuda::attention_partial_floats(opts.max_batch, m.n_head, m.q_dim / m.n_head, m.n_ctx)) * f);
    s.positions = take(b * sizeof(int32_t));
    return s;
  }

  ExpertScratch experts(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) const override {
    const uint64_t f = sizeof(float), slots = static_cast<uint64_t>(opts.max_batch * m.n_expert_used);
    const auto n_slots = static_cast<int64_t>(slots);
    ExpertScratch s = common_expert_scratch(m, opts, take);
    s.ex_xq = take(gpu_q8_bytes(m.n_embd, n_slots));
    s.ex_h = take(slots * static_cast<uint64_t>(m.n_ff_expert) * f);
    s.ex_hq = take(gpu_q8_bytes(m.n_ff_expert, n_slots));
    return s;
  }
};

}  // namespace

uint64_t gpu_ffn_counts_bytes(const PlanModel& m) {
  return sizeof(uint64_t) + static_cast<uint64_t>(m.n_ff) * sizeof(int32_t);
}

const DeviceScratch& cuda_scratch() {
  static const CudaScratch s;
  return s;
}

}  // namespace ember
