#include "model/forward.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "model/gemma3.hpp"
#include "model/llama.hpp"
#include "ops/cpu/matmul.hpp"

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
  gate.resize(batch * hp.n_ff);
  up.resize(batch * hp.n_ff);
  cos_sin.resize(2 * batch * std::max<int64_t>(hp.rope.n_rot, 2));  // global + local RoPE (gemma3)
  att_scratch.resize(static_cast<size_t>(n_threads) * ctx);
  size_t mm = 0;
  auto need = [&](const TensorView& t) {
    if (t.valid()) mm = std::max(mm, cpu::matmul_scratch_bytes(t.type, t.cols(), batch));
  };
  need(model.output);
  for (const auto& l : model.layers)
    for (const TensorView* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn.gate, &l.ffn.up, &l.ffn.down}) need(*t);
  mm_scratch.resize(std::max<size_t>(mm, 64));
}

size_t Workspace::bytes() const {
  size_t floats = x.size() + xn.size() + q.size() + k.size() + v.size() + attn.size() + o.size() + gate.size() +
                  up.size() + cos_sin.size() + att_scratch.size() + logits_tmp.size();
  return floats * sizeof(float) + mm_scratch.size();
}

void qkv_projections(ThreadPool& pool, const LayerWeights& L, const float* xn, int64_t n, Workspace& ws) {
  void* mm = ws.mm_scratch.data();
  if (L.wq.type == L.wk.type && L.wq.type == L.wv.type) {
    const cpu::MatmulOut outs[] = {{L.wq, ws.q.data()}, {L.wk, ws.k.data()}, {L.wv, ws.v.data()}};
    cpu::matmul_multi(pool, outs, xn, n, mm);
    return;
  }
  cpu::matmul(pool, L.wq, xn, n, ws.q.data(), mm);
  cpu::matmul(pool, L.wk, xn, n, ws.k.data(), mm);
  cpu::matmul(pool, L.wv, xn, n, ws.v.data(), mm);
}

void forward(const Model& model, ThreadPool& pool, KvCache& kv, Workspace& ws, const int32_t* tokens, int64_t n,
             int64_t pos0, float* logits, bool logits_all) {
  EMBER_CHECK(n >= 1 && n <= ws.max_batch, "forward: batch of {} tokens (1 to {} allowed)", n, ws.max_batch);
  EMBER_CHECK(pos0 >= 0 && pos0 + n <= kv.n_ctx,
              "context is full: {} tokens would exceed the context size of {}; use a larger -c", pos0 + n,
              kv.n_ctx);
  for (int64_t t = 0; t < n; ++t)
    EMBER_CHECK(tokens[t] >= 0 && tokens[t] < model.hp.n_vocab, "token id {} is out of range (vocabulary has {})",
                tokens[t], model.hp.n_vocab);
  if (model.hp.arch == "llama") {
    llama_forward(model, pool, kv, ws, tokens, n, pos0, logits, logits_all);
  } else if (model.hp.arch == "gemma3") {
    gemma3_forward(model, pool, kv, ws, tokens, n, pos0, logits, logits_all);
  } else {
    fail("no forward pass for architecture '{}'", model.hp.arch);
  }
}

}  // namespace ember
