// The llama architecture (Llama 1/2/3, SmolLM, Mistral-style dense models, ReluLLaMA, ProSparse,
// and Mixtral: layers with ffn_gate_inp are mixtures of experts, model/moe.hpp)
// and Bamboo (PowerInfer's arch "bamboo", keys bamboo.*: a llama with ReLU on both gate and up,
// FfnGating::sym), in the shared blocks (model/blocks.hpp):
//
//   x = embed(token)
//   per layer:  h = x + wo attn(rope(wq n), rope(wk n), wv n),  n = rms_norm(x; attn_norm)
//               (attention over the last llama.attention.sliding_window positions when set)
//               x = h + down(act(gate m) * up m),               m = rms_norm(h; ffn_norm)
//   logits = output(rms_norm(x; output_norm))      output tied to token_embd when absent
//
// RoPE in the normal (interleaved-pair) layout: llama GGUF files store Q and K permuted for it.
#include <cmath>

#include "core/error.hpp"
#include "model/arch_synth.hpp"
#include "model/loader.hpp"

namespace ember {

namespace {

void load_llama_family(Model& m, bool bamboo) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  read_common_hparams(r, hp, bamboo ? "bamboo" : "llama");
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
  // A sliding window where the file declares one (Mistral-7B-v0.1: 4096), on every layer and
  // with the global RoPE. llama.cpp's llama graph ignores this key: the two agree up to the
  // window and part beyond it, where Ember follows the model.
  if (auto w = r.opt_int(hp.arch + ".attention.sliding_window"); w && *w > 0) {
    hp.sliding_window = *w;
    hp.swa_layers.assign(static_cast<size_t>(hp.n_layer), true);
  }

  TensorBinder b(r, hp);
  bind_embeddings(b, m);
  const int64_t d = hp.n_embd;
  bind_layers(m, [&](LayerWeights& L, const LayerNames& name) {
    L.attn_norm = b.norm(name("attn_norm"), d);
    bind_attention(b, hp, name, L, AttnBiases::none);
    if (!bamboo && b.optional(name("ffn_gate_inp")).valid())  // Mixtral: a mixture of experts
      bind_moe_ffn(b, hp, name, L, hp.n_ff);
    else
      bind_gated_ffn(b, hp, name, L.ffn, bamboo ? FfnGating::sym : FfnGating::par);
  });
  read_sparse_metadata(m);
  build_rope(m);
}

}  // namespace

void load_llama(Model& m) { load_llama_family(m, false); }
void load_bamboo(Model& m) { load_llama_family(m, true); }

// ---- what `ember synth` writes (model/arch_synth.hpp) ----------------------------------------

std::vector<SynthTensor> llama_synth_layer(const SynthOptions& o, int64_t il) {
  const SynthLayerShape sh(o, il);
  const int64_t n_embd_q = o.n_head * synth_head_dim(o);
  const float s_q = 1.0f / std::sqrt(static_cast<float>(n_embd_q));
  const std::string& p = sh.prefix;
  const float norm_std = 0.02f;
  std::vector<SynthTensor> v = {
      {p + "attn_norm.weight", DType::F32, o.n_embd, 0, 1.0f, norm_std},
      {p + "attn_q.weight", o.type, o.n_embd, n_embd_q, 0.0f, sh.s_embd, SynthRole::q},
      {p + "attn_k.weight", o.type, o.n_embd, sh.nkv, 0.0f, sh.s_embd, SynthRole::k},
      {p + "attn_v.weight", o.type, o.n_embd, sh.nkv, 0.0f, sh.s_embd, SynthRole::v},
      {p + "attn_output.weight", o.type, n_embd_q, o.n_embd, 0.0f, s_q, SynthRole::o},
      {p + "ffn_norm.weight", DType::F32, o.n_embd, 0, 1.0f, norm_std, SynthRole::ffn_norm},
  };
  if (o.n_expert == 0) {
    v.push_back({p + "ffn_gate.weight", o.type, o.n_embd, o.n_ff, 0.0f, sh.s_embd, SynthRole::gate});
    v.push_back({p + "ffn_up.weight", o.type, o.n_embd, o.n_ff, 0.0f, sh.s_embd, SynthRole::up});
    v.push_back({p + "ffn_down.weight", o.type, o.n_ff, o.n_embd, 0.0f, sh.s_ff, SynthRole::down});
    return v;
  }
  // Mixtral's layout: a router, then the experts as E matrices each.
  const int64_t E = o.n_expert;
  v.push_back({p + "ffn_gate_inp.weight", DType::F32, o.n_embd, E, 0.0f, 4.0f * sh.s_embd});
  auto experts = [&](const char* name, int64_t in, int64_t out, float std) {
    v.push_back({p + name, o.type, in, out * E, 0.0f, std, SynthRole::other, E});
  };
  experts("ffn_gate_exps.weight", o.n_embd, o.n_ff, sh.s_embd);
  experts("ffn_up_exps.weight", o.n_embd, o.n_ff, sh.s_embd);
  experts("ffn_down_exps.weight", o.n_ff, o.n_embd, sh.s_ff);
  return v;
}

namespace {

std::vector<SynthTensor> llama_synth_globals(const SynthOptions& o) {
  if (!o.rope_freqs) return {};
  return {{"rope_freqs.weight", DType::F32, synth_head_dim(o) / 2, 0, 3.0f, 1.0f}};
}

void llama_synth_keys(gguf::Writer& w, const SynthOptions& o) {
  w.set("llama.rope.dimension_count", gguf::Value::u32(static_cast<uint32_t>(synth_head_dim(o))));
  w.set("llama.vocab_size", gguf::Value::u32(static_cast<uint32_t>(o.n_vocab)));
}

void bamboo_synth_keys(gguf::Writer& w, const SynthOptions& o) {
  w.set("bamboo.rope.dimension_count", gguf::Value::u32(static_cast<uint32_t>(synth_head_dim(o))));
  w.set("bamboo.vocab_size", gguf::Value::u32(static_cast<uint32_t>(o.n_vocab)));
}

}  // namespace

extern const ArchSynth kLlamaSynth = {.acts = {FfnActivation::silu, FfnActivation::relu},
                               .profile = SynthProfile::bias_channel,
                               .powerinfer = true,
                               .gate_rank = true,
                               .rope_freqs = true,
                               .experts = SynthExperts::optional,
                               // "silu" (SwiGLU, as in every llama; a plain file without the key)
                               // or "relu" (ReluLLaMA / ProSparse: down(relu(gate x) * up x))
                               .activation_key = true,
                               .layer = llama_synth_layer,
                               .globals = llama_synth_globals,
                               .keys = llama_synth_keys};
extern const ArchSynth kBambooSynth = {.acts = {FfnActivation::relu},
                                .profile = SynthProfile::bias_channel,
                                .powerinfer = true,
                                .gate_rank = true,
                                .layer = llama_synth_layer,
                                .keys = bamboo_synth_keys};

}  // namespace ember
