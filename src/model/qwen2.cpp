// Qwen2 / Qwen2.5 (`qwen2` in GGUF), as llama.cpp runs it (LLM_ARCH_QWEN2), in the shared blocks
// (model/blocks.hpp):
//
//   x = embed(token)
//   per layer:  h = x + wo attn(rope(wq n + bq), rope(wk n + bk), wv n + bv),  n = rms_norm(x; attn_norm)
//               x = h + down(silu(gate m) * up m),                          m = rms_norm(h; ffn_norm)
//   logits = output(rms_norm(x; output_norm))      output tied to token_embd when absent
//
// A llama with biases on Q, K and V (not on the output projection) and RoPE in the NeoX layout
// (the two halves of each head rotated together: Qwen's files store Q and K unpermuted). It is
// the proof of docs/architecture.md's promise: one file and one table row.
#include "core/error.hpp"
#include "model/arch_synth.hpp"
#include "model/loader.hpp"

namespace ember {

void load_qwen2(Model& m) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  read_common_hparams(r, hp, "qwen2");
  hp.act = cpu::Activation::silu;
  hp.rope.layout = cpu::RopeLayout::neox;

  TensorBinder b(r, hp);
  bind_embeddings(b, m);
  bind_layers(m, [&](LayerWeights& L, const LayerNames& name) {
    L.attn_norm = b.norm(name("attn_norm"), hp.n_embd);
    bind_attention(b, hp, name, L, AttnBiases::qkv);
    bind_gated_ffn(b, hp, name, L.ffn, FfnGating::par);
  });
  read_sparse_metadata(m);
  build_rope(m);
}

// ---- what `ember synth` writes (model/arch_synth.hpp) ----------------------------------------

namespace {

std::vector<SynthTensor> qwen2_synth_layer(const SynthOptions& o, int64_t il) {
  std::vector<SynthTensor> v = llama_synth_layer(o, il);
  const SynthLayerShape sh(o, il);
  const int64_t n_embd_q = o.n_head * synth_head_dim(o);
  // Biases on Q, K and V (large ones, as Qwen's are).
  v.push_back({sh.prefix + "attn_q.bias", DType::F32, n_embd_q, 0, 0.0f, 0.5f});
  v.push_back({sh.prefix + "attn_k.bias", DType::F32, sh.nkv, 0, 0.0f, 0.5f});
  v.push_back({sh.prefix + "attn_v.bias", DType::F32, sh.nkv, 0, 0.0f, 0.1f});
  return v;
}

// llama.cpp's converter writes no rope.dimension_count or vocab_size for Qwen2 (whole heads
// rotate; the vocabulary is the token list's length).
void qwen2_synth_keys(gguf::Writer&, const SynthOptions&) {}

}  // namespace

extern const ArchSynth kQwen2Synth = {.acts = {FfnActivation::silu}, .layer = qwen2_synth_layer, .keys = qwen2_synth_keys};

}  // namespace ember
