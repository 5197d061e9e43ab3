// A loaded model: hyperparameters and weight views into the mmap'd GGUF file (zero-copy).
// Each architecture has a file of its own (llama.cpp, gemma3.cpp, ...) that reads its
// hyperparameters and binds its tensors, registered in architectures.cpp's table; the forward
// pass is one for all of them (model/forward.cpp over the shared blocks of model/blocks.hpp).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "gguf/reader.hpp"
#include "ops/cpu/activation.hpp"
#include "ops/cpu/rope.hpp"
#include "tensor/tensor_view.hpp"

namespace ember {

class ExpertCache;  // model/expert_cache.hpp

// The normalization of a model's attention, FFN and output norms.
enum class NormKind { rms, layer };  // RMSNorm (weight); LayerNorm (weight and bias: OPT)

struct Hparams {
  std::string arch;
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t n_ff = 0;
  int64_t n_ctx_train = 0;
  float norm_eps = 1e-5f;
  cpu::Activation act = cpu::Activation::silu;
  cpu::RopeConfig rope;
  // Architecture-specific settings of the shared blocks (model/blocks.hpp; defaults: none).
  NormKind norm = NormKind::rms;
  float embd_scale = 0.0f;        // embeddings times this (gemma3: sqrt(n_embd)); 0 = none
  int64_t pos_offset = 0;         // learned positions (Model::pos_embd): row pos + pos_offset
  // x + attn(attn_norm x) + ffn(ffn_norm x) (Falcon, Phi-2, GPT-J): the FFN reads the layer's
  // input, not the attention's output; without an ffn_norm it reads attn_norm's output.
  bool parallel_residual = false;
  float attn_scale = 0.0f;        // q.k scale; 0 = 1/sqrt(head_dim)
  int64_t sliding_window = 0;     // window of the local (sliding-window) layers; 0 = none
  std::vector<bool> swa_layers;   // per layer: uses the sliding window (and rope_local)
  cpu::RopeConfig rope_local;     // RoPE of the sliding-window layers (gemma3)
  float final_softcap = 0.0f;     // logits = c * tanh(logits / c); 0 = none
  // Mixture of experts ({arch}.expert_count, expert_used_count; 0 = dense FFNs).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
};

// How an FFN combines its projections; the rule itself (a neuron's firing value and value for
// each gating, with the biases) is written once, in model/ffn.hpp:
//   par:  h = act(gate x) * (up x)        SwiGLU / GeGLU / ReLU llama (ReluLLaMA, ProSparse)
//   sym:  h = act(gate x) * act(up x)     Bamboo (PowerInfer's LLM_FFN_SYM)
//   none: h = act(up x + up_b)            OPT (no gate; PowerInfer's LLM_FFN_SEQ without a gate)
enum class FfnGating { par, sym, none };
const char* ffn_gating_name(FfnGating g);

// A layer bundled by neuron (`ember prepare --bundle`): one byte tensor blk.N.ffn_bundle (I8, ne =
// [stride, n_ff]), row j = neuron j's gate row, up row and neuron-major down row of the type the
// file's kFfnBundleTypeKey names, then padding; bound as three views with the bundle's stride.
constexpr int64_t kFfnBundleParts = 3;
constexpr const char* kFfnBundleTypeKey = "ember.sparse.bundle_type";
// Each neuron's firing frequency in the profile a prepared file was ordered by (F32 array
// [n_layer * n_ff], each layer's hot first; Model::neuron_freq).
constexpr const char* kNeuronFreqKey = "ember.sparse.neuron_freq";

// The FFN of one layer. Neurons are the unit of placement: neuron j is row j of gate and up
// (ne[0] = n_embd) and column j of down (ne[0] = n_ff), or row j of the neuron-major down_t.
struct FfnWeights {
  TensorView norm, gate, up, down;
  FfnGating gating = FfnGating::par;
  // Optional biases (OPT), F32: norm_b of the ffn LayerNorm, up_b [n_ff] added to up x, down_b
  // [n_embd] added to the output.
  TensorView norm_b, up_b, down_b;
  // Optional, present in sparse-ready files (PowerInfer's layout, written by `ember prepare`);
  // empty views (data == nullptr) when the file has none:
  //   down_t: the down projection stored neuron-major, ne = [n_embd, n_ff] (one row per neuron);
  //           PowerInfer's files carry only down_t (down is then empty);
  //   fc1, fc2: the activation predictor, fc2(relu(fc1 x)), ne = [n_embd, rank] and [rank, n_ff];
  //             neuron j is predicted active when its score >= Model::predictor_threshold.
  TensorView down_t, fc1, fc2;

  // The shape, from up (every FFN has it): ne = [n_embd, n_ff].
  int64_t n_embd() const { return up.cols(); }
  int64_t n_ff() const { return up.rows(); }
  bool gated() const { return gating != FfnGating::none; }
  // The matrix whose rows decide whether a neuron fires: gate, or up for an FFN without one.
  const TensorView& firing_matrix() const { return gated() ? gate : up; }
  // Whether the down projection exists only neuron-major (down_t, PowerInfer's files).
  bool down_neuron_major_only() const { return !down.valid(); }
  // Whether each neuron's gate, up and down_t rows lie side by side in one row of a bundle
  // (kFfnBundleParts): reading one neuron's pages reads all three.
  bool rows_bundled() const {
    return gate.valid() && up.valid() && down_t.valid() && up.stride != 0 && gate.stride == up.stride &&
           down_t.stride == up.stride && up.data == gate.data + gate.row_size() &&
           down_t.data == up.data + up.row_size();
  }
};

// A mixture-of-experts FFN (Mixtral, Qwen3-MoE): a router picks, per token, the n_used experts
// of highest softmax probability; the FFN's output is the sum of their outputs weighted by those
// probabilities (renormalised to sum 1 when norm_weights). Each expert is a gated FFN of its own
// (par, SwiGLU), its gate / up / down 2-D slices of the file's 3-D ffn_*_exps tensors; a token
// reads only the rows of its chosen experts. Experts are the coarse-grained version of Ember's
// neurons: the sparse modes and the hybrid do not place or predict them yet and refuse such
// models (model_moe_refusal).
struct MoeWeights {
  TensorView router;                // ffn_gate_inp, ne = [n_embd, n_expert]
  std::vector<FfnWeights> experts;  // n_expert of them
  int64_t n_used = 0;
  bool norm_weights = true;
  // The memory tier's cache that holds this layer's experts (model/expert_cache.hpp): moe_ffn
  // asks it for the chosen ones after routing. Null: every expert in place.
  ExpertCache* cache = nullptr;
  bool valid() const { return router.valid(); }
  int64_t n_expert() const { return static_cast<int64_t>(experts.size()); }
};

struct LayerWeights {
  TensorView attn_norm, wq, wk, wv, wo;
  // OPT: LayerNorm bias and the attention projections' biases (empty views elsewhere).
  TensorView attn_norm_b, bq, bk, bv, bo;
  // The FFN; in a mixture-of-experts layer only its norm (ffn.norm) is bound and `moe` holds
  // the experts.
  FfnWeights ffn;
  MoeWeights moe;
  // Gemma 3: RMSNorm of each q / k head (over head_dim) and of the attention / FFN outputs.
  TensorView q_norm, k_norm, attn_post_norm, ffn_post_norm;

  // The tensors of the attention block (norm, projections, biases, q/k norms, post-norm), and
  // those the FFN block reads besides its neurons (its norm, post-norm and down bias): what a
  // device that holds a layer's hidden state holds, what the planner counts for it and what a
  // token reads. Empty views included (valid() false). Const and mutable (a device's copy).
  template <class L>
  static auto attention_list(L& l) {
    return std::array{&l.attn_norm, &l.attn_norm_b, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq,
                      &l.bk, &l.bv, &l.bo, &l.q_norm, &l.k_norm, &l.attn_post_norm};
  }
  template <class L>
  static auto ffn_block_list(L& l) {
    return std::array{&l.ffn.norm, &l.ffn.norm_b, &l.ffn_post_norm, &l.ffn.down_b};
  }
  auto attention_tensors() const { return attention_list(*this); }
  auto attention_tensors() { return attention_list(*this); }
  auto ffn_block_tensors() const { return ffn_block_list(*this); }
  auto ffn_block_tensors() { return ffn_block_list(*this); }
};

struct Model {
  std::unique_ptr<gguf::Reader> file;
  // Further files whose tensors the views point into (a predictor file attached after load).
  std::vector<std::unique_ptr<gguf::Reader>> side_files;
  Hparams hp;
  TensorView tok_embd, output_norm, output;  // output == tok_embd when tied
  TensorView output_norm_b, pos_embd;        // OPT: final LayerNorm bias, learned positions
  std::vector<LayerWeights> layers;
  std::unique_ptr<cpu::RopeTable> rope;  // built from hp.rope at load
  std::unique_ptr<cpu::RopeTable> rope_local;  // from hp.rope_local, for the swa_layers (gemma3)
  // LongRoPE (phi3): the table a context longer than rope_long_after tokens uses instead of
  // `rope` (llama.cpp's rule: n_ctx > the original context length); null when the model has none.
  std::unique_ptr<cpu::RopeTable> rope_long;
  int64_t rope_long_after = 0;
  // The global RoPE table for a context of n_ctx tokens.
  const cpu::RopeTable& rope_for_context(int64_t n_ctx) const {
    return rope_long && n_ctx > rope_long_after ? *rope_long : *rope;
  }
  // Sparse-ready files: the predictor's score threshold (`powerinfer.sparse_threshold`, 0 when
  // absent) and calibrated per-layer thresholds on |act(gate)| (`ember.sparse.thresholds`,
  // empty when absent). See docs/sparse_formats.md.
  float predictor_threshold = 0.0f;
  // Per-layer predictor score thresholds (`ember.predictor.thresholds`, f32 [n_layer]); when
  // present they replace predictor_threshold layer by layer. Empty when absent.
  std::vector<float> predictor_thresholds;
  std::vector<float> gate_thresholds;
  // Input sparsity (sparse/input_sparse.hpp): per layer, the thresholds of its four input sites
  // (`ember.input_sparsity.thresholds`, f32 [4 n_layer], layer by layer; empty when absent). The
  // same type as sparse/input_site.hpp's InputThresholds (asserted there; model/ cannot include it).
  std::vector<std::array<float, 4>> input_thresholds;
  // Beside them, the share of each site's input entries they drop on the calibration corpus
  // (`ember.input_sparsity.sparsity`, f32 [4 n_layer]; empty when absent: files written before
  // the key existed).
  std::vector<std::array<float, 4>> input_sparsity;
  // What the predictor (fc1) reads: the residual stream entering the FFN, before ffn_norm, as
  // PowerInfer's models and converter do (true), or the FFN's own input after ffn_norm, as
  // `ember train-predictor` trains (false). From `ember.predictor.input` (predictor_input_key).
  bool predictor_on_residual = false;
  // Weights held in memory rather than in the file: matrices repacked for the dense kernels
  // (model/repack.hpp); views point into them.
  std::vector<AlignedBuffer<uint8_t>> owned_weights;
  // The layers' views as the file lays them out, kept before repacking where something needs
  // that layout besides the repacked one (input sparsity builds its input-channel-major copies
  // from it: sparse/input_sparse.hpp); empty otherwise (then `layers` is the file's layout). The
  // views point into the file's map, which stays mapped.
  std::vector<LayerWeights> file_layers;
  const LayerWeights& file_layer(size_t l) const { return file_layers.empty() ? layers[l] : file_layers[l]; }
  // The output matrix as the file lays it out, kept with file_layers (a GPU holding the output
  // head copies it); empty otherwise (then `output` is the file's layout).
  TensorView file_output;
  const TensorView& output_in_file() const { return file_output.valid() ? file_output : output; }

  // Each neuron's firing frequency in the profile a prepared file was ordered by (kNeuronFreqKey):
  // entry l * n_ff + i for layer l's neuron i; empty where the file has none.
  std::vector<float> neuron_freq;
  // Per layer, how many of its first neurons have their FFN rows kept resident out of the file's
  // map (model/hot_rows.hpp: a model larger than its memory budget); empty: none.
  std::vector<int64_t> hot_neurons;
  int64_t hot_neurons_of(size_t layer) const { return layer < hot_neurons.size() ? hot_neurons[layer] : 0; }

  // The memory tier (model/expert_cache.hpp): where the experts do not fit the memory budget, the
  // cache that holds the chosen ones and rebinds their views (null: every expert in place).
  std::shared_ptr<ExpertCache> expert_cache;
  // Where a dense model does not fit its memory budget: the bytes of weights that may stay
  // resident (repacked or copied out of the file); the others are read from the file's map as
  // the sparse path needs their rows (0: no budget binds).
  size_t resident_weight_budget = 0;

  // Bytes of weights read per generated token (every layer tensor plus the output matrix).
  size_t weight_bytes_per_token() const;
  // Of those, the bytes of the experts a token runs (n_used per mixture layer; 0 for a dense model).
  size_t expert_bytes_per_token() const;
  size_t file_bytes() const { return file->file_size(); }
};

// Whether any layer is a mixture of experts, and the refusal of a part that computes FFNs
// neuron by neuron (sparse modes, profiling, predictors, planning, the hybrid): empty when the
// model has none, else a message naming `what` and the model.
bool model_has_moe(const Model& model);
std::string model_moe_refusal(const Model& model, const std::string& what);

// The predictor input a file declares in `ember.predictor.input`: "residual" (true) or
// "ffn_input" (false). Absent: PowerInfer's convention (residual) in model files, Ember's
// (ffn_input) in `ember-predictor` files, which always came from `ember train-predictor`.
constexpr const char* kPredictorInputKey = "ember.predictor.input";
bool predictor_reads_residual(const gguf::Reader& r);

// An architecture Ember runs: its GGUF name and its loader (hyperparameters, tensor binding and
// the settings of the shared blocks, model/blocks.hpp), one file each (model/llama.cpp, ...),
// registered in one table (model/architectures.cpp). docs/architecture.md says how to add one.
struct ArchSynth;  // model/arch_synth.hpp
struct Architecture {
  const char* name;  // general.architecture
  void (*load)(Model& model);
  const ArchSynth* synth;  // what `ember synth` writes for it
  // The built-in chat style of its files that carry no tokenizer.chat_template (null: ChatML).
  const char* chat_fallback = nullptr;
};
// The table (model/architectures.cpp), in the order of messages.
std::span<const Architecture> architectures();
// Its row; null when `name` is not in it.
const Architecture* find_architecture(const std::string& name);
// "llama, bamboo, ..." for messages.
std::string architecture_names();
// The chat style of a loaded model's file without a template (its row's chat_fallback).
const char* chat_fallback_of(const Model& model);

// Opens a GGUF file and binds an architecture Ember knows; errors name what is missing.
std::unique_ptr<Model> load_model(const std::string& path);

}  // namespace ember
