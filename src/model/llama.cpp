#include "model/llama.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "model/ffn.hpp"
#include "model/forward.hpp"
#include "model/loader.hpp"
#include "ops/cpu/attention.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/norm.hpp"
#include "ops/cpu/vec.hpp"

namespace ember {

void load_llama(Model& m) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  // Bamboo (PowerInfer's arch "bamboo", keys bamboo.*) is a llama with ReLU on both gate and up.
  hp.arch = r.opt_string("general.architecture").value_or("llama") == "bamboo" ? "bamboo" : "llama";
  const bool bamboo = hp.arch == "bamboo";
  read_common_hparams(r, hp);
  // PowerInfer runs every llama in a PWRI file with ReLU (its sparse FFN knows no other
  // activation: ReluLLaMA, ProSparse), and a plain GGUF llama with SiLU; Ember's own key
  // llama.ffn_activation, when present, says which.
  hp.act = bamboo || r.is_powerinfer() ? cpu::Activation::relu : cpu::Activation::silu;
  if (auto act = r.opt_string(hp.arch + ".ffn_activation")) {
    if (*act == "relu") hp.act = cpu::Activation::relu;
    else if (*act == "silu" && !bamboo) hp.act = cpu::Activation::silu;
    else fail("{}: {}.ffn_activation '{}' is not supported ({})", r.path(), hp.arch, *act, bamboo ? "relu" : "silu or relu");
  }
  hp.rope.layout = cpu::RopeLayout::normal;  // llama GGUF files store Q/K permuted for it

  TensorBinder b(r, hp);
  bind_embeddings(b, m);
  m.layers.resize(hp.n_layer);
  const int64_t d = hp.n_embd, nq = hp.n_head * hp.head_dim, nkv = hp.n_head_kv * hp.head_dim;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = m.layers[il];
    auto name = [&](const char* t) { return fmt::format("blk.{}.{}.weight", il, t); };
    L.attn_norm = b.norm(name("attn_norm"), d);
    L.wq = b.matrix(name("attn_q"), d, nq);
    L.wk = b.matrix(name("attn_k"), d, nkv);
    L.wv = b.matrix(name("attn_v"), d, nkv);
    L.wo = b.matrix(name("attn_output"), nq, d);
    L.ffn.norm = b.norm(name("ffn_norm"), d);
    L.ffn.gate = b.matrix(name("ffn_gate"), d, hp.n_ff);
    L.ffn.up = b.matrix(name("ffn_up"), d, hp.n_ff);
    L.ffn.gating = bamboo ? FfnGating::sym : FfnGating::par;
    bind_ffn_down_and_predictor(b, hp, il, L.ffn);
  }
  read_sparse_metadata(m);
  build_rope(m);
}

void llama_forward(const Model& m, ThreadPool& pool, KvCache& kv, Workspace& ws, const int32_t* tokens, int64_t n,
                   int64_t pos0, float* logits, bool logits_all) {
  const Hparams& hp = m.hp;
  const int64_t d = hp.n_embd, hd = hp.head_dim, nq = hp.n_head * hd, nkv = hp.n_head_kv * hd;
  const int64_t n_rot = hp.rope.n_rot;
  float* x = ws.x.data();
  float* xn = ws.xn.data();
  float* cs = ws.cos_sin.data();
  void* mm = ws.mm_scratch.data();

  cpu::get_rows(m.tok_embd, tokens, n, x);
  for (int64_t t = 0; t < n; ++t) m.rope->angles(pos0 + t, cs + t * n_rot);

  cpu::AttentionShape shape;
  shape.n_head = hp.n_head;
  shape.n_head_kv = hp.n_head_kv;
  shape.head_dim = hd;
  shape.scale = 1.0f / std::sqrt(static_cast<float>(hd));

  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& L = m.layers[il];
    cpu::rms_norm(x, as_floats(L.attn_norm), xn, n, d, hp.norm_eps);
    qkv_projections(pool, L, xn, n, ws);
    for (int64_t t = 0; t < n; ++t) {
      m.rope->apply(ws.q.data() + t * nq, hp.n_head, hd, cs + t * n_rot);
      m.rope->apply(ws.k.data() + t * nkv, hp.n_head_kv, hd, cs + t * n_rot);
    }
    cache_and_attend(pool, shape, kv, ws, il, n, pos0);
    cpu::matmul(pool, L.wo, ws.attn.data(), n, ws.o.data(), mm);
    cpu::add_f32(ws.o.data(), x, n * d);

    cpu::rms_norm(x, as_floats(L.ffn.norm), xn, n, d, hp.norm_eps);
    ws.ffn_residual = x;
    if (ws.ffn) ws.ffn->run(pool, il, L.ffn, hp.act, xn, n, ws.o.data(), ws);
    else dense_ffn(pool, L.ffn, hp.act, xn, n, ws.o.data(), ws);
    cpu::add_f32(ws.o.data(), x, n * d);
  }

  const int64_t first = logits_all ? 0 : n - 1;
  const int64_t n_out = n - first;
  cpu::rms_norm(x + first * d, as_floats(m.output_norm), xn, n_out, d, hp.norm_eps);
  cpu::matmul(pool, m.output, xn, n_out, logits, mm);
}

}  // namespace ember
