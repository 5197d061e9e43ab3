// Running tokens through a model: the forward entry points, over the buffers and executors of
// model/workspace.hpp.
#pragma once
#include <cstdint>
#include <span>

#include "core/thread_pool.hpp"
#include "model/kv_cache.hpp"
#include "model/model.hpp"
#include "model/workspace.hpp"

namespace ember {

// Runs tokens[0..n) at positions pos0..pos0+n-1 (n <= ws.max_batch, pos0 + n <= kv.n_ctx),
// appending to the KV cache: the embedding, the layers, the output head (model/blocks.hpp).
// Writes logits of the last token to `logits` (n_vocab floats), or of every token
// (n * n_vocab) when `logits_all`.
void forward(const Model& model, ThreadPool& pool, KvCache& kv, Workspace& ws, const int32_t* tokens, int64_t n,
             int64_t pos0, float* logits, bool logits_all, int64_t seq = 0);

// A forward pass over several sequences at once: tokens[0..n) are the rows of all of them, and
// seqs (in row order, contiguous, none empty) say whose they are; each appends to its own KV
// cache. logits (n_out x n_vocab) = the logits of rows out_rows[0..n_out) (null: of every row,
// n_out = n; n_out may be 0 when only hidden states are wanted), and each of `hidden` gets its
// rows' final hidden states. Weights are read once for all rows; attention runs per sequence
// (on the hybrid path too: its devices keep a cache per sequence).
void forward_seqs(const Model& model, ThreadPool& pool, Workspace& ws, const int32_t* tokens,
                  std::span<const SeqSpan> seqs, const int64_t* out_rows, int64_t n_out, float* logits,
                  std::span<const HiddenRows> hidden = {});

}  // namespace ember
