// Falcon (`falcon` in GGUF: Falcon-7B / 40B / 180B, and PowerInfer's ReluFalcon-40B), as
// llama.cpp runs it (src/models/falcon.cpp there), in the shared blocks (model/blocks.hpp):
//
//   x = embed(token)
//   per layer:  a = LN(x; attn_norm)                         (with bias)
//               x = x + wo attn(rope(wq c), rope(wk c), wv c) + down(act(up a))
//               c = LN(x; attn_norm_2) when the layer has it (40B, 180B), else a (7B)
//   logits = output(LN(x; output_norm))            output tied to token_embd when absent
//
// A parallel residual (Hparams::parallel_residual): attention and FFN both read the layer's
// input; the FFN reads attn_norm's output. In Ember's blocks the attention's norm is L.attn_norm
// and the FFN's is L.ffn.norm, so a two-norm layer binds attn_norm_2 as the attention's norm and
// attn_norm as the FFN's; a one-norm layer has no FFN norm (the FFN reuses the attention's).
// Q, K and V are one attn_qkv (llama.cpp's converter reorders Falcon's per-group layout into Q
// rows, then K, then V; Falcon-7B has a single KV head), no biases anywhere but the norms.
// RoPE in the NeoX layout over whole heads. The FFN has no gate: down(gelu(up a)) (FfnGating::
// none); PowerInfer's ReluFalcon runs ReLU, and as for llama, a PowerInfer (PWRI) file means
// ReLU, Ember's key falcon.ffn_activation (relu / gelu) says it explicitly. PWRI files carry
// the down projection only neuron-major (ffn_down_t) and a predictor per layer (fc1 / fc2).
#include <cmath>

#include "core/error.hpp"
#include "model/arch_synth.hpp"
#include "model/loader.hpp"

namespace ember {

void load_falcon(Model& m) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  read_common_hparams(r, hp, "falcon");
  hp.norm = NormKind::layer;
  hp.norm_eps = static_cast<float>(float_hparam(r, "falcon.attention.layer_norm_epsilon", 1e-5, 0.0, 1.0, true));
  EMBER_CHECK(hp.norm_eps > 0 && std::isfinite(hp.norm_eps), "{}: falcon.attention.layer_norm_epsilon must be positive",
              r.path());
  hp.parallel_residual = true;
  hp.act = r.is_powerinfer() ? cpu::Activation::relu : cpu::Activation::gelu_tanh;
  if (auto act = r.opt_string("falcon.ffn_activation")) {
    if (*act == "relu") hp.act = cpu::Activation::relu;
    else if (*act == "gelu") hp.act = cpu::Activation::gelu_tanh;
    else fail("{}: falcon.ffn_activation '{}' is not supported (gelu or relu)", r.path(), *act);
  }
  hp.rope.layout = cpu::RopeLayout::neox;
  EMBER_CHECK(hp.rope.n_rot == hp.head_dim, "{}: falcon rotates whole heads, rope.dimension_count {} != head size {}",
              r.path(), hp.rope.n_rot, hp.head_dim);
  EMBER_CHECK(hp.n_head * hp.head_dim == hp.n_embd, "{}: falcon needs n_head * head size == n_embd", r.path());

  TensorBinder b(r, hp);
  bind_embeddings(b, m);
  m.output_norm_b = b.norm("output_norm.bias", hp.n_embd);
  const int64_t d = hp.n_embd;
  bind_layers(m, [&](LayerWeights& L, const LayerNames& name) {
    const TensorView norm = b.norm(name("attn_norm"), d), norm_b = b.norm(name("attn_norm", "bias"), d);
    if (b.optional(name("attn_norm_2")).valid()) {
      L.attn_norm = b.norm(name("attn_norm_2"), d);
      L.attn_norm_b = b.norm(name("attn_norm_2", "bias"), d);
      L.ffn.norm = norm, L.ffn.norm_b = norm_b;
    } else {
      L.attn_norm = norm, L.attn_norm_b = norm_b;
    }
    bind_attention(b, hp, name, L, AttnBiases::none);
    L.ffn.gating = FfnGating::none;
    L.ffn.up = b.matrix(name("ffn_up"), d, hp.n_ff);
    bind_ffn_down_and_predictor(b, hp, name, L.ffn);
  });
  read_sparse_metadata(m);
  build_rope(m);
}

// ---- what `ember synth` writes (model/arch_synth.hpp) ----------------------------------------

namespace {

// llama.cpp's names: LayerNorms with biases (a second one, attn_norm_2, in the 40B layout: more
// than one KV head), fused attn_qkv, attn_output, up and down without biases.
std::vector<SynthTensor> falcon_synth_layer(const SynthOptions& o, int64_t il) {
  const SynthLayerShape sh(o, il);
  const std::string& p = sh.prefix;
  const int64_t d = o.n_embd;
  std::vector<SynthTensor> v = {
      {p + "attn_norm.weight", DType::F32, d, 0, 1.0f, 0.1f},
      {p + "attn_norm.bias", DType::F32, d, 0, 0.0f, 0.1f},
  };
  if (o.n_head_kv > 1) {
    v.push_back({p + "attn_norm_2.weight", DType::F32, d, 0, 1.0f, 0.1f});
    v.push_back({p + "attn_norm_2.bias", DType::F32, d, 0, 0.0f, 0.1f});
  }
  v.push_back({p + "attn_qkv.weight", o.type, d, d + 2 * sh.nkv, 0.0f, sh.s_embd});
  v.push_back({p + "attn_output.weight", o.type, d, d, 0.0f, sh.s_embd});
  v.push_back({p + "ffn_up.weight", o.type, d, o.n_ff, 0.0f, sh.s_embd, SynthRole::up});
  v.push_back({p + "ffn_down.weight", o.type, o.n_ff, d, 0.0f, sh.s_ff, SynthRole::down});
  return v;
}

std::vector<SynthTensor> falcon_synth_globals(const SynthOptions& o) {
  return {{"output_norm.bias", DType::F32, o.n_embd, 0, 0.0f, 0.1f}};
}

void falcon_synth_attention_keys(gguf::Writer& w, const SynthOptions& o) {
  w.set("falcon.attention.head_count_kv", gguf::Value::u32(static_cast<uint32_t>(o.n_head_kv)));
  w.set("falcon.attention.layer_norm_epsilon", gguf::Value::f32(o.rms_eps));
  w.set("falcon.rope.freq_base", gguf::Value::f32(o.rope_base));
}

}  // namespace

extern const ArchSynth kFalconSynth = {.acts = {FfnActivation::gelu, FfnActivation::relu},
                                .powerinfer = true,
                                .activation_key = true,  // "gelu" or "relu"
                                .layer = falcon_synth_layer,
                                .globals = falcon_synth_globals,
                                .attention_keys = falcon_synth_attention_keys};

}  // namespace ember
