// Running tokens through a model: the per-sequence workspace and the forward entry point.
#pragma once
#include <cstdint>

#include "core/aligned_buffer.hpp"
#include "core/thread_pool.hpp"
#include "model/kv_cache.hpp"
#include "model/model.hpp"
#include "ops/cpu/attention.hpp"

namespace ember {

class FfnExecutor;

// Activation buffers for up to `max_batch` tokens at a time, allocated once.
struct Workspace {
  int64_t max_batch = 0;
  int64_t n_ctx = 0;
  AlignedBuffer<float> x, xn, q, k, v, attn, o, gate, up, cos_sin, att_scratch, logits_tmp;
  AlignedBuffer<uint8_t> mm_scratch;
  // Layers with only a neuron-major down (ffn_down_t): 0..n_ff-1 and sparse_axpy's scratch.
  AlignedBuffer<int32_t> all_neurons;
  AlignedBuffer<float> axpy_scratch;
  FfnExecutor* ffn = nullptr;  // null: dense_ffn (model/ffn.hpp)
  // The residual stream entering the current layer's FFN (before its norm), n x n_embd, set by
  // the forward pass before it calls the FFN: PowerInfer's predictors read it.
  const float* ffn_residual = nullptr;

  void init(const Model& model, int64_t max_batch, int64_t n_ctx, int n_threads);
  size_t bytes() const;
};

// Appends the n tokens' keys and values (ws.k, ws.v) to layer il's cache at pos0 and runs causal
// attention of ws.q over the cache into ws.attn (the step every architecture's layer shares).
void cache_and_attend(ThreadPool& pool, const cpu::AttentionShape& shape, KvCache& kv, Workspace& ws, int64_t il,
                      int64_t n, int64_t pos0);
// ws.q, ws.k, ws.v = the layer's Q, K, V projections of xn (n tokens): one fused matmul when
// the three matrices share a type (cpu::matmul_multi), else one matmul each.
void qkv_projections(ThreadPool& pool, const LayerWeights& L, const float* xn, int64_t n, Workspace& ws);

// Runs tokens[0..n) at positions pos0..pos0+n-1 (n <= ws.max_batch, pos0 + n <= kv.n_ctx),
// appending to the KV cache. Writes logits of the last token to `logits` (n_vocab floats), or
// of every token (n * n_vocab) when `logits_all`.
void forward(const Model& model, ThreadPool& pool, KvCache& kv, Workspace& ws, const int32_t* tokens, int64_t n,
             int64_t pos0, float* logits, bool logits_all);

}  // namespace ember
