// OPT (Meta's Open Pre-trained Transformers; PowerInfer runs its ReLU FFN sparsely), from the
// GGUF names PowerInfer's converter (convert-hf-to-powerinfer-gguf.py, OptModel) writes:
//
//   x = token_embd[tok] + position_embd[pos + 2]        (learned positions, HF's offset of 2)
//   per layer:  h = x + attn_output(attn(LN(x; attn_norm)))          q, k, v, output with biases
//               x = h + down(relu(up(LN(h; ffn_norm)) + up_b)) + down_b       (no gate)
//   logits = output(LN(x; output_norm)), output tied to token_embd when output.weight is absent
//
// LN is LayerNorm with weight and bias (opt.attention.layer_norm_epsilon, default 1e-5: HF's
// OPT value; PowerInfer's loader reads no key). Attention has no rotary embedding; q.k is scaled
// by 1/sqrt(head_dim). The down projection is ffn_down (n_ff -> n_embd) or, in PowerInfer's
// files, only the neuron-major ffn_down_t with its bias ffn_down_t.bias.
#pragma once
#include <cstdint>

#include "core/thread_pool.hpp"
#include "model/forward.hpp"
#include "model/model.hpp"

namespace ember {

constexpr int64_t kOptPositionOffset = 2;  // HF OPTLearnedPositionalEmbedding

void load_opt(Model& model);
void opt_forward(const Model& model, ThreadPool& pool, KvCache& kv, Workspace& ws, const int32_t* tokens, int64_t n,
                 int64_t pos0, float* logits, bool logits_all);

}  // namespace ember
