// A Session runs sequences through a model: it owns the thread pool, the activation workspace
// and one KV cache per sequence (all allocated at creation). Most users run one sequence
// (sequence 0: eval, logits, pos, ...): prompt tokens in batches, generated tokens one at a
// time. The server's continuous batching runs several (SessionParams::n_seq): eval_seqs gives
// one forward pass the new tokens of several sequences, each attending over its own cache.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/thread_pool.hpp"
#include "model/forward.hpp"
#include "model/kv_cache.hpp"
#include "engine/hybrid_executor.hpp"
#include "model/model.hpp"
#include "model/repack.hpp"
#include "sparse/ffn_sparse.hpp"
#include "sparse/input_sparse.hpp"

namespace ember {

struct SessionParams {
  int n_threads = 0;     // 0: all hardware threads
  int64_t n_ctx = 4096;  // capped at the model's training context
  int64_t n_batch = 512; // tokens per forward pass (all sequences')
  int64_t n_seq = 1;     // sequences, each with its own KV cache of n_ctx positions
  DType kv_type = DType::F32;  // KV cache values: F32 or F16 (the CLI's default)
  SparseFfnOptions sparse; // FFN executor: dense (default) or neuron-sparse
  // Hybrid GPU-CPU FFN (engine/hybrid_executor.hpp) when a budget or a plan is given; its firing
  // threshold is sparse.threshold.
  HybridOptions hybrid;
  bool hybrid_on() const {
    return hybrid.vram_budget > 0 || hybrid.vram_auto || !hybrid.plan_path.empty() || hybrid.given;
  }
};

class Session {
 public:
  Session(const Model& model, const SessionParams& params);

  // Appends tokens to a sequence (in batches of at most max_batch()); afterwards logits(seq)
  // holds the last token's logits.
  void eval(const std::vector<int32_t>& tokens);
  void eval(const int32_t* tokens, int64_t n, int seq = 0);
  // As eval, but also writes every token's logits (n * n_vocab floats) to `all_logits`.
  void eval_all_logits(const int32_t* tokens, int64_t n, float* all_logits);
  const float* logits() const { return logits(0); }

  // New tokens of one sequence in a batched step.
  struct SeqEval {
    int seq = 0;
    const int32_t* tokens = nullptr;
    int64_t n = 0;
    // Set: the pass writes the final hidden state of each of these tokens here (n x n_embd,
    // model/forward.hpp's HiddenRows: embeddings) instead of the last one's logits, and
    // logits(seq) keeps what it held.
    float* hidden = nullptr;
    // Set (without `hidden`): every token's logits are written here (n x n_vocab), and logits(seq)
    // holds the last one's.
    float* logits = nullptr;
  };
  // One forward pass over several sequences' new tokens (each sequence at most once, n >= 1,
  // at most max_batch() tokens in all; one sequence alone without `hidden` is eval's);
  // afterwards logits(seq) holds each one's last token's logits.
  void eval_seqs(std::span<const SeqEval> items);

  int n_seq() const { return static_cast<int>(seqs_.size()); }
  int64_t max_batch() const { return ws_.max_batch; }
  const float* logits(int seq) const { return at(seq).logits.data(); }
  int64_t pos(int seq = 0) const { return static_cast<int64_t>(at(seq).tokens.size()); }
  int64_t n_ctx() const { return seqs_[0].kv.n_ctx; }
  void reset(int seq = 0) { at(seq).tokens.clear(); }
  // Drops the cached positions from `pos` on (pos <= current position).
  void truncate(int64_t pos, int seq = 0);
  // The tokens the KV cache holds, position by position (pos() of them).
  const std::vector<int32_t>& tokens(int seq = 0) const { return at(seq).tokens; }

  const Model& model() const { return model_; }
  ThreadPool& pool() { return pool_; }
  int n_threads() const { return pool_.size(); }
  size_t kv_bytes() const { return seqs_[0].kv.bytes() * seqs_.size(); }  // all sequences
  size_t workspace_bytes() const { return ws_.bytes(); }
  // The neuron-sparse FFN executor; null in dense mode.
  SparseFfn* sparse_ffn() { return sparse_.get(); }
  // Replaces the FFN executor (e.g. the profiler's); null restores the session's own (dense,
  // sparse or hybrid). Throws naming why when the executor cannot run the model
  // (FfnExecutor::refusal). The executor must outlive its use.
  void set_ffn_executor(FfnExecutor* e);
  // Replaces the attention projections' executor (the profiler's recorder); null restores the
  // session's own (input sparsity's, or the dense projections).
  void set_projection_executor(ProjectionExecutor* e);
  // The input-sparsity executor; null unless --sparse-mode input.
  InputSparseExecutor* input_sparse() { return input_.get(); }
  // Runs the dense path (no FFN or projection executor) instead of input sparsity's executor, or
  // back to it: both side by side in one process, on the same pages, alternating
  // (`ember bench --versus-dense`). Input mode repacks every matrix as a dense session does
  // (repack_scope_for), so its dense path is a dense session's, bit for bit. Refused in the other
  // sparse modes and on the hybrid path, whose matrices keep a gatherable layout that the dense
  // session's do not.
  void set_dense(bool dense);
  // The hybrid FFN executor; null unless SessionParams::hybrid_on().
  HybridExecutor* hybrid() { return hybrid_.get(); }

 private:
  FfnExecutor* own_ffn() {
    if (hybrid_) return hybrid_.get();
    if (input_) return input_.get();
    return sparse_.get();
  }
  struct Seq {
    KvCache kv;
    std::vector<int32_t> tokens;  // tokens[i] sits at position i of the cache
    std::vector<float> logits;    // of the last token evaluated
  };
  Seq& at(int seq);
  const Seq& at(int seq) const;

  const Model& model_;
  ThreadPool pool_;
  std::vector<Seq> seqs_;
  Workspace ws_;
  std::unique_ptr<SparseFfn> sparse_;
  std::unique_ptr<HybridExecutor> hybrid_;
  std::unique_ptr<InputSparseExecutor> input_;
  // eval_seqs' scratch: the rows' tokens, spans and output rows, and their logits.
  std::vector<int32_t> batch_tokens_;
  std::vector<SeqSpan> batch_spans_;
  std::vector<int64_t> batch_rows_;
  std::vector<HiddenRows> batch_hidden_;
  std::vector<float> batch_logits_;
};

int default_thread_count();

// How far the dense kernels' repacking at load (model/repack.hpp) may go for a session that runs
// its FFN in `mode`, on the hybrid path or not: the FFN's rows stay in a gatherable layout where
// a sparse path gathers them (up and down in every sparse mode, the gate too in predictor mode
// and on the hybrid path, which compute it for some neurons only).
RepackScope repack_scope_for(FfnMode mode, bool hybrid);

// Repacks the model for a session in `mode` within `scope` (repack_for_dense_kernels): in input
// mode, and on the hybrid path, it first keeps the file's layout (Model::file_layers), from which
// input sparsity builds its copies and a GPU copies the attention blocks it holds. Whatever
// repacks a model for a session goes through here.
// Where the model has a resident_weight_budget, the repacked and copied matrices stay within it.
RepackStats repack_for_session(Model& model, FfnMode mode, RepackScope scope, ResidentWeights resident,
                               bool hybrid = false);

}  // namespace ember
