// The architectures Ember runs, one row each: the GGUF name and the loader in the
// architecture's own file. Adding one (docs/architecture.md): a file with its loader and a row.
#include <string>

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

namespace {

constexpr Architecture kArchitectures[] = {
    {.name = "llama", .load = load_llama},
    {.name = "bamboo", .load = load_bamboo},
    {.name = "gemma3", .load = load_gemma3},
    {.name = "opt", .load = load_opt},
    {.name = "qwen2", .load = load_qwen2},
    {.name = "qwen3", .load = load_qwen3},
    {.name = "phi3", .load = load_phi3},
    {.name = "falcon", .load = load_falcon},
    {.name = "qwen3moe", .load = load_qwen3moe},
};

}  // namespace

const Architecture* find_architecture(const std::string& name) {
  for (const Architecture& a : kArchitectures)
    if (name == a.name) return &a;
  return nullptr;
}

std::string architecture_names() {
  std::string s;
  for (const Architecture& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

}  // namespace ember
