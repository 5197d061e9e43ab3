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
#include "core/error.hpp"
#include "model/loader.hpp"

namespace ember {

namespace {

void load_llama_family(Model& m, bool bamboo) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  hp.arch = bamboo ? "bamboo" : "llama";
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
  // A sliding window where the file declares one (Mistral-7B-v0.1: 4096), on every layer and
  // with the global RoPE. llama.cpp's llama graph ignores this key: the two agree up to the
  // window and part beyond it, where Ember follows the model.
  if (auto w = r.opt_int(hp.arch + ".attention.sliding_window"); w && *w > 0) {
    hp.sliding_window = *w;
    hp.swa_layers.assign(static_cast<size_t>(hp.n_layer), true);
  }

  TensorBinder b(r, hp);
  bind_embeddings(b, m);
  m.layers.resize(hp.n_layer);
  const int64_t d = hp.n_embd;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = m.layers[il];
    auto name = [&](const char* t) { return fmt::format("blk.{}.{}.weight", il, t); };
    L.attn_norm = b.norm(name("attn_norm"), d);
    bind_attention(b, hp, il, L, AttnBiases::none);
    if (!bamboo && b.optional(name("ffn_gate_inp")).valid())  // Mixtral: a mixture of experts
      bind_moe_ffn(b, hp, il, L, hp.n_ff);
    else
      bind_gated_ffn(b, hp, il, L.ffn, bamboo ? FfnGating::sym : FfnGating::par);
  }
  read_sparse_metadata(m);
  build_rope(m);
}

}  // namespace

void load_llama(Model& m) { load_llama_family(m, false); }
void load_bamboo(Model& m) { load_llama_family(m, true); }

}  // namespace ember
