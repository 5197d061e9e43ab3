#include "model/workspace.hpp"

#include <algorithm>

#include "model/moe.hpp"
#include "ops/cpu/attention/attention.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/sparse/sparse.hpp"

namespace ember {

void Workspace::init(const Model& model, int64_t batch, int64_t ctx, int n_threads) {
  const Hparams& hp = model.hp;
  max_batch = batch;
  n_ctx = ctx;
  const int64_t nq = hp.n_head * hp.head_dim, nkv = hp.n_head_kv * hp.head_dim;
  const int64_t wide = std::max({hp.n_embd, nq, hp.n_ff});
  x.resize(batch * hp.n_embd);
  xn.resize(batch * wide);
  q.resize(batch * nq);
  k.resize(batch * nkv);
  v.resize(batch * nkv);
  attn.resize(batch * nq);
  o.resize(batch * hp.n_embd);
  if (hp.parallel_residual) ffn_in.resize(batch * hp.n_embd);
  gate.resize(batch * hp.n_ff);
  up.resize(batch * hp.n_ff);
  cos_sin.resize(2 * batch * std::max<int64_t>(hp.rope.n_rot, 2));  // global + local RoPE (gemma3)
  att_scratch.resize(cpu::attention_scratch_floats(ctx, hp.n_head, hp.head_dim, n_threads));
  size_t mm = 0;
  auto need = [&](const TensorView& t) {
    if (t.valid()) mm = std::max(mm, cpu::matmul_scratch_bytes(t.type, t.cols(), batch));
  };
  need(model.output);
  for (const auto& l : model.layers) {
    for (const TensorView* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn.gate, &l.ffn.up, &l.ffn.down}) need(*t);
    need(l.moe.router);
    for (const FfnWeights& e : l.moe.experts)
      for (const TensorView* t : {&e.gate, &e.up, &e.down}) need(*t);
  }
  mm_scratch.resize(std::max<size_t>(mm, 64));
  int64_t n_expert = 0, n_used = 0;
  for (const auto& l : model.layers) n_expert = std::max(n_expert, l.moe.n_expert()), n_used = std::max(n_used, l.moe.n_used);
  if (n_expert > 0) {
    const auto b = static_cast<size_t>(batch), d = static_cast<size_t>(hp.n_embd);
    moe_logits.resize(b * static_cast<size_t>(n_expert));
    moe_ids.resize(b * static_cast<size_t>(n_used));
    moe_weights.resize(b * static_cast<size_t>(n_used));
    moe_order.resize(static_cast<size_t>(n_expert) + 1);  // moe_route's scratch; moe_expert_rows' offsets
    moe_tokens.resize(b * static_cast<size_t>(n_used));
    moe_token_w.resize(b * static_cast<size_t>(n_used));
    moe_first.resize(static_cast<size_t>(n_expert) + 1);
    moe_active.resize(static_cast<size_t>(n_expert));
    moe_x.resize(b * d);
    moe_out.resize(b * d);
    int64_t n_ff = 0;
    size_t each = 0, slot_x = 0, slot_h = 0;
    const int64_t slots = batch * n_used;
    for (const auto& l : model.layers)
      for (const FfnWeights& e : l.moe.experts) {
        n_ff = std::max(n_ff, e.n_ff());
        if (e.gate.valid())
          slot_x = std::max(slot_x, cpu::prepared_row_bytes(e.gate.type, e.gate.cols()) * static_cast<size_t>(slots));
        if (e.down.valid()) {
          each = std::max(each, cpu::matmul_each_scratch_bytes(e.down.type, e.down.cols(), static_cast<size_t>(n_used)));
          slot_h = std::max(slot_h, cpu::matmul_scratch_bytes(e.down.type, e.down.cols(), slots));
        }
      }
    const auto used = static_cast<size_t>(n_used);
    moe_values.resize(static_cast<size_t>(std::max<int64_t>(slots, n_used) * n_ff));
    moe_slot_x.resize(slot_x + 64);
    moe_slot_h.resize(slot_h + 64);
    moe_tile.resize(static_cast<size_t>(n_threads * cpu::kMatmulTokenBlock * kMoeBlockMax));
    moe_up.resize(used * static_cast<size_t>(n_ff));
    moe_each_out.resize(used * d);
    moe_each_scratch.resize(each);
  }
  bool down_t_only = false;
  for (const auto& l : model.layers) down_t_only |= !l.ffn.down.valid() && !l.moe.valid();
  if (down_t_only) {
    all_neurons.resize(static_cast<size_t>(hp.n_ff));
    for (int64_t j = 0; j < hp.n_ff; ++j) all_neurons[static_cast<size_t>(j)] = static_cast<int32_t>(j);
    axpy_scratch.resize(cpu::sparse_axpy_scratch_floats(hp.n_embd, batch, n_threads, cpu::AxpySplit::columns));
  }
}

size_t Workspace::bytes() const {
  size_t floats = x.size() + xn.size() + q.size() + k.size() + v.size() + attn.size() + o.size() + gate.size() +
                  up.size() + cos_sin.size() + att_scratch.size() + logits_tmp.size() + ffn_in.size();
  floats += moe_logits.size() + moe_weights.size() + moe_token_w.size() + moe_x.size() + moe_out.size() +
            moe_values.size() + moe_up.size() + moe_each_out.size();
  floats += moe_tile.size();
  const size_t ints = all_neurons.size() + moe_ids.size() + moe_order.size() + moe_tokens.size() + moe_first.size() +
                      moe_active.size();
  return (floats + axpy_scratch.size()) * sizeof(float) + mm_scratch.size() + moe_each_scratch.size() +
         moe_slot_x.size() + moe_slot_h.size() +
         ints * sizeof(int32_t);
}

}  // namespace ember
