// Shared pieces of the architecture loaders: reading the common hyperparameters and binding
// tensors with shape and type checks that name what is wrong.
#pragma once
#include <string>
#include <string_view>

#include "gguf/reader.hpp"
#include "model/model.hpp"

namespace ember {

// Sets hp.arch and reads {arch}.block_count, embedding_length, feed_forward_length,
// attention.head_count(_kv), key_length, layer_norm_rms_epsilon, context_length, rope.* and the
// vocabulary size.
void read_common_hparams(const gguf::Reader& r, Hparams& hp, std::string arch);

// An optional float hyperparameter `key`, or `fallback` where the file has none; a value that is
// not finite or outside [lo, hi] (lo excluded with lo_open) fails naming the key, the value and
// the range: a file that lies about its hyperparameters (an epsilon of NaN, 0 or -1) is refused,
// not run to produce <unk> forever.
double float_hparam(const gguf::Reader& r, const std::string& key, double fallback, double lo, double hi,
                    bool lo_open = false);

class TensorBinder {
 public:
  TensorBinder(const gguf::Reader& r, const Hparams& hp) : r_(r), hp_(hp) {}
  // A weight matrix mapping `in` inputs to `out` outputs: ne = [in, out], a supported type, its
  // first and last rows finite (a cheap look at what a corrupt file holds; all of it would read
  // the whole file at load).
  TensorView matrix(const std::string& name, int64_t in, int64_t out) const;
  // The experts' matrices of a mixture-of-experts layer, one 3-D tensor: ne = [in, out, n_expert].
  TensorView experts(const std::string& name, int64_t in, int64_t out, int64_t n_expert) const;
  // A 1-D F32 vector of length n, every value finite.
  TensorView norm(const std::string& name, int64_t n) const;
  TensorView optional(const std::string& name) const { return r_.view(name); }
  const std::string& path() const { return r_.path(); }
  const gguf::Reader& reader() const { return r_; }

 private:
  TensorView require(const std::string& name) const;
  const gguf::Reader& r_;
  const Hparams& hp_;
};

// Layer il's tensor names: name("attn_norm") is blk.il.attn_norm.weight, name("attn_norm", "bias")
// its bias.
struct LayerNames {
  int64_t il;
  std::string operator()(std::string_view t, std::string_view kind = "weight") const;
};

// The layers bound in order: bind(L, name) for L = m.layers[il], name its LayerNames.
template <class F>
void bind_layers(Model& m, F&& bind) {
  m.layers.resize(static_cast<size_t>(m.hp.n_layer));
  for (int64_t il = 0; il < m.hp.n_layer; ++il) bind(m.layers[static_cast<size_t>(il)], LayerNames{il});
}

// Rows [r0, r1) of a matrix or 1-D vector as a view of their own (zero-copy), named
// "name[r0:r1]". For tensors stored fused (attn_qkv).
TensorView row_range(const TensorView& t, int64_t r0, int64_t r1);

// Which attention projections carry a bias: none (llama, Gemma), Q/K/V (Qwen2), all four (OPT).
enum class AttnBiases { none, qkv, all };

// The layer's (name.il's) attention projections: blk.il.attn_q / attn_k / attn_v, or one fused
// blk.il.attn_qkv (ne = [n_embd, nq + 2 nkv], Q rows then K then V, as llama.cpp's converters
// write for Phi-3, Falcon, ...) split into three row ranges; blk.il.attn_output. With biases,
// also their .bias vectors (attn_qkv.bias split the same way); fails naming what is missing.
void bind_attention(const TensorBinder& b, const Hparams& hp, const LayerNames& name, LayerWeights& L, AttnBiases biases);

// The layer's gated FFN (SwiGLU, GeGLU, ReLU llama, Bamboo): blk.il.ffn_norm, ffn_gate, ffn_up,
// the down projection and predictor (bind_ffn_down_and_predictor), with `gating`; or, in a file
// bundled by neuron (`ember prepare --bundle`, kFfnBundleParts), blk.il.ffn_bundle bound as the
// three strided views gate, up and down_t, and the predictor.
void bind_gated_ffn(const TensorBinder& b, const Hparams& hp, const LayerNames& name, FfnWeights& f, FfnGating gating);

// The layer's mixture-of-experts FFN (Mixtral, Qwen3-MoE; model/moe.hpp): blk.il.ffn_norm, the
// router ffn_gate_inp and the experts' ffn_gate_exps / ffn_up_exps (ne = [n_embd, n_ff_exp,
// n_expert]) and ffn_down_exps ([n_ff_exp, n_embd, n_expert]), each expert a 2-D slice, with
// hp.n_expert / n_expert_used.
void bind_moe_ffn(const TensorBinder& b, const Hparams& hp, const LayerNames& name, LayerWeights& L, int64_t n_ff_exp);

// token_embd, output_norm and output (tied to token_embd when absent).
void bind_embeddings(const TensorBinder& b, Model& m);
// The down projection of layer name.il: blk.il.ffn_down.weight and/or the neuron-major
// blk.il.ffn_down_t.weight (ne = [n_embd, n_ff]; PowerInfer's files have only this one), at least
// one of them; plus the optional predictor blk.il.fc1.weight (ne = [n_embd, rank]) and
// blk.il.fc2.weight (ne = [rank, n_ff]), both or neither.
void bind_ffn_down_and_predictor(const TensorBinder& b, const Hparams& hp, const LayerNames& name, FfnWeights& f);
// The optional predictor alone (both of fc1 and fc2, or neither).
void bind_ffn_predictor(const TensorBinder& b, const Hparams& hp, const LayerNames& name, FfnWeights& f);
// Sparse-ready metadata: powerinfer.sparse_threshold (f32) and ember.sparse.thresholds (f32
// array [n_layer]) into Model::predictor_threshold / gate_thresholds.
void read_sparse_metadata(Model& m);
// Builds m.rope from m.hp.rope (plus rope_freqs.weight when the file has it).
void build_rope(Model& m);

inline const float* as_floats(const TensorView& t) { return reinterpret_cast<const float*>(t.data); }

}  // namespace ember
