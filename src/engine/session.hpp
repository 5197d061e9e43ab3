// A Session runs one sequence through a model: it owns the thread pool, the KV cache and the
// activation workspace (all allocated at creation), evaluates prompt tokens in batches and
// generated tokens one at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/thread_pool.hpp"
#include "model/forward.hpp"
#include "model/kv_cache.hpp"
#include "engine/hybrid_ffn.hpp"
#include "model/model.hpp"
#include "model/repack.hpp"
#include "sparse/ffn_sparse.hpp"
#include "sparse/input_sparse.hpp"

namespace ember {

struct SessionParams {
  int n_threads = 0;     // 0: all hardware threads
  int64_t n_ctx = 4096;  // capped at the model's training context
  int64_t n_batch = 512; // prompt tokens per forward pass
  DType kv_type = DType::F32;  // KV cache values: F32 or F16 (the CLI's default)
  SparseFfnOptions sparse; // FFN executor: dense (default) or neuron-sparse
  // Hybrid GPU-CPU FFN (engine/hybrid_ffn.hpp) when a budget or a plan is given; its firing
  // threshold is sparse.threshold.
  HybridOptions hybrid;
  bool hybrid_on() const { return hybrid.vram_budget > 0 || !hybrid.plan_path.empty() || hybrid.given; }
};

class Session {
 public:
  Session(const Model& model, const SessionParams& params);

  // Appends tokens to the sequence; afterwards logits() holds the last token's logits.
  void eval(const std::vector<int32_t>& tokens);
  void eval(const int32_t* tokens, int64_t n);
  // As eval, but also writes every token's logits (n * n_vocab floats) to `all_logits`.
  void eval_all_logits(const int32_t* tokens, int64_t n, float* all_logits);
  const float* logits() const { return logits_.data(); }

  int64_t pos() const { return pos_; }
  int64_t n_ctx() const { return kv_.n_ctx; }
  void reset() {
    pos_ = 0;
    tokens_.clear();
  }
  // Drops the cached positions from `pos` on (pos <= current position).
  void truncate(int64_t pos);
  // The tokens the KV cache holds, position by position (pos() of them).
  const std::vector<int32_t>& tokens() const { return tokens_; }

  const Model& model() const { return model_; }
  ThreadPool& pool() { return pool_; }
  int n_threads() const { return pool_.size(); }
  size_t kv_bytes() const { return kv_.bytes(); }
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
  // The hybrid FFN executor; null unless SessionParams::hybrid_on().
  HybridFfn* hybrid_ffn() { return hybrid_.get(); }

 private:
  FfnExecutor* own_ffn() {
    if (hybrid_) return hybrid_.get();
    if (input_) return input_.get();
    return sparse_.get();
  }
  const Model& model_;
  ThreadPool pool_;
  KvCache kv_;
  Workspace ws_;
  std::unique_ptr<SparseFfn> sparse_;
  std::unique_ptr<HybridFfn> hybrid_;
  std::unique_ptr<InputSparseExecutor> input_;
  std::vector<float> logits_;
  int64_t pos_ = 0;
  std::vector<int32_t> tokens_;  // tokens_[i] sits at position i of the cache
};

int default_thread_count();

// How far the dense kernels' repacking at load (model/repack.hpp) may go for a session that runs
// its FFN in `mode`, on the hybrid path or not: the FFN's rows stay in a gatherable layout where
// a sparse path gathers them (up and down in every sparse mode, the gate too in predictor mode
// and on the hybrid path, which compute it for some neurons only).
RepackScope repack_scope_for(FfnMode mode, bool hybrid);

}  // namespace ember
