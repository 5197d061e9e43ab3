// Phi-3 / Phi-3.5 / Phi-4-mini (`phi3` in GGUF), as llama.cpp runs it (src/models/phi3.cpp
// there), in the shared blocks (model/blocks.hpp):
//
//   x = embed(token)
//   per layer:  h = x + wo attn(rope(wq n), rope(wk n), wv n),   n = rms_norm(x; attn_norm)
//               x = h + down(silu(g) * u),  [g; u] = ffn_up m,   m = rms_norm(h; ffn_norm)
//   logits = output(rms_norm(x; output_norm))      output tied to token_embd when absent
//
// Both projections come fused: Q, K and V as one attn_qkv (bound as three row ranges,
// loader.hpp), gate and up as one ffn_up of 2 n_ff rows, the gate's rows first (llama.cpp's
// LLM_FFN_SWIGLU splits it so); files with a separate ffn_gate are read too. RoPE in the NeoX
// layout. Its LongRoPE scaling (Phi-3-*-128k): per-frequency factors rope_factors_short /
// rope_factors_long and a cos/sin scale rope.scaling.attn_factor. As llama.cpp, a session
// whose context exceeds rope.scaling.original_context_length uses the long factors at every
// position (Model::rope_for_context), a shorter one the short factors. The file's
// attention.sliding_window is
// ignored, as llama.cpp does (its converters write values that disagree with the models).
#include <algorithm>

#include "core/error.hpp"
#include "model/arch_synth.hpp"
#include "model/loader.hpp"

namespace ember {
namespace {

// rope_factors_short / _long (n_rot / 2 F32 values) when the file has them, else empty.
std::vector<float> rope_factors(const gguf::Reader& r, const char* name, int64_t n) {
  const TensorView t = r.view(name);
  if (!t.valid()) return {};
  EMBER_CHECK(t.type == DType::F32 && t.n_elements() == n, "{}: {} must be F32 with {} elements", r.path(), name, n);
  return std::vector<float>(as_floats(t), as_floats(t) + n);
}

}  // namespace

void load_phi3(Model& m) {
  const gguf::Reader& r = *m.file;
  Hparams& hp = m.hp;
  read_common_hparams(r, hp, "phi3");
  hp.act = cpu::Activation::silu;
  hp.rope.layout = cpu::RopeLayout::neox;
  EMBER_CHECK(hp.n_head * hp.head_dim == hp.n_embd, "{}: phi3 needs n_head * head size == n_embd", r.path());

  const std::vector<float> short_f = rope_factors(r, "rope_factors_short.weight", hp.rope.n_rot / 2);
  const std::vector<float> long_f = rope_factors(r, "rope_factors_long.weight", hp.rope.n_rot / 2);
  hp.rope.freq_factors = short_f;

  TensorBinder b(r, hp);
  bind_embeddings(b, m);
  bind_layers(m, [&](LayerWeights& L, const LayerNames& name) {
    L.attn_norm = b.norm(name("attn_norm"), hp.n_embd);
    bind_attention(b, hp, name, L, AttnBiases::none);
    if (b.optional(name("ffn_gate")).valid() || b.optional(name("ffn_bundle")).valid()) {
      bind_gated_ffn(b, hp, name, L.ffn, FfnGating::par);
      return;
    }
    FfnWeights& f = L.ffn;
    f.norm = b.norm(name("ffn_norm"), hp.n_embd);
    const TensorView gate_up = b.matrix(name("ffn_up"), hp.n_embd, 2 * hp.n_ff);
    f.gate = row_range(gate_up, 0, hp.n_ff);
    f.up = row_range(gate_up, hp.n_ff, 2 * hp.n_ff);
    f.gating = FfnGating::par;
    bind_ffn_down_and_predictor(b, hp, name, f);
  });
  read_sparse_metadata(m);
  build_rope(m);
  if (!long_f.empty() && long_f != short_f) {
    cpu::RopeConfig c = hp.rope;
    c.freq_factors = long_f;
    m.rope_long = std::make_unique<cpu::RopeTable>(c);
    m.rope_long_after = r.opt_int("phi3.rope.scaling.original_context_length").value_or(hp.n_ctx_train);
  }
}

// ---- what `ember synth` writes (model/arch_synth.hpp) ----------------------------------------

namespace {

// Fused attn_qkv and fused gate/up (ffn_up: the gate's n_ff rows, then up's).
std::vector<SynthTensor> phi3_synth_layer(const SynthOptions& o, int64_t il) {
  const SynthLayerShape sh(o, il);
  const std::string& p = sh.prefix;
  const int64_t d = o.n_embd;
  return {
      {p + "attn_norm.weight", DType::F32, d, 0, 1.0f, 0.02f},
      {p + "attn_qkv.weight", o.type, d, d + 2 * sh.nkv, 0.0f, sh.s_embd},
      {p + "attn_output.weight", o.type, d, d, 0.0f, sh.s_embd},
      {p + "ffn_norm.weight", DType::F32, d, 0, 1.0f, 0.02f},
      {p + "ffn_up.weight", o.type, d, 2 * o.n_ff, 0.0f, sh.s_embd},
      {p + "ffn_down.weight", o.type, o.n_ff, d, 0.0f, sh.s_ff},
  };
}

std::vector<SynthTensor> phi3_synth_globals(const SynthOptions& o) {  // LongRoPE's factors (n_rot / 2 each), both >= 1
  const int64_t half = synth_head_dim(o) / 2;
  return {{"rope_factors_short.weight", DType::F32, half, 0, 2.0f, 0.5f},
          {"rope_factors_long.weight", DType::F32, half, 0, 8.0f, 2.0f}};
}

void phi3_synth_keys(gguf::Writer& w, const SynthOptions& o) {
  w.set("phi3.rope.dimension_count", gguf::Value::u32(static_cast<uint32_t>(synth_head_dim(o))));
  w.set("phi3.rope.scaling.original_context_length", gguf::Value::u32(static_cast<uint32_t>(o.n_ctx)));
  w.set("phi3.rope.scaling.attn_factor", gguf::Value::f32(1.19f));
}

int64_t phi3_synth_context(const SynthOptions& o) { return 4 * o.n_ctx; }  // LongRoPE: trained to 4x

}  // namespace

extern const ArchSynth kPhi3Synth = {.acts = {FfnActivation::silu},
                              .layer = phi3_synth_layer,
                              .globals = phi3_synth_globals,
                              .keys = phi3_synth_keys,
                              .context_length = phi3_synth_context};

}  // namespace ember
