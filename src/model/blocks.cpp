#include "model/blocks.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "model/ffn.hpp"
#include "model/loader.hpp"
#include "model/moe.hpp"
#include "ops/cpu/attention/attention.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/norm.hpp"
#include "ops/cpu/vec.hpp"

namespace ember {

void apply_norm(const Model& m, const TensorView& w, const TensorView& b, const float* x, float* out, int64_t n) {
  const Hparams& hp = m.hp;
  if (hp.norm == NormKind::layer)
    cpu::layer_norm(x, as_floats(w), as_floats(b), out, n, hp.n_embd, hp.norm_eps);
  else
    cpu::rms_norm(x, as_floats(w), out, n, hp.n_embd, hp.norm_eps);
}

namespace {

// An optional RMSNorm over the whole row (Gemma's post-norms), in place.
void post_norm(const Model& m, const TensorView& w, float* y, int64_t n) {
  if (w.valid()) cpu::rms_norm(y, as_floats(w), y, n, m.hp.n_embd, m.hp.norm_eps);
}

void add_bias(const TensorView& b, float* y, int64_t n, int64_t width) {
  if (!b.valid()) return;
  for (int64_t t = 0; t < n; ++t) cpu::add_f32(as_floats(b), y + t * width, width);
}

// Appends each sequence's keys and values (its rows of ws.k, ws.v) to its cache's layer at its
// positions and runs causal attention of its rows of ws.q over that cache into ws.attn.
void cache_and_attend(ThreadPool& pool, const cpu::AttentionShape& shape, std::span<const SeqSpan> seqs,
                      int64_t kv_layer, Workspace& ws) {
  const int64_t nkv = shape.n_head_kv * shape.head_dim, nq = shape.n_head * shape.head_dim;
  for (const SeqSpan& sq : seqs) {
    KvCache& kv = *sq.kv;
    uint8_t* kc = kv.k_layer(kv_layer);
    uint8_t* vc = kv.v_layer(kv_layer);
    const size_t at = static_cast<size_t>(sq.pos0 * nkv) * kv.value_bytes();
    const float* k = ws.k.data() + sq.first * nkv;
    const float* v = ws.v.data() + sq.first * nkv;
    if (kv.type == DType::F16) {
      cpu::to_f16(k, reinterpret_cast<uint16_t*>(kc + at), sq.n * nkv);
      cpu::to_f16(v, reinterpret_cast<uint16_t*>(vc + at), sq.n * nkv);
    } else {
      std::memcpy(kc + at, k, sizeof(float) * static_cast<size_t>(sq.n * nkv));
      std::memcpy(vc + at, v, sizeof(float) * static_cast<size_t>(sq.n * nkv));
    }
    cpu::AttentionShape s = shape;
    s.kv_f16 = kv.type == DType::F16;
    cpu::attention(pool, s, ws.q.data() + sq.first * nq, sq.n, sq.pos0, kc, vc, nkv, ws.attn.data() + sq.first * nq,
                   ws.att_scratch.data());
  }
}

// The RoPE angles of every row's position (each sequence's pos0 ..) for the global table (and the
// local one, right after them), computed once per batch into ws.cos_sin and reused by every
// layer (the angles depend only on the position).
const float* rope_angles(const Model& m, Workspace& ws, bool local, std::span<const SeqSpan> seqs, int64_t n) {
  const cpu::RopeTable& global = m.rope_for_context(ws.n_ctx);
  const int64_t n_rot = global.config().n_rot;
  float* cs = ws.cos_sin.data();
  bool same = static_cast<int64_t>(ws.angles_pos.size()) == n;
  for (const SeqSpan& sq : seqs)
    for (int64_t t = 0; t < sq.n && same; ++t) same = ws.angles_pos[static_cast<size_t>(sq.first + t)] == sq.pos0 + t;
  if (!same) {
    ws.angles_pos.assign(static_cast<size_t>(n), 0);
    for (const SeqSpan& sq : seqs)
      for (int64_t t = 0; t < sq.n; ++t) {
        const int64_t row = sq.first + t, pos = sq.pos0 + t;
        ws.angles_pos[static_cast<size_t>(row)] = pos;
        global.angles(pos, cs + row * n_rot);
        if (m.rope_local) m.rope_local->angles(pos, cs + (n + row) * n_rot);
      }
  }
  return local ? cs + n * n_rot : cs;
}

}  // namespace

AttentionRules attention_rules(const Model& m, int64_t il, int64_t n_ctx) {
  const Hparams& hp = m.hp;
  AttentionRules r;
  const bool local = !hp.swa_layers.empty() && hp.swa_layers[static_cast<size_t>(il)];
  // Sliding-window layers take the local RoPE table where the model has one (gemma3).
  r.local_rope = local && m.rope_local;
  r.rope = r.local_rope ? m.rope_local.get() : m.rope ? &m.rope_for_context(n_ctx) : nullptr;
  r.window = local ? hp.sliding_window : 0;
  r.scale = hp.attn_scale != 0.0f ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
  return r;
}

void dense_qkv(ThreadPool& pool, const LayerWeights& L, const float* xn, int64_t n, Workspace& ws) {
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

void dense_out(ThreadPool& pool, const LayerWeights& L, const float* attn, int64_t n, float* o, Workspace& ws) {
  cpu::matmul(pool, L.wo, attn, n, o, ws.mm_scratch.data());
}

void embed_block(const Model& m, const int32_t* tokens, int64_t n, int64_t pos0, float* x, float* scratch) {
  const Hparams& hp = m.hp;
  const int64_t d = hp.n_embd;
  cpu::get_rows(m.tok_embd, tokens, n, x);
  if (hp.embd_scale != 0.0f) cpu::scale_f32(hp.embd_scale, x, n * d);
  if (m.pos_embd.valid()) {  // learned positions (OPT): rows pos + pos_offset
    EMBER_CHECK(pos0 + n + hp.pos_offset <= m.pos_embd.rows(),
                "{}: position {} is beyond the model's {} learned positions; use a context of at most {}", hp.arch,
                pos0 + n - 1, m.pos_embd.rows() - hp.pos_offset, m.pos_embd.rows() - hp.pos_offset);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = static_cast<int32_t>(pos0 + t + hp.pos_offset);
      cpu::get_rows(m.pos_embd, &id, 1, scratch + t * d);
    }
    cpu::add_f32(scratch, x, n * d);
  }
}

void attention_heads(const Model& m, const LayerWeights& L, int64_t il, ThreadPool& pool, std::span<const SeqSpan> seqs,
                     int64_t kv_layer, Workspace& ws, const float* x, int64_t n) {
  const Hparams& hp = m.hp;
  const int64_t d = hp.n_embd, hd = hp.head_dim, nq = hp.n_head * hd, nkv = hp.n_head_kv * hd;
  float* xn = ws.xn.data();
  apply_norm(m, L.attn_norm, L.attn_norm_b, x, xn, n);
  if (hp.parallel_residual) {  // the FFN reads the layer's input: its norm now, before x changes
    if (L.ffn.norm.valid())
      apply_norm(m, L.ffn.norm, L.ffn.norm_b, x, ws.ffn_in.data(), n);
    else
      std::memcpy(ws.ffn_in.data(), xn, sizeof(float) * static_cast<size_t>(n * d));
  }
  if (ws.proj)
    ws.proj->qkv(pool, il, L, xn, n, ws);
  else
    dense_qkv(pool, L, xn, n, ws);
  add_bias(L.bq, ws.q.data(), n, nq);
  add_bias(L.bk, ws.k.data(), n, nkv);
  add_bias(L.bv, ws.v.data(), n, nkv);
  if (L.q_norm.valid()) cpu::rms_norm(ws.q.data(), as_floats(L.q_norm), ws.q.data(), n * hp.n_head, hd, hp.norm_eps);
  if (L.k_norm.valid())
    cpu::rms_norm(ws.k.data(), as_floats(L.k_norm), ws.k.data(), n * hp.n_head_kv, hd, hp.norm_eps);
  const AttentionRules rules = attention_rules(m, il, ws.n_ctx);
  if (rules.rope) {  // none: OPT's positions are learned
    const float* cs = rope_angles(m, ws, rules.local_rope, seqs, n);
    const int64_t n_rot = rules.rope->config().n_rot;
    for (int64_t t = 0; t < n; ++t) {
      rules.rope->apply(ws.q.data() + t * nq, hp.n_head, hd, cs + t * n_rot);
      rules.rope->apply(ws.k.data() + t * nkv, hp.n_head_kv, hd, cs + t * n_rot);
    }
  }
  cpu::AttentionShape shape;
  shape.n_head = hp.n_head;
  shape.n_head_kv = hp.n_head_kv;
  shape.head_dim = hd;
  shape.scale = rules.scale;
  shape.window = rules.window;
  cache_and_attend(pool, shape, seqs, kv_layer, ws);
}

void attention_output(const Model& m, const LayerWeights& L, int64_t il, ThreadPool& pool, Workspace& ws, float* x,
                      int64_t n) {
  const int64_t d = m.hp.n_embd;
  float* o = ws.o.data();
  if (ws.proj)
    ws.proj->out(pool, il, L, ws.attn.data(), n, o, ws);
  else
    dense_out(pool, L, ws.attn.data(), n, o, ws);
  add_bias(L.bo, o, n, d);
  post_norm(m, L.attn_post_norm, o, n);
  cpu::add_f32(o, x, n * d);
}

void attention_block(const Model& m, const LayerWeights& L, int64_t il, ThreadPool& pool, std::span<const SeqSpan> seqs,
                     int64_t kv_layer, Workspace& ws, float* x, int64_t n) {
  attention_heads(m, L, il, pool, seqs, kv_layer, ws, x, n);
  attention_output(m, L, il, pool, ws, x, n);
}

void ffn_block_input(const Model& m, const LayerWeights& L, const Workspace& ws, const float* x, float* xn,
                     int64_t n) {
  if (m.hp.parallel_residual)
    std::memcpy(xn, ws.ffn_in.data(), sizeof(float) * static_cast<size_t>(n * m.hp.n_embd));
  else
    apply_norm(m, L.ffn.norm, L.ffn.norm_b, x, xn, n);
}

void ffn_block_output(const Model& m, const LayerWeights& L, float* out, float* x, int64_t n) {
  post_norm(m, L.ffn_post_norm, out, n);
  cpu::add_f32(out, x, n * m.hp.n_embd);
}

void ffn_block(const Model& m, const LayerWeights& L, int64_t il, ThreadPool& pool, Workspace& ws, int64_t n) {
  float* x = ws.x.data();
  float* xn = ws.xn.data();
  float* out = ws.o.data();
  ffn_block_input(m, L, ws, x, xn, n);
  ws.ffn_residual = x;
  if (L.moe.valid() && ws.ffn) ws.ffn->run_moe(pool, il, L.moe, m.hp.act, xn, n, out, ws);
  else if (L.moe.valid()) moe_ffn(pool, L.moe, m.hp.act, xn, n, out, ws);
  else if (ws.ffn) ws.ffn->run(pool, il, L.ffn, m.hp.act, xn, n, out, ws);
  else dense_ffn(pool, L.ffn, m.hp.act, xn, n, out, ws);
  ffn_block_output(m, L, out, x, n);
}

void cpu_layer(const Model& m, int64_t il, ThreadPool& pool, std::span<const SeqSpan> seqs, Workspace& ws, int64_t n) {
  const LayerWeights& L = m.layers[static_cast<size_t>(il)];
  attention_block(m, L, il, pool, seqs, il, ws, ws.x.data(), n);
  ffn_block(m, L, il, pool, ws, n);
}

OutputWeights output_weights(const Model& m) { return {m.output_norm, m.output_norm_b, m.output}; }

void output_block(const Model& m, const OutputWeights& w, ThreadPool& pool, Workspace& ws, const float* x, int64_t n,
                  float* logits) {
  const Hparams& hp = m.hp;
  apply_norm(m, w.norm, w.norm_b, x, ws.xn.data(), n);
  cpu::matmul(pool, w.output, ws.xn.data(), n, logits, ws.mm_scratch.data());
  if (hp.final_softcap > 0) {
    const float c = hp.final_softcap;
    for (int64_t i = 0; i < n * hp.n_vocab; ++i) logits[i] = c * std::tanh(logits[i] / c);
  }
}

void output_rows(const Model& m, ThreadPool& pool, Workspace& ws, const int64_t* rows, int64_t n_rows, float* logits) {
  if (!rows) return output_block(m, output_weights(m), pool, ws, ws.x.data(), n_rows, logits);
  const int64_t d = m.hp.n_embd;
  float* gathered = ws.o.data();  // free after the last layer
  for (int64_t i = 0; i < n_rows; ++i)
    std::memcpy(gathered + i * d, ws.x.data() + rows[i] * d, sizeof(float) * static_cast<size_t>(d));
  output_block(m, output_weights(m), pool, ws, gathered, n_rows, logits);
}

void hidden_rows(const Model& m, const Workspace& ws, std::span<const HiddenRows> rows) {
  const OutputWeights w = output_weights(m);
  for (const HiddenRows& h : rows) apply_norm(m, w.norm, w.norm_b, ws.x.data() + h.first * m.hp.n_embd, h.out, h.n);
}

void embed_seqs(const Model& m, const int32_t* tokens, std::span<const SeqSpan> seqs, float* x, float* scratch) {
  const int64_t d = m.hp.n_embd;
  for (const SeqSpan& sq : seqs) embed_block(m, tokens + sq.first, sq.n, sq.pos0, x + sq.first * d, scratch);
}

}  // namespace ember
