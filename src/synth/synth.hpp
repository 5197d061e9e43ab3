// Synthetic models of every architecture in the table (model/architectures.cpp: each row says
// what its files hold, model/arch_synth.hpp): a valid GGUF with llama.cpp's metadata keys and
// tensor names, random weights (deterministic for a seed) and a working byte-level BPE vocabulary.
// They stand in for models that no registry ships (ReLU llamas) and give tests and benchmarks
// models of real shapes (up to 7B) without a download.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/writer.hpp"
#include "model/arch_synth.hpp"
#include "tensor/dtype.hpp"

namespace ember {

// The predictor rank synth writes for `opts` (predictor_rank, or its default).
int64_t synth_predictor_rank(const SynthOptions& opts);

// Presets: "tiny", "smollm2-135m", "1.1b" (TinyLlama shapes), "7b" (Llama-2-7B shapes),
// "mistral-7b" (Mistral-7B / TurboSparse-Mistral-7B shapes: grouped-query attention, n_ff 14336).
// Throws ember::Error naming the known presets for any other name.
SynthOptions synth_preset(const std::string& name);
const std::vector<std::string>& synth_preset_names();
// The FFN activation an architecture has unless told otherwise (the first of its row's
// ArchSynth::acts: relu for bamboo and opt, gelu for falcon, silu for the others; `ember synth`
// without --act). Throws naming the architectures for an unknown one.
FfnActivation synth_default_activation(const std::string& arch);
// `o` for architecture `arch` as its row asks (model/arch_synth.hpp): its default activation, no
// grouped-query attention or output matrix of its own where it has none (OPT), experts where it
// needs them (4, 2 used). What every test that loops over the architecture table starts from.
SynthOptions synth_options_for(SynthOptions o, const std::string& arch);


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
