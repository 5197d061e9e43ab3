// Synthetic llama-architecture models: a valid GGUF with llama.cpp's metadata keys and tensor
// names, random weights (deterministic for a seed) and a working byte-level BPE vocabulary.
// They stand in for models that no registry ships (ReLU llamas) and give tests and benchmarks
// models of real shapes (up to 7B) without a download.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/writer.hpp"
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

// The predictor rank synth writes for `opts` (predictor_rank, or its default).
int64_t synth_predictor_rank(const SynthOptions& opts);

// Presets: "tiny", "smollm2-135m", "1.1b" (TinyLlama shapes), "7b" (Llama-2-7B shapes),
// "mistral-7b" (Mistral-7B / TurboSparse-Mistral-7B shapes: grouped-query attention, n_ff 14336).
// Throws ember::Error naming the known presets for any other name.
SynthOptions synth_preset(const std::string& name);
const std::vector<std::string>& synth_preset_names();
// The FFN activation an architecture has unless told otherwise: relu for bamboo and opt, gelu
// for falcon, silu for the others (`ember synth` without --act).
FfnActivation synth_default_activation(const std::string& arch);
// Parses "silu" / "relu" / "gelu".
FfnActivation parse_ffn_activation(const std::string& s);
const char* ffn_activation_name(FfnActivation a);

// Throws ember::Error naming the first invalid option (e.g. n_head not dividing n_embd, a row
// length that is not a multiple of the type's block size).
void validate(const SynthOptions& opts);

// Called after each layer's tensors are generated: (layers done, n_layer).
using SynthProgress = std::function<void(int64_t done, int64_t total)>;

// Builds the model in a Writer (holding only the encoded tensor bytes). Weights are roughly
// normal with standard deviation 1/sqrt(fan_in) (fan_in = ne[0]), norm weights near 1. Every
// row has its own random stream, so the bytes depend on the seed only, not on the thread count.
gguf::Writer synth_model(const SynthOptions& opts, const SynthProgress& progress = {});
// synth_model, then written to `path`.
void synth_write(const SynthOptions& opts, const std::string& path, const SynthProgress& progress = {});

// The vocabulary `synth_model` writes: 256 byte tokens in GPT-2's byte-to-unicode spelling
// (token id = byte value), the control tokens, then merged tokens up to n_vocab; `merges` holds
// one "left right" entry per merged token, in rank order. With `symbol_merges` the letter merges are preceded by every pair of digits, spaces,
// newlines, tabs and common punctuation, and space + each of them, so that where a
// pre-tokenizer splits numbers, whitespace and punctuation shows in the token ids.
struct SynthVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // 1 normal, 3 control
  std::vector<std::string> merges;
  int32_t bos_id = 0;
  int32_t eos_id = 0;
};
SynthVocab synth_vocab(int64_t n_vocab, bool symbol_merges = false);

// The per-neuron firing probabilities of layer `il` under opts.sparsity / opts.zipf (empty when
// the profile is off).
std::vector<float> synth_firing_probabilities(const SynthOptions& opts, int64_t il);

// Bytes of the file synth_model would write (header estimate included).
uint64_t synth_file_size(const SynthOptions& opts);

}  // namespace ember
