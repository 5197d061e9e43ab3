// What `ember synth` writes for an architecture, kept in the architecture's row of the table
// (model/architectures.cpp) beside its loader, so that an architecture is described once: its
// tensors with the names, shapes and spreads its converter writes, its metadata keys, and which
// synth options it takes. The generator (synth/synth.cpp) reads the row and adds what is the same
// for every architecture: the random values, the activation profile's edits (found by each
// tensor's role, not its position), PowerInfer's layout and predictors, the vocabulary.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/writer.hpp"
#include "ops/cpu/activation.hpp"
#include "tensor/dtype.hpp"

namespace ember {

enum class FfnActivation { silu, relu, gelu };

struct SynthOptions {
  int64_t n_embd = 64;
  int64_t n_ff = 160;
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t n_vocab = 300;
  int64_t n_ctx = 2048;
  DType type = DType::F32;  // of the 2-D weights, token_embd included; norms are always F32
  FfnActivation act = FfnActivation::silu;
  bool tied = false;        // no output.weight: the output projection reuses token_embd
  uint64_t seed = 1;
  float rope_base = 10000.0f;
  // llama: Llama-3.1's RoPE frequency scaling, as its converter writes it: rope_freqs.weight
  // (head_dim / 2 F32 factors dividing each frequency; here random, 1.3 to 4.7).
  bool rope_freqs = false;
  // tokenizer.ggml.pre, and whether the vocabulary also merges digits, whitespace and punctuation
  // (synth_vocab's symbol_merges), which makes a pre-tokenizer's splits show in the token ids.
  std::string pre = "default";
  bool symbol_merges = false;
  float rms_eps = 1e-5f;
  std::string name = "ember-synth";
  // "llama", or "gemma3": Gemma 3's tensors and keys (QK-norm, post-norms, GeGLU, interleaved
  // sliding-window layers); head_dim (0: n_embd / n_head) may then differ from n_embd / n_head.
  // "bamboo": a llama with ReLU on gate and up (PowerInfer's arch name and keys). "opt": OPT
  // (LayerNorm with biases, learned positions with n_ctx + 2 rows, biases everywhere, ReLU FFN
  // of up and down only), with the names PowerInfer's converter writes.
  // "qwen2": Q/K/V biases. "qwen3": per-head Q/K RMSNorm (head_dim may differ from n_embd /
  // n_head). "phi3": fused attn_qkv and fused gate/up (ffn_up of 2 n_ff rows), LongRoPE factors
  // (rope_factors_short / _long, rope.scaling.attn_factor; context_length 4 n_ctx with
  // original_context_length n_ctx). "falcon": LayerNorm with biases, fused attn_qkv, parallel
  // residual, FFN without gate (act gelu, or relu as ReluFalcon); one input norm with one KV head
  // (Falcon-7B's layout), attn_norm_2 as well with more (40B's).
  std::string arch = "llama";
  int64_t head_dim = 0;
  // Mixture of experts (llama: Mixtral's layout; "qwen3moe" needs it): n_expert experts of
  // width n_ff in every layer, n_expert_used chosen per token by the router ffn_gate_inp (F32).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t sliding_window = 4;  // gemma3: window of the local layers (small, so tests cross it)
  int64_t swa_period = 3;      // gemma3: every swa_period-th layer is global (llama.cpp: 6)
  float final_softcap = 0.0f;  // gemma3: final logit soft-capping, 0 = none (key omitted)
  int n_threads = 0;        // 0: all hardware threads
  // Activation profile (ReLU only; 0 = off): neuron j of each layer fires with probability
  // p_j = min(0.999, C * rank_j^-zipf) on random inputs, ranks a random permutation per layer
  // and C set so that the mean of p_j is 1 - sparsity. See "Activation profile" in synth.cpp.
  float sparsity = 0.0f;
  float zipf = 1.1f;
  // PowerInfer's file layout: PWRI magic, blk.N.ffn_down_t.weight (the down projection
  // neuron-major, ne = [n_embd, n_ff]; the same values as the ffn_down the plain file would have)
  // instead of ffn_down, a predictor blk.N.fc1.weight [n_embd, rank] / blk.N.fc2.weight
  // [rank, n_ff] per layer and powerinfer.sparse_threshold. Predictor types follow PowerInfer's
  // quantizer: Q4_0 in a Q4_0 file, Q5_0 in other quantized files, F16 in float files.
  // With an activation profile (llama, bamboo) the predictor is random but fires at the profile's
  // per-neuron rates: fc1's first unit reads the bias channel of the FFN input (a constant), and
  // fc2 adds probit(p_j) times the spread of the other units' sum to neuron j's score.
  bool powerinfer = false;
  int64_t predictor_rank = 0;       // 0: n_embd / 8 rounded up to a multiple of 32
  float predictor_threshold = 0.0f;  // powerinfer.sparse_threshold
  // Predictable firing (0 = off): every gate row of a layer is a random combination of
  // gate_rank directions shared by the layer, plus independent noise making up a fraction
  // gate_noise of its variance. Whether a neuron fires then depends on x mostly through gate_rank
  // projections, which a predictor MLP of rank about 2 gate_rank can learn (as in real ReLU
  // models); with a fully random gate no low-rank predictor can. The bias channel of the
  // activation profile is set on top, so the firing probabilities stay as above.
  int64_t gate_rank = 0;
  float gate_noise = 0.1f;
};

// A tensor's part in a layer, for the edits synth makes whatever the architecture.
enum class SynthRole { other, q, k, v, o, ffn_norm, gate, up, down, up_bias };

// One tensor as the architecture's converter writes it: values about N(mean, std^2).
struct SynthTensor {
  std::string name;
  DType type;
  int64_t ne0, ne1;  // ne1 == 0: a 1-D tensor
  float mean, std;
  SynthRole role = SynthRole::other;
  int64_t ne2 = 0;   // a 3-D tensor of ne2 matrices [ne0, ne1 / ne2] (the experts of a mixture)
};

// How an architecture carries synth's activation profile (SynthOptions::sparsity; synth.cpp says
// how): through a bias channel of the residual stream (a llama has no biases), or the up bias.
enum class SynthProfile { none, bias_channel, up_bias };
enum class SynthExperts { none, optional, required };

struct ArchSynth {
  std::vector<FfnActivation> acts;  // the FFN activations it takes (--act), its default first
  SynthProfile profile = SynthProfile::none;
  bool powerinfer = false;          // PowerInfer's layout exists for it (down_t, predictors)
  bool gate_rank = false;           // a predictable gate (--gate-rank)
  bool head_dim = false;            // a head size other than n_embd / n_head
  bool rope_freqs = false;          // Llama-3.1's RoPE factors
  bool grouped_kv = true;           // n_head_kv < n_head (`ember synth` sets n_head_kv = n_head without)
  bool tied = false;                // its converter writes no output.weight (`ember synth` ties it)
  SynthExperts experts = SynthExperts::none;
  // Ember's key "<arch>.ffn_activation" names the FFN's activation (llama.cpp has none): the
  // architecture comes with several, and PowerInfer's files, which carry no such key, are ReLU
  // where the plain ones are not. `ember synth` and `ember prepare` write it.
  bool activation_key = false;
  // The layer's tensors in file order (PowerInfer's predictor is synth's to add).
  std::vector<SynthTensor> (*layer)(const SynthOptions& o, int64_t il) = nullptr;
  // Tensors after token_embd, output_norm and output (null: none).
  std::vector<SynthTensor> (*globals)(const SynthOptions& o) = nullptr;
  // The metadata keys after "<arch>.attention.head_count" (null: rms_norm_keys), and after
  // PowerInfer's threshold (rope dimensions, vocabulary size, what is the architecture's own).
  void (*attention_keys)(gguf::Writer& w, const SynthOptions& o) = nullptr;
  void (*keys)(gguf::Writer& w, const SynthOptions& o) = nullptr;
  // "<arch>.context_length" (null: n_ctx).
  int64_t (*context_length)(const SynthOptions& o) = nullptr;
};

// Helpers the architectures' descriptions share.
int64_t synth_head_dim(const SynthOptions& o);  // head_dim, or n_embd / n_head
// "blk.N.", and the spreads 1/sqrt(fan_in) of inputs of n_embd and n_ff.
struct SynthLayerShape {
  SynthLayerShape(const SynthOptions& o, int64_t il);
  std::string prefix;
  float s_embd, s_ff;
  int64_t nkv;  // K/V width
};
// A llama layer (norm, Q, K, V, O, norm, gate, up, down; with o.n_expert a router and experts
// instead of gate, up and down), which most architectures extend.
std::vector<SynthTensor> llama_synth_layer(const SynthOptions& o, int64_t il);
// head_count_kv, rope.freq_base, layer_norm_rms_epsilon under "<arch>.".
void rms_norm_keys(gguf::Writer& w, const SynthOptions& o);
const char* ffn_activation_name(FfnActivation a);
FfnActivation ffn_activation_of(cpu::Activation a);  // a loaded model's (gelu_tanh: gelu)
FfnActivation parse_ffn_activation(const std::string& s);  // "silu" / "relu" / "gelu"

}  // namespace ember
