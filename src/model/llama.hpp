// The llama architecture (Llama 1/2/3, SmolLM, Mistral-style dense models, ReluLLaMA, ProSparse)
// and Bamboo (a llama with ReLU on both gate and up: FfnGating::sym).
#pragma once
#include <cstdint>

#include "core/thread_pool.hpp"
#include "model/forward.hpp"
#include "model/model.hpp"

namespace ember {

void load_llama(Model& model);
void llama_forward(const Model& model, ThreadPool& pool, KvCache& kv, Workspace& ws, const int32_t* tokens,
                   int64_t n, int64_t pos0, float* logits, bool logits_all);

}  // namespace ember
