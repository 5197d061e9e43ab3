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
#include "model/arch_synth.hpp"
#include "model/loader.hpp"

namespace ember {
namespace {

constexpr int64_t kOptPositionOffset = 2;  // HF OPTLearnedPositionalEmbedding

}  // namespace

void load_opt(Model& m) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  read_common_hparams(r, hp, "opt");
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

  const int64_t d = hp.n_embd;
  bind_layers(m, [&](LayerWeights& L, const LayerNames& name) {
    L.attn_norm = b.norm(name("attn_norm"), d);
    L.attn_norm_b = b.norm(name("attn_norm", "bias"), d);
    bind_attention(b, hp, name, L, AttnBiases::all);
    L.ffn.norm = b.norm(name("ffn_norm"), d);
    L.ffn.norm_b = b.norm(name("ffn_norm", "bias"), d);
    L.ffn.gating = FfnGating::none;
    L.ffn.up = b.matrix(name("ffn_up"), d, hp.n_ff);
    L.ffn.up_b = b.norm(name("ffn_up", "bias"), hp.n_ff);
    bind_ffn_down_and_predictor(b, hp, name, L.ffn);
    // The down bias: ffn_down.bias, or ffn_down_t.bias in PowerInfer's files (the converter
    // renames every ffn_down tensor, the 1-D bias included).
    const std::string db = b.optional(name("ffn_down", "bias")).valid() ? name("ffn_down", "bias") : name("ffn_down_t", "bias");
    L.ffn.down_b = b.norm(db, d);
  });
  read_sparse_metadata(m);
}

// ---- what `ember synth` writes (model/arch_synth.hpp) ----------------------------------------

namespace {

// The names of PowerInfer's converter. The activation profile needs no bias channel here:
// LayerNorm makes the FFN input's elements about unit variance, so up_j . x is about
// N(0, |w_j|^2) with |w_j| ~ 1, and an up bias of probit(p_j) fires neuron j with p_j.
std::vector<SynthTensor> opt_synth_layer(const SynthOptions& o, int64_t il) {
  const SynthLayerShape sh(o, il);
  const std::string& p = sh.prefix;
  const int64_t d = o.n_embd, nkv = sh.nkv;
  const float s_embd = sh.s_embd;
  return {
      {p + "attn_norm.weight", DType::F32, d, 0, 1.0f, 0.02f},
      {p + "attn_norm.bias", DType::F32, d, 0, 0.0f, 0.02f},
      {p + "attn_q.weight", o.type, d, d, 0.0f, s_embd},
      {p + "attn_q.bias", DType::F32, d, 0, 0.0f, 0.02f},
      {p + "attn_k.weight", o.type, d, nkv, 0.0f, s_embd},
      {p + "attn_k.bias", DType::F32, nkv, 0, 0.0f, 0.02f},
      {p + "attn_v.weight", o.type, d, nkv, 0.0f, s_embd},
      {p + "attn_v.bias", DType::F32, nkv, 0, 0.0f, 0.02f},
      {p + "attn_output.weight", o.type, d, d, 0.0f, s_embd},
      {p + "attn_output.bias", DType::F32, d, 0, 0.0f, 0.02f},
      {p + "ffn_norm.weight", DType::F32, d, 0, 1.0f, 0.02f},
      {p + "ffn_norm.bias", DType::F32, d, 0, 0.0f, 0.02f},
      {p + "ffn_up.weight", o.type, d, o.n_ff, 0.0f, s_embd, SynthRole::up},
      {p + "ffn_up.bias", DType::F32, o.n_ff, 0, 0.0f, 0.02f, SynthRole::up_bias},
      {p + "ffn_down.weight", o.type, o.n_ff, d, 0.0f, sh.s_ff, SynthRole::down},
      {p + "ffn_down.bias", DType::F32, d, 0, 0.0f, 0.02f},
  };
}

std::vector<SynthTensor> opt_synth_globals(const SynthOptions& o) {  // learned positions: n_ctx rows after HF's offset of 2
  return {{"output_norm.bias", DType::F32, o.n_embd, 0, 0.0f, 0.02f},
          {"position_embd.weight", o.type, o.n_embd, o.n_ctx + 2, 0.0f, 1.0f / std::sqrt(static_cast<float>(o.n_embd))}};
}

void opt_synth_attention_keys(gguf::Writer& w, const SynthOptions& o) {
  w.set("opt.attention.layer_norm_epsilon", gguf::Value::f32(o.rms_eps));
}

void opt_synth_keys(gguf::Writer& w, const SynthOptions& o) {
  w.set("opt.vocab_size", gguf::Value::u32(static_cast<uint32_t>(o.n_vocab)));
}

int64_t opt_synth_context(const SynthOptions& o) { return o.n_ctx + 2; }  // the position table's rows (2050 for 2048)

}  // namespace

extern const ArchSynth kOptSynth = {.acts = {FfnActivation::relu},
                             .profile = SynthProfile::up_bias,
                             .powerinfer = true,
                             .grouped_kv = false,
                             .tied = true,  // PowerInfer loads no output.weight for OPT
                             .layer = opt_synth_layer,
                             .globals = opt_synth_globals,
                             .attention_keys = opt_synth_attention_keys,
                             .keys = opt_synth_keys,
                             .context_length = opt_synth_context};

}  // namespace ember
