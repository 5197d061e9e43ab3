// The architectures Ember runs, one row each: the GGUF name, the loader and what `ember synth`
// writes (model/arch_synth.hpp), both in the architecture's own file. Adding one
// (docs/architecture.md): a file with its loader and synth description, and a row; the tests
// that loop over the table then cover it.
#include <string>

#include "model/arch_synth.hpp"
#include "model/model.hpp"

namespace ember {

void load_llama(Model& model);   // llama.cpp: Llama 1/2/3, SmolLM, Mistral, Mixtral, ReluLLaMA, ProSparse
void load_bamboo(Model& model);  // llama.cpp: a llama with ReLU on gate and up
void load_gemma3(Model& model);  // gemma3.cpp
void load_opt(Model& model);     // opt.cpp
void load_qwen2(Model& model);   // qwen2.cpp
void load_qwen3(Model& model);   // qwen3.cpp
void load_phi3(Model& model);    // phi3.cpp
void load_falcon(Model& model);  // falcon.cpp
void load_qwen3moe(Model& model);  // qwen3.cpp
extern const ArchSynth kLlamaSynth, kBambooSynth, kGemma3Synth, kOptSynth, kQwen2Synth, kQwen3Synth, kQwen3MoeSynth,
    kPhi3Synth, kFalconSynth;

namespace {

const Architecture kArchitectures[] = {
    {.name = "llama", .load = load_llama, .synth = &kLlamaSynth},
    {.name = "bamboo", .load = load_bamboo, .synth = &kBambooSynth},
    {.name = "opt", .load = load_opt, .synth = &kOptSynth},
    {.name = "gemma3", .load = load_gemma3, .synth = &kGemma3Synth, .chat_fallback = "gemma"},
    {.name = "qwen2", .load = load_qwen2, .synth = &kQwen2Synth},
    {.name = "qwen3", .load = load_qwen3, .synth = &kQwen3Synth},
    {.name = "qwen3moe", .load = load_qwen3moe, .synth = &kQwen3MoeSynth},
    {.name = "phi3", .load = load_phi3, .synth = &kPhi3Synth},
    {.name = "falcon", .load = load_falcon, .synth = &kFalconSynth},
};

}  // namespace

const char* chat_fallback_of(const Model& model) {
  const Architecture* a = find_architecture(model.hp.arch);
  return a ? a->chat_fallback : nullptr;
}

const Architecture* find_architecture(const std::string& name) {
  for (const Architecture& a : kArchitectures)
    if (name == a.name) return &a;
  return nullptr;
}

std::span<const Architecture> architectures() { return kArchitectures; }

std::string architecture_names() {
  std::string s;
  for (const Architecture& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

}  // namespace ember
