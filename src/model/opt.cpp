#include "model/opt.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "model/ffn.hpp"
#include "model/loader.hpp"
#include "ops/cpu/attention.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/norm.hpp"
#include "ops/cpu/vec.hpp"

namespace ember {
namespace {

void add_bias(const TensorView& b, float* y, int64_t n, int64_t width) {
  if (!b.valid()) return;
  for (int64_t t = 0; t < n; ++t) cpu::add_f32(as_floats(b), y + t * width, width);
}

}  // namespace

void load_opt(Model& m) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  hp.arch = "opt";
  read_common_hparams(r, hp);
  hp.norm_eps = static_cast<float>(r.opt_float("opt.attention.layer_norm_epsilon").value_or(1e-5));
  EMBER_CHECK(hp.norm_eps > 0 && std::isfinite(hp.norm_eps), "{}: opt.attention.layer_norm_epsilon must be positive",
              r.path());
  hp.act = cpu::Activation::relu;
  EMBER_CHECK(hp.head_dim * hp.n_head == hp.n_embd, "{}: opt needs n_head * head size == n_embd", r.path());

  TensorBinder b(r, hp);
  bind_embeddings(b, m);
  m.output_norm_b = b.norm("output_norm.bias", hp.n_embd);
  const TensorView pos = b.optional("position_embd.weight");
  EMBER_CHECK(pos.valid(), "{}: tensor 'position_embd.weight' (OPT's learned positions) is missing", r.path());
  EMBER_CHECK(pos.rows() > kOptPositionOffset, "{}: position_embd.weight has only {} rows", r.path(), pos.rows());
  m.pos_embd = b.matrix("position_embd.weight", hp.n_embd, pos.rows());
  // The usable context: the table's rows less HF's offset.
  hp.n_ctx_train = std::min(hp.n_ctx_train, pos.rows() - kOptPositionOffset);

  m.layers.resize(hp.n_layer);
  const int64_t d = hp.n_embd, nkv = hp.n_head_kv * hp.head_dim;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = m.layers[il];
    auto name = [&](const char* t, const char* kind = "weight") { return fmt::format("blk.{}.{}.{}", il, t, kind); };
    L.attn_norm = b.norm(name("attn_norm"), d);
    L.attn_norm_b = b.norm(name("attn_norm", "bias"), d);
    L.wq = b.matrix(name("attn_q"), d, d);
    L.bq = b.norm(name("attn_q", "bias"), d);
    L.wk = b.matrix(name("attn_k"), d, nkv);
    L.bk = b.norm(name("attn_k", "bias"), nkv);
    L.wv = b.matrix(name("attn_v"), d, nkv);
    L.bv = b.norm(name("attn_v", "bias"), nkv);
    L.wo = b.matrix(name("attn_output"), d, d);
    L.bo = b.norm(name("attn_output", "bias"), d);
    L.ffn.norm = b.norm(name("ffn_norm"), d);
    L.ffn.norm_b = b.norm(name("ffn_norm", "bias"), d);
    L.ffn.gating = FfnGating::none;
    L.ffn.up = b.matrix(name("ffn_up"), d, hp.n_ff);
    L.ffn.up_b = b.norm(name("ffn_up", "bias"), hp.n_ff);
    bind_ffn_down_and_predictor(b, hp, il, L.ffn);
    // The down bias: ffn_down.bias, or ffn_down_t.bias in PowerInfer's files (the converter
    // renames every ffn_down tensor, the 1-D bias included).
    const std::string db = b.optional(name("ffn_down", "bias")).valid() ? name("ffn_down", "bias") : name("ffn_down_t", "bias");
    L.ffn.down_b = b.norm(db, d);
  }
  read_sparse_metadata(m);
}

void opt_forward(const Model& m, ThreadPool& pool, KvCache& kv, Workspace& ws, const int32_t* tokens, int64_t n,
                 int64_t pos0, float* logits, bool logits_all) {
  const Hparams& hp = m.hp;
  const int64_t d = hp.n_embd, hd = hp.head_dim, nkv = hp.n_head_kv * hd;
  EMBER_CHECK(pos0 + n + kOptPositionOffset <= m.pos_embd.rows(),
              "opt: position {} is beyond the model's {} learned positions; use a context of at most {}", pos0 + n - 1,
              m.pos_embd.rows() - kOptPositionOffset, m.pos_embd.rows() - kOptPositionOffset);
  float* x = ws.x.data();
  float* xn = ws.xn.data();
  void* mm = ws.mm_scratch.data();

  cpu::get_rows(m.tok_embd, tokens, n, x);
  {
    // Position rows pos0 + 2 .. through the scratch of the first attention output.
    float* p = ws.o.data();
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = static_cast<int32_t>(pos0 + t + kOptPositionOffset);  // < rows (checked above)
      cpu::get_rows(m.pos_embd, &id, 1, p + t * d);
    }
    cpu::add_f32(p, x, n * d);
  }

  cpu::AttentionShape shape;
  shape.n_head = hp.n_head;
  shape.n_head_kv = hp.n_head_kv;
  shape.head_dim = hd;
  shape.scale = 1.0f / std::sqrt(static_cast<float>(hd));

  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& L = m.layers[il];
    cpu::layer_norm(x, as_floats(L.attn_norm), as_floats(L.attn_norm_b), xn, n, d, hp.norm_eps);
    cpu::matmul(pool, L.wq, xn, n, ws.q.data(), mm);
    cpu::matmul(pool, L.wk, xn, n, ws.k.data(), mm);
    cpu::matmul(pool, L.wv, xn, n, ws.v.data(), mm);
    add_bias(L.bq, ws.q.data(), n, d);
    add_bias(L.bk, ws.k.data(), n, nkv);
    add_bias(L.bv, ws.v.data(), n, nkv);
    cache_and_attend(pool, shape, kv, ws, il, n, pos0);
    cpu::matmul(pool, L.wo, ws.attn.data(), n, ws.o.data(), mm);
    add_bias(L.bo, ws.o.data(), n, d);
    cpu::add_f32(ws.o.data(), x, n * d);

    cpu::layer_norm(x, as_floats(L.ffn.norm), as_floats(L.ffn.norm_b), xn, n, d, hp.norm_eps);
    ws.ffn_residual = x;
    if (ws.ffn) ws.ffn->run(pool, il, L.ffn, hp.act, xn, n, ws.o.data(), ws);
    else dense_ffn(pool, L.ffn, hp.act, xn, n, ws.o.data(), ws);
    cpu::add_f32(ws.o.data(), x, n * d);
  }

  const int64_t first = logits_all ? 0 : n - 1;
  const int64_t n_out = n - first;
  cpu::layer_norm(x + first * d, as_floats(m.output_norm), as_floats(m.output_norm_b), xn, n_out, d, hp.norm_eps);
  cpu::matmul(pool, m.output, xn, n_out, logits, mm);
}

}  // namespace ember
