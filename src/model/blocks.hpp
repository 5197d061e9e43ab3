// The shared blocks every architecture's layer is composed of (as llama.cpp's graph builders
// share build_norm / build_attn / build_ffn). An architecture file (llama.cpp, gemma3.cpp,
// opt.cpp) only reads its hyperparameters and binds its tensors; which optional part a block
// uses follows from what was bound (a bias, a q/k norm, a post-norm, learned positions) and from
// a few hyperparameters (Hparams::norm, embd_scale, rope tables, sliding-window layers,
// final_softcap). One layer is
//
//   x += post_attn_norm(wo attn(rope(qk_norm(wq n + bq, wk n + bk)), wv n + bv) + bo),  n = attn_norm(x)
//   x += post_ffn_norm(ffn(ffn_norm(x)))
//
// with every named part optional except the projections, the attention and the FFN; a
// parallel-residual model (Hparams::parallel_residual) feeds the FFN ffn_norm of the layer's
// input instead (attn_norm's output when it has no ffn_norm). Q, K and V come from three tensors
// or from one fused attn_qkv (three row ranges of it, model/loader.hpp). The blocks
// work on caller-given buffers (a Workspace, a KV cache and the hidden state x), so that a
// device (device/device.hpp) runs the very same functions on its own copies: the CPU stand-in
// gives the same bits as the CPU.
#pragma once
#include <cstdint>
#include <span>

#include "core/thread_pool.hpp"
#include "model/workspace.hpp"
#include "model/kv_cache.hpp"
#include "model/model.hpp"

namespace ember {

// out = the model's normalization (Hparams::norm: RMSNorm, or LayerNorm with bias b) with weight w
// of n rows x (n_embd each).
void apply_norm(const Model& m, const TensorView& w, const TensorView& b, const float* x, float* out, int64_t n);

// x = the embeddings of tokens[0..n) at positions pos0.. (n x n_embd): the token rows, times
// embd_scale, plus the learned position rows (OPT). `scratch` holds n x n_embd floats.
void embed_block(const Model& m, const int32_t* tokens, int64_t n, int64_t pos0, float* x, float* scratch);

// The same for a batch of several sequences (SeqSpan: each its rows, positions and KV cache).
void embed_seqs(const Model& m, const int32_t* tokens, std::span<const SeqSpan> seqs, float* x, float* scratch);

// The attention rules of layer il, which every device follows (attention_block here, the CUDA
// device's kernels): its RoPE table (null: learned positions, OPT; the local table on a
// sliding-window layer of a model that has one), the sliding window (0: none) and the score scale.
struct AttentionRules {
  const cpu::RopeTable* rope = nullptr;
  bool local_rope = false;  // rope is Model::rope_local
  int64_t window = 0;
  float scale = 1.0f;
};
AttentionRules attention_rules(const Model& m, int64_t il, int64_t n_ctx);

// ws.q, ws.k, ws.v = the layer's dense Q, K, V projections of xn (n tokens): one fused matmul
// when the three matrices share a type (cpu::matmul_multi), else one matmul each.
void dense_qkv(ThreadPool& pool, const LayerWeights& L, const float* xn, int64_t n, Workspace& ws);
// o = the layer's dense output projection of attn (n tokens), before the bias.
void dense_out(ThreadPool& pool, const LayerWeights& L, const float* attn, int64_t n, float* o, Workspace& ws);

// x += the attention block of layer il for n rows of one or several sequences (each span's tokens
// at its positions pos0.., appending their keys and values to layer `kv_layer` of the span's
// cache): everything but the attention itself runs on all rows at once (one pass over each
// weight), each sequence attends over its own cache. L holds the layer's attention tensors (the
// model's, or a device's copies of them). Uses ws.xn, q, k, v, attn, o, cos_sin, att_scratch,
// mm_scratch; a parallel-residual model's FFN input goes to ws.ffn_in. The projections are
// ws.proj's where one is set.
void attention_block(const Model& m, const LayerWeights& L, int64_t il, ThreadPool& pool, std::span<const SeqSpan> seqs,
                     int64_t kv_layer, Workspace& ws, float* x, int64_t n);
// attention_block in its two halves: the heads (ws.attn: norm, Q/K/V, positions, the cache, each
// sequence's attention; a parallel-residual model's FFN input to ws.ffn_in), then the output
// (x += post_norm(wo ws.attn + bo); ws.attn may be changed, an executor masks it in place).
void attention_heads(const Model& m, const LayerWeights& L, int64_t il, ThreadPool& pool, std::span<const SeqSpan> seqs,
                     int64_t kv_layer, Workspace& ws, const float* x, int64_t n);
void attention_output(const Model& m, const LayerWeights& L, int64_t il, ThreadPool& pool, Workspace& ws, float* x,
                      int64_t n);

// The FFN block in its two halves around the FFN itself: xn = ffn_norm(x) (parallel-residual
// models: the input attention_block took from the layer's input, ws.ffn_in); then
// x += post_norm(out).
void ffn_block_input(const Model& m, const LayerWeights& L, const Workspace& ws, const float* x, float* xn,
                     int64_t n);
void ffn_block_output(const Model& m, const LayerWeights& L, float* out, float* x, int64_t n);

// The whole FFN block on the CPU: input, the workspace's executor (dense_ffn when none), output.
void ffn_block(const Model& m, const LayerWeights& L, int64_t il, ThreadPool& pool, Workspace& ws, int64_t n);

// One layer on the CPU: attention_block, then ffn_block, on ws.x with each span's cache's layer il.
void cpu_layer(const Model& m, int64_t il, ThreadPool& pool, std::span<const SeqSpan> seqs, Workspace& ws, int64_t n);

// logits (n_rows x n_vocab) = output(output_norm(x)) of the given rows of ws.x (uses ws.o as
// scratch), or of its first n_rows rows when `rows` is null; soft-capped where the model says so.
void output_rows(const Model& m, ThreadPool& pool, Workspace& ws, const int64_t* rows, int64_t n_rows, float* logits);

// Each HiddenRows' rows of ws.x after the output norm (what the head reads): the final hidden
// states that embeddings pool.
void hidden_rows(const Model& m, const Workspace& ws, std::span<const HiddenRows> rows);

// The output head's tensors: the model's, or a device's copies of them.
struct OutputWeights {
  TensorView norm, norm_b, output;
};
OutputWeights output_weights(const Model& m);
// logits (n x n_vocab) = the head on n contiguous rows x (norm into ws.xn, the output matrix,
// the soft-cap): what output_rows runs, on the given tensors.
void output_block(const Model& m, const OutputWeights& w, ThreadPool& pool, Workspace& ws, const float* x, int64_t n,
                  float* logits);

}  // namespace ember
