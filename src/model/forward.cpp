#include "model/forward.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "model/blocks.hpp"
#include "ops/cpu/attention/attention.hpp"
#include "ops/cpu/matmul.hpp"
#include "ops/cpu/sparse/sparse.hpp"

namespace ember {

void forward(const Model& model, ThreadPool& pool, KvCache& kv, Workspace& ws, const int32_t* tokens, int64_t n,
             int64_t pos0, float* logits, bool logits_all, int64_t seq) {
  EMBER_CHECK(n >= 1, "forward: batch of {} tokens (1 to {} allowed)", n, ws.max_batch);
  const SeqSpan one{&kv, 0, n, pos0, seq};
  const int64_t last = n - 1;
  forward_seqs(model, pool, ws, tokens, std::span<const SeqSpan>(&one, 1), logits_all ? nullptr : &last,
               logits_all ? n : 1, logits);
}

void forward_seqs(const Model& model, ThreadPool& pool, Workspace& ws, const int32_t* tokens,
                  std::span<const SeqSpan> seqs, const int64_t* out_rows, int64_t n_out, float* logits,
                  std::span<const HiddenRows> hidden) {
  EMBER_CHECK(!seqs.empty(), "forward: no sequence in the batch");
  int64_t n = 0;
  for (const SeqSpan& sq : seqs) {
    EMBER_CHECK(sq.kv && sq.first == n && sq.n >= 1, "forward: the batch's sequences must cover its rows in order");
    EMBER_CHECK(sq.pos0 >= 0 && sq.pos0 + sq.n <= sq.kv->n_ctx,
                "context is full: {} tokens would exceed the context size of {}; use a larger -c", sq.pos0 + sq.n,
                sq.kv->n_ctx);
    n += sq.n;
  }
  EMBER_CHECK(n <= ws.max_batch, "forward: batch of {} tokens (1 to {} allowed)", n, ws.max_batch);
  for (int64_t t = 0; t < n; ++t)
    EMBER_CHECK(tokens[t] >= 0 && tokens[t] < model.hp.n_vocab, "token id {} is out of range (vocabulary has {})",
                tokens[t], model.hp.n_vocab);
  EMBER_CHECK(out_rows || n_out == n, "forward: {} output rows of a batch of {} without their list", n_out, n);
  for (int64_t i = 0; out_rows && i < n_out; ++i)
    EMBER_CHECK(out_rows[i] >= 0 && out_rows[i] < n, "forward: output row {} is not in the batch of {}", out_rows[i], n);
  EMBER_CHECK(n_out > 0 || !hidden.empty(), "forward: a pass that outputs nothing");
  for (const HiddenRows& h : hidden)
    EMBER_CHECK(h.out && h.first >= 0 && h.n >= 1 && h.first + h.n <= n,
                "forward: hidden rows [{}, {}) are not in the batch of {}", h.first, h.first + h.n, n);
  embed_seqs(model, tokens, seqs, ws.x.data(), ws.o.data());
  if (ws.layers) {
    ws.layers->run_layers(model, pool, seqs, ws, n);
  } else {
    for (int64_t il = 0; il < model.hp.n_layer; ++il) cpu_layer(model, il, pool, seqs, ws, n);
  }
  if (!hidden.empty()) {
    if (ws.layers) ws.layers->sync_hidden();
    hidden_rows(model, ws, hidden);
  }
  if (n_out == 0) return;
  if (ws.layers && ws.layers->output(model, pool, ws, out_rows, n_out, logits)) return;
  output_rows(model, pool, ws, out_rows, n_out, logits);
}

}  // namespace ember
