// Continuous batching: one engine thread drives a Session of n sequences (each its own KV
// cache) and runs, at every step, one forward pass over the next token of every sequence that
// is generating plus a chunk of the prompt of any that is starting, so the weights are read
// once per step for all of them. Requests join and leave between steps. Each generation keeps
// its own sampler, stop strings and limits (Generation, engine/generator.hpp) and hands its text
// to the request's thread through a Job, so a slow client never holds up the step.
//
// Prompt chunks: a step takes at most the session's batch size (n_batch) of tokens in all. The
// generating sequences' tokens come first; starting prompts fill what is left, oldest request
// first, at most `prompt_chunk` tokens each while others are generating (so one long prompt
// delays the others' next token by one chunk's time, not by the whole prompt's).
//
// The prompt cache works per sequence: a job keeps the longest prefix of its prompt that its
// sequence already holds (cached_prefix) and evaluates only the rest.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/embedding.hpp"
#include "engine/generator.hpp"
#include "engine/session.hpp"
#include "model/expert_cache.hpp"
#include "sparse/map_reads.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember {

struct BatchEngineOptions {
  // Most prompt tokens one starting sequence evaluates in a step while others are generating
  // (alone it takes the whole batch). 0: the session's batch size.
  int64_t prompt_chunk = 128;
};

class BatchEngine {
 public:
  // Output of a job since the last wait: text (valid UTF-8, never the start of a stop string)
  // and the log-probabilities of the tokens sampled since the previous piece (GenerateParams::
  // n_logprobs). A piece with empty text carries the last tokens' log-probabilities only.
  struct Piece {
    std::string text;
    std::vector<TokenLogprobs> logprobs;
  };

  // One generation (or embedding) in the batch. The engine thread produces; the request's
  // thread waits.
  class Job {
   public:
    // Waits up to `timeout` for output or the end; appends the pieces produced so far to `out`.
    // Returns false once the job has ended and everything has been handed out.
    bool wait(std::vector<Piece>& out, std::chrono::milliseconds timeout);
    // Asks the engine to end the job at its next step (finish: cancelled). wait() still
    // reports the end.
    void cancel();
    // After wait() returned false: the counts and why it ended; error() is nonempty when the
    // engine failed to run the job (the message says why), and request_error() says whether the
    // job's own parameters were at fault (its grammar broke a bound: GrammarError) rather than
    // the engine.
    const GenerateResult& result() const { return result_; }
    const std::string& error() const { return error_; }
    bool request_error() const { return request_error_; }
    // An embedding job's pooled vector (not normalized) once wait() returned false; empty when it
    // was cancelled or failed.
    const std::vector<float>& embedding() const { return embedding_; }

   private:
    friend class BatchEngine;
    bool finished() const { return gen_ ? gen_->done() : embed_done_; }
    // Engine side.
    int seq_ = 0;
    std::vector<int32_t> prompt_;
    int64_t n_done_ = 0;  // prompt tokens in the cache (the cached prefix, then evaluated chunks)
    int32_t next_ = -1;   // the sampled token the next step evaluates
    std::unique_ptr<Generation> gen_;  // null for an embedding
    std::unique_ptr<Pooler> pooler_;   // an embedding's: its tokens' hidden states pooled so far
    std::vector<float> hidden_;        // an embedding's chunk of hidden states
    bool embed_done_ = false;
    std::vector<TokenLogprobs> lp_pending_;
    int prompt_top_ = -1;         // >= 0: the prompt's logprobs with this many alternatives (echo)
    std::vector<float> logits_;   // their chunk's logits (kPromptLogprobChunk x n_vocab)
    std::chrono::steady_clock::time_point t_start_, t_first_;
    // Shared with the request's thread.
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<Piece> out_;
    bool cancel_ = false, ended_ = false;
    GenerateResult result_;
    std::string error_;
    bool request_error_ = false;
    std::vector<float> embedding_;
  };

  // params.n_seq sequences (on the hybrid path too: its devices keep a cache per sequence).
  BatchEngine(const Model& model, const Tokenizer& tok, const SessionParams& params,
              const BatchEngineOptions& options = {});
  ~BatchEngine();  // cancels running jobs and stops the engine thread
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  // Starts generating on sequence `seq`, which the caller holds (no other job runs on it until
  // this one has ended). Keeps the longest prefix of `prompt` the sequence holds and drops the
  // rest of its cache. Throws ember::Error for an empty prompt or one that does not fit.
  std::shared_ptr<Job> start(int seq, std::vector<int32_t> prompt, const GenerateParams& params);

  // Embeds `tokens` on sequence `seq` (held as for start): they are evaluated from position 0
  // (an embedding needs every token's state, so the prompt cache is not used; the sequence's
  // cache holds them afterwards) in chunks beside the other jobs, and their final hidden states
  // pooled (engine/embedding.hpp). The job has no text; result().n_prompt counts the tokens and
  // embedding() is the vector. Throws ember::Error for no tokens or more than the context.
  std::shared_ptr<Job> embed(int seq, std::vector<int32_t> tokens, Pooling pooling);

  // Prompt tokens sequence `seq` would take from its cache; only for a sequence without a job.
  int64_t cached_prefix(int seq, const std::vector<int32_t>& prompt) const;

  int n_seq() const { return session_.n_seq(); }
  int64_t n_ctx() const { return session_.n_ctx(); }
  int n_threads() const { return session_.n_threads(); }
  size_t kv_bytes() const { return session_.kv_bytes(); }
  // Forward passes run, and the tokens (rows) they held, since start: their ratio is the mean
  // batch.
  uint64_t steps() const;
  uint64_t step_rows() const;
  // Tokens the sequences' caches held after the last step (KV cache use).
  int64_t kv_tokens() const;
  // The memory tier's counts after the last step (model/expert_cache.hpp); nullopt without one.
  std::optional<ExpertCacheStats> expert_stats() const;
  // A dense model's rows read from the file's map after the last step (sparse/map_reads.hpp);
  // nullopt where the model fits its budget.
  std::optional<MapReadStats> map_read_stats() const;

 private:
  void loop();
  // One forward pass over the jobs' next tokens and prompt chunks; then samples.
  void step(std::vector<std::shared_ptr<Job>>& jobs);
  void end(Job& job, const std::string& error = {}, bool request_error = false);
  // Ends a job before its time (cancelled, failed, shutdown).
  void abort(Job& job, const std::string& error = {}, bool request_error = false);
  // A prompt chunk of n tokens just evaluated for an echo job: its tokens' log-probabilities.
  void prompt_logprobs(Job& job, int64_t n);
  std::shared_ptr<Job> enqueue(std::shared_ptr<Job> job);

  const Model& model_;
  const Tokenizer& tok_;
  BatchEngineOptions opts_;
  Session session_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> incoming_;
  bool stopping_ = false;
  uint64_t steps_ = 0, step_rows_ = 0;
  int64_t kv_tokens_ = 0;
  std::optional<ExpertCacheStats> expert_stats_;
  std::optional<MapReadStats> map_read_stats_;
  // step()'s lists, kept between steps (the engine thread's only).
  std::vector<Session::SeqEval> items_;
  std::vector<Job*> owners_;
  std::thread thread_;
};

}  // namespace ember
