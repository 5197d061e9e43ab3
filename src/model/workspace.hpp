// What a forward pass runs in: the activation buffers (Workspace, allocated once for up to
// max_batch tokens), the spans of sequences a batch holds, and the executors that replace parts of
// the pass (the FFN, the projections, whole layers). The blocks (model/blocks.hpp), the FFN rule
// (model/ffn.hpp) and the executors read these; model/forward.hpp runs them in order.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/thread_pool.hpp"
#include "model/kv_cache.hpp"
#include "model/model.hpp"

namespace ember {

class FfnExecutor;
struct Workspace;

// Replaces the attention block's dense projections when set in Workspace::proj (input sparsity,
// sparse/input_sparse.hpp, and the profiler's input recorder). Each takes the input it projects
// by pointer and may change it (the block reads it no more).
class ProjectionExecutor {
 public:
  virtual ~ProjectionExecutor() = default;
  // ws.q, ws.k, ws.v = the layer's Q, K, V projections of xn (n tokens), before biases.
  virtual void qkv(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* xn, int64_t n, Workspace& ws) = 0;
  // o = wo attn (n tokens), before the bias.
  virtual void out(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* attn, int64_t n, float* o,
                   Workspace& ws) = 0;
};

// One sequence's rows in a forward pass over several sequences (continuous batching): rows
// [first, first + n) of the batch, at positions pos0 .. pos0 + n - 1 of the sequence's own KV
// cache.
struct SeqSpan {
  KvCache* kv = nullptr;
  int64_t first = 0, n = 0, pos0 = 0;
  int64_t seq = 0;  // the session's sequence (a device keeps its KV caches by it)
};

// Runs the layers of a forward pass elsewhere than layer by layer on the CPU (the hybrid
// executor, engine/hybrid_executor.hpp, which places blocks on devices). It starts from the
// embeddings in ws.x and must leave the last layer's output there.
class LayerExecutor {
 public:
  virtual ~LayerExecutor() = default;
  // The batch's n rows hold the spans' tokens in order, each sequence with its own cache.
  virtual void run_layers(const Model& model, ThreadPool& pool, std::span<const SeqSpan> seqs, Workspace& ws,
                          int64_t n) = 0;
  // After run_layers, ws.x holds the last layer's output once this returns (a device may still
  // be copying it back when the head follows on the device: output() waits for both at once).
  virtual void sync_hidden() {}
  // The output head after run_layers, as output_rows (model/blocks.hpp) takes it; false where
  // the head runs on the CPU, which the caller then runs.
  virtual bool output(const Model& model, ThreadPool& pool, Workspace& ws, const int64_t* rows, int64_t n_rows,
                      float* logits) {
    return false;
  }
};

// Rows of a batch whose final hidden state a caller wants (embeddings): rows [first, first + n)
// after the output norm, i.e. what the output head reads, into out (n x n_embd).
struct HiddenRows {
  int64_t first = 0, n = 0;
  float* out = nullptr;
};

// Activation buffers for up to `max_batch` tokens at a time, allocated once.
struct Workspace {
  int64_t max_batch = 0;
  int64_t n_ctx = 0;
  AlignedBuffer<float> x, xn, q, k, v, attn, o, gate, up, cos_sin, att_scratch, logits_tmp;
  AlignedBuffer<float> ffn_in;  // parallel-residual models: the FFN's input, taken before attention
  AlignedBuffer<uint8_t> mm_scratch;
  // Layers with only a neuron-major down (ffn_down_t): 0..n_ff-1 and sparse_axpy's scratch.
  AlignedBuffer<int32_t> all_neurons;
  AlignedBuffer<float> axpy_scratch;
  FfnExecutor* ffn = nullptr;       // null: dense_ffn (model/ffn.hpp)
  LayerExecutor* layers = nullptr;  // null: every layer on the CPU (model/blocks.hpp's cpu_layer)
  ProjectionExecutor* proj = nullptr;  // null: the dense projections (model/blocks.hpp's dense_qkv)
  // The residual stream entering the current layer's FFN (before its norm), n x n_embd, set by
  // the FFN block before it calls the FFN: PowerInfer's predictors read it.
  const float* ffn_residual = nullptr;
  // Mixture-of-experts layers (model/moe.hpp), sized once by init: router probabilities, the
  // chosen experts and their weights, the experts in routing order (one token's scratch), and
  // for one expert the tokens that chose it, their weights, their rows and its output for them.
  std::vector<float> moe_logits, moe_weights, moe_token_w, moe_x, moe_out;
  std::vector<int32_t> moe_ids, moe_order, moe_tokens;
  // One token's chosen experts side by side (decode): their neuron values, up products and
  // outputs, and the scratch of their downs' quantized inputs.
  std::vector<float> moe_values, moe_up, moe_each_out;
  std::vector<uint8_t> moe_each_scratch;
  // A prompt's tokens grouped by expert (slots: each token once per chosen expert, in expert
  // order): moe_tokens / moe_token_w per slot, each expert's first slot, the experts chosen,
  // the slots' quantized inputs and neuron values (moe_values), those values quantized, and a
  // 64 x 64 tile of floats per thread.
  std::vector<int32_t> moe_first, moe_active;
  std::vector<uint8_t> moe_slot_x, moe_slot_h;
  std::vector<float> moe_tile;
  // The position of each row whose RoPE angles cos_sin holds (model/blocks.cpp).
  std::vector<int64_t> angles_pos;

  void init(const Model& model, int64_t max_batch, int64_t n_ctx, int n_threads);
  size_t bytes() const;
};

}  // namespace ember
