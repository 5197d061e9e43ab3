// Qwen3 (`qwen3` in GGUF) and Qwen3-MoE (`qwen3moe`: Qwen3-30B-A3B, 235B-A22B), as llama.cpp
// runs them (src/models/qwen3.cpp, qwen3moe.cpp there), in the shared blocks (model/blocks.hpp):
//
//   x = embed(token)
//   per layer:  h = x + wo attn(rope(q_norm(wq n)), rope(k_norm(wk n)), wv n),  n = rms_norm(x; attn_norm)
//               x = h + down(silu(gate m) * up m),                           m = rms_norm(h; ffn_norm)
//   logits = output(rms_norm(x; output_norm))      output tied to token_embd when absent
//
// Qwen2 without the Q/K/V biases and with an RMSNorm of every q and k head (over head_dim,
// before RoPE; the Q/K-norm Gemma 3 has too). The head size is {arch}.attention.key_length and
// may differ from n_embd / n_head (Qwen3-0.6B: 1024 = 16 x 64, heads of 128). RoPE in the NeoX
// layout over whole heads.
//
// Qwen3-MoE: the same attention, and in every layer a mixture of experts (model/moe.hpp) instead
// of the dense FFN: k = qwen3moe.expert_used_count of qwen3moe.expert_count experts, each of
// width qwen3moe.expert_feed_forward_length (llama.cpp's fallback without it: n_ff / k), softmax
// router, chosen weights renormalised. Hparams::n_ff is then the widest FFN the workspace holds.
#include <algorithm>

#include "core/error.hpp"
#include "model/arch_synth.hpp"
#include "model/loader.hpp"

namespace ember {
namespace {

void load_qwen3_family(Model& m, bool moe) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  read_common_hparams(r, hp, moe ? "qwen3moe" : "qwen3");
  hp.act = cpu::Activation::silu;
  hp.rope.layout = cpu::RopeLayout::neox;
  EMBER_CHECK(hp.rope.n_rot == hp.head_dim, "{}: {} rotates whole heads, rope.dimension_count {} != head size {}",
              r.path(), hp.arch, hp.rope.n_rot, hp.head_dim);
  int64_t n_ff_exp = 0;
  if (moe) {
    EMBER_CHECK(hp.n_expert >= 1, "{}: qwen3moe.expert_count is missing", r.path());
    n_ff_exp = r.opt_int("qwen3moe.expert_feed_forward_length").value_or(hp.n_ff / hp.n_expert_used);
    EMBER_CHECK(n_ff_exp >= 1 && n_ff_exp <= (1 << 22), "{}: expert_feed_forward_length {} is out of range",
                r.path(), n_ff_exp);
    hp.n_ff = std::max(hp.n_ff, n_ff_exp);
  }

  TensorBinder b(r, hp);
  bind_embeddings(b, m);
  bind_layers(m, [&](LayerWeights& L, const LayerNames& name) {
    L.attn_norm = b.norm(name("attn_norm"), hp.n_embd);
    bind_attention(b, hp, name, L, AttnBiases::none);
    L.q_norm = b.norm(name("attn_q_norm"), hp.head_dim);
    L.k_norm = b.norm(name("attn_k_norm"), hp.head_dim);
    if (moe)
      bind_moe_ffn(b, hp, name, L, n_ff_exp);
    else
      bind_gated_ffn(b, hp, name, L.ffn, FfnGating::par);
  });
  read_sparse_metadata(m);
  build_rope(m);
}

}  // namespace

void load_qwen3(Model& m) { load_qwen3_family(m, false); }
void load_qwen3moe(Model& m) { load_qwen3_family(m, true); }

// ---- what `ember synth` writes (model/arch_synth.hpp) ----------------------------------------

namespace {

std::vector<SynthTensor> qwen3_synth_layer(const SynthOptions& o, int64_t il) {
  std::vector<SynthTensor> v = llama_synth_layer(o, il);
  const std::string p = SynthLayerShape(o, il).prefix;
  v.push_back({p + "attn_q_norm.weight", DType::F32, synth_head_dim(o), 0, 1.0f, 0.2f});
  v.push_back({p + "attn_k_norm.weight", DType::F32, synth_head_dim(o), 0, 1.0f, 0.2f});
  return v;
}

void qwen3_synth_keys_of(gguf::Writer& w, const SynthOptions& o, const std::string& a) {
  w.set(a + ".attention.key_length", gguf::Value::u32(static_cast<uint32_t>(synth_head_dim(o))));
  w.set(a + ".attention.value_length", gguf::Value::u32(static_cast<uint32_t>(synth_head_dim(o))));
}
void qwen3_synth_keys(gguf::Writer& w, const SynthOptions& o) { qwen3_synth_keys_of(w, o, "qwen3"); }
void qwen3moe_synth_keys(gguf::Writer& w, const SynthOptions& o) {
  qwen3_synth_keys_of(w, o, "qwen3moe");
  w.set("qwen3moe.expert_feed_forward_length", gguf::Value::u32(static_cast<uint32_t>(o.n_ff)));
}

}  // namespace

extern const ArchSynth kQwen3Synth = {.acts = {FfnActivation::silu},
                               .head_dim = true,
                               .layer = qwen3_synth_layer,
                               .keys = qwen3_synth_keys};
extern const ArchSynth kQwen3MoeSynth = {.acts = {FfnActivation::silu},
                                  .head_dim = true,
                                  .experts = SynthExperts::required,
                                  .layer = qwen3_synth_layer,
                                  .keys = qwen3moe_synth_keys};

}  // namespace ember
