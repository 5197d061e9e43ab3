#include "device/cuda/cuda_scratch.hpp"

#include <algorithm>

#include "ops/cuda/cuda_blocks.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace ember {
namespace {

CudaScratchLayout::Ffn ffn_buffers(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) {
  const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
  CudaScratchLayout::Ffn s;
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

CudaScratchLayout::Attention attention_buffers(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) {
  const uint64_t b = static_cast<uint64_t>(opts.max_batch), f = sizeof(float);
  const uint64_t rope = static_cast<uint64_t>(m.q_dim / m.n_head / 2) * sizeof(double);
  CudaScratchLayout::Attention s;
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

CudaScratchLayout::Experts expert_buffers(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) {
  const uint64_t f = sizeof(float), slots = static_cast<uint64_t>(opts.max_batch * m.n_expert_used);
  const auto n_slots = static_cast<int64_t>(slots);
  CudaScratchLayout::Experts s;
  s.ex_xq = take(gpu_q8_bytes(m.n_embd, n_slots));
  s.ex_h = take(slots * static_cast<uint64_t>(m.n_ff_expert) * f);
  s.ex_hq = take(gpu_q8_bytes(m.n_ff_expert, n_slots));
  return s;
}

class CudaScratch final : public DeviceScratch {
 public:
  const char* name() const override { return "cuda"; }
  void ffn(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) const override {
    ffn_buffers(m, opts, take);
  }
  void attention(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) const override {
    attention_buffers(m, opts, take);
  }
  void experts(const PlanModel& m, const PlanOptions& opts, const ArenaTake& take) const override {
    expert_buffers(m, opts, take);
  }
};

}  // namespace

uint64_t gpu_ffn_counts_bytes(const PlanModel& m) {
  return sizeof(uint64_t) + static_cast<uint64_t>(m.n_ff) * sizeof(int32_t);
}

CudaScratchLayout cuda_scratch_layout(const DeviceArenaLayout& a, const PlanModel& m, const PlanOptions& opts,
                                      const Plan& plan) {
  CudaScratchLayout s;
  uint64_t off = a.ffn_own;
  if (gpu_needs_ffn_scratch(m, plan)) s.ffn = ffn_buffers(m, opts, arena_cursor(off));
  off = a.attn_own;
  if (gpu_needs_attn_scratch(plan)) s.attn = attention_buffers(m, opts, arena_cursor(off));
  off = a.experts_own;
  if (gpu_needs_expert_scratch(plan)) s.ex = expert_buffers(m, opts, arena_cursor(off));
  return s;
}

const DeviceScratch& cuda_scratch() {
  static const CudaScratch s;
  return s;
}

}  // namespace ember
