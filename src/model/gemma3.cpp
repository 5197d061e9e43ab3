// Gemma 3 (`gemma3` in GGUF; text part of Gemma 3 270M .. 27B), as llama.cpp runs it (src/models/gemma3.cpp there) from the keys its converter writes:
//
//   x = embed(token) * sqrt(n_embd)
//   per layer:  h = x + post_attn_norm(attn(attn_norm(x)))
//               x = h + post_ffw_norm(down(gelu_tanh(gate(ffn_norm h)) * up(ffn_norm h)))
//   attn: q, k get an RMSNorm per head (over head_dim) before RoPE (NeoX layout); one KV head
//         may serve several query heads; q.k is scaled by 1/sqrt(head_dim) (27B:
//         1/sqrt(n_embd / n_head), as llama.cpp / gemma_pytorch's query_pre_attn_scalar).
//   logits = output(output_norm x), soft-capped when final_logit_softcapping is set.
//
// Norm weights: Gemma's RMSNorm multiplies by (1 + w); llama.cpp's converter stores w + 1 in the
// GGUF (convert_hf_to_gguf: Gemma3Model.norm_shift), so the weights are used as they are.
//
// Layers: with gemma3.attention.sliding_window set, layer il is local (sliding window of that
// many positions, RoPE base gemma3.rope.freq_base_swa, default 10000, no scaling) unless
// il % P == P - 1 with P = gemma3.attention.sliding_window_pattern (default 6, as llama.cpp),
// which makes every P-th layer global (full attention, RoPE base gemma3.rope.freq_base and the
// file's rope scaling). Without the key every layer is global.
#include <cmath>

#include "core/error.hpp"
#include "model/arch_synth.hpp"
#include "model/loader.hpp"

namespace ember {

void load_gemma3(Model& m) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  read_common_hparams(r, hp, "gemma3");
  if (!r.opt_float("gemma3.attention.layer_norm_rms_epsilon")) hp.norm_eps = 1e-6f;  // Gemma's default
  hp.act = cpu::Activation::gelu_tanh;
  hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
  hp.rope.layout = cpu::RopeLayout::neox;
  EMBER_CHECK(hp.rope.n_rot == hp.head_dim, "{}: gemma3 rotates whole heads, rope.dimension_count {} != head size {}",
              r.path(), hp.rope.n_rot, hp.head_dim);
  if (auto v = r.opt_int("gemma3.attention.value_length"))
    EMBER_CHECK(*v == hp.head_dim, "{}: value_length {} must equal key_length {}", r.path(), *v, hp.head_dim);

  hp.sliding_window = r.opt_int("gemma3.attention.sliding_window").value_or(0);
  EMBER_CHECK(hp.sliding_window >= 0, "{}: sliding_window must not be negative", r.path());
  const int64_t period = r.opt_int("gemma3.attention.sliding_window_pattern").value_or(6);
  EMBER_CHECK(period >= 1, "{}: sliding_window_pattern must be positive", r.path());
  hp.swa_layers.assign(hp.n_layer, false);
  if (hp.sliding_window > 0)
    for (int64_t il = 0; il < hp.n_layer; ++il) hp.swa_layers[il] = il % period < period - 1;
  hp.rope_local = hp.rope;
  hp.rope_local.base = float_hparam(r, "gemma3.rope.freq_base_swa", 10000.0, 0.0, 1e12, true);
  hp.rope_local.linear_scale = 1.0;

  // 27B (62 layers) scales by n_embd / n_head; the others by head_dim (llama.cpp's rule).
  const double q_scalar = hp.n_layer == 62 ? static_cast<double>(hp.n_embd / hp.n_head) : static_cast<double>(hp.head_dim);
  hp.attn_scale = static_cast<float>(1.0 / std::sqrt(q_scalar));
  hp.final_softcap = static_cast<float>(float_hparam(r, "gemma3.final_logit_softcapping", 0.0, 0.0, 1e6));
  EMBER_CHECK(hp.final_softcap >= 0 && std::isfinite(hp.final_softcap), "{}: final_logit_softcapping is invalid",
              r.path());

  TensorBinder b(r, hp);
  bind_embeddings(b, m);
  const int64_t d = hp.n_embd, hd = hp.head_dim;
  bind_layers(m, [&](LayerWeights& L, const LayerNames& name) {
    L.attn_norm = b.norm(name("attn_norm"), d);
    bind_attention(b, hp, name, L, AttnBiases::none);
    L.q_norm = b.norm(name("attn_q_norm"), hd);
    L.k_norm = b.norm(name("attn_k_norm"), hd);
    L.attn_post_norm = b.norm(name("post_attention_norm"), d);
    bind_gated_ffn(b, hp, name, L.ffn, FfnGating::par);
    L.ffn_post_norm = b.norm(name("post_ffw_norm"), d);
  });
  read_sparse_metadata(m);
  build_rope(m);
  m.rope_local = std::make_unique<cpu::RopeTable>(hp.rope_local);
}

// ---- what `ember synth` writes (model/arch_synth.hpp) ----------------------------------------

namespace {

std::vector<SynthTensor> gemma3_synth_layer(const SynthOptions& o, int64_t il) {
  std::vector<SynthTensor> v = llama_synth_layer(o, il);
  const std::string p = SynthLayerShape(o, il).prefix;
  const int64_t head_dim = synth_head_dim(o);
  // Norm weights as the GGUF stores them (llama.cpp's converter has already added Gemma's 1).
  v.push_back({p + "attn_q_norm.weight", DType::F32, head_dim, 0, 1.0f, 0.2f});
  v.push_back({p + "attn_k_norm.weight", DType::F32, head_dim, 0, 1.0f, 0.2f});
  v.push_back({p + "post_attention_norm.weight", DType::F32, o.n_embd, 0, 1.0f, 0.2f});
  v.push_back({p + "post_ffw_norm.weight", DType::F32, o.n_embd, 0, 1.0f, 0.2f});
  return v;
}

void gemma3_synth_keys(gguf::Writer& w, const SynthOptions& o) {  // the keys llama.cpp's converter writes
  auto u32 = [](int64_t x) { return gguf::Value::u32(static_cast<uint32_t>(x)); };
  w.set("gemma3.attention.key_length", u32(synth_head_dim(o)));
  w.set("gemma3.attention.value_length", u32(synth_head_dim(o)));
  w.set("gemma3.attention.sliding_window", u32(o.sliding_window));
  w.set("gemma3.attention.sliding_window_pattern", u32(o.swa_period));
  if (o.final_softcap > 0) w.set("gemma3.final_logit_softcapping", gguf::Value::f32(o.final_softcap));
}

}  // namespace

extern const ArchSynth kGemma3Synth = {.acts = {FfnActivation::silu},  // GeGLU by itself (the key is not read)
                                .head_dim = true,
                                .layer = gemma3_synth_layer,
                                .keys = gemma3_synth_keys};

}  // namespace ember
