// OPT (Meta's Open Pre-trained Transformers; PowerInfer runs its ReLU FFN sparsely), from the
// GGUF names PowerInfer's converter (convert-hf-to-powerinfer-gguf.py, OptModel) writes:
//
//   x = token_embd[tok] + position_embd[pos + 2]        (learned positions, HF's offset of 2)
//   per layer:  h = x + attn_output(attn(LN(x; attn_norm)))          q, k, v, output with biases
//               x = h + down(relu(up(LN(h; ffn_norm)) + up_b)) + down_b       (no gate)
//   logits = output(LN(x; output_norm)), output tied to token_embd when output.weight is absent
//
// LN is LayerNorm with weight and bias (opt.attention.layer_norm_epsilon, default 1e-5: HF's
// OPT value; PowerInfer's loader reads no key). Attention has no rotary embedding; q.k is scaled
// by 1/sqrt(head_dim). The down projection is ffn_down (n_ff -> n_embd) or, in PowerInfer's
// files, only the neuron-major ffn_down_t with its bias ffn_down_t.bias.
#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "model/loader.hpp"

namespace ember {
namespace {

constexpr int64_t kOptPositionOffset = 2;  // HF OPTLearnedPositionalEmbedding

}  // namespace

void load_opt(Model& m) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  hp.arch = "opt";
  read_common_hparams(r, hp);
  hp.norm_eps = static_cast<float>(float_hparam(r, "opt.attention.layer_norm_epsilon", 1e-5, 0.0, 1.0, true));
  EMBER_CHECK(hp.norm_eps > 0 && std::isfinite(hp.norm_eps), "{}: opt.attention.layer_norm_epsilon must be positive",
              r.path());
  hp.act = cpu::Activation::relu;
  hp.norm = NormKind::layer;
  hp.pos_offset = kOptPositionOffset;
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
  const int64_t d = hp.n_embd;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = m.layers[il];
    auto name = [&](const char* t, const char* kind = "weight") { return fmt::format("blk.{}.{}.{}", il, t, kind); };
    L.attn_norm = b.norm(name("attn_norm"), d);
    L.attn_norm_b = b.norm(name("attn_norm", "bias"), d);
    bind_attention(b, hp, il, L, AttnBiases::all);
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

}  // namespace ember
