// The Gemma 3 architecture (`gemma3` in GGUF; text part of Gemma 3 270M .. 27B).
#pragma once
#include <cstdint>

#include "core/thread_pool.hpp"
#include "model/forward.hpp"
#include "model/model.hpp"

namespace ember {

void load_gemma3(Model& model);
void gemma3_forward(const Model& model, ThreadPool& pool, KvCache& kv, Workspace& ws, const int32_t* tokens,
                    int64_t n, int64_t pos0, float* logits, bool logits_all);

}  // namespace ember
