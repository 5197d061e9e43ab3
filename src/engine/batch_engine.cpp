#include "engine/batch_engine.hpp"

#include <algorithm>
#include <utility>

#include "core/error.hpp"
#include "core/log.hpp"

namespace ember {

namespace {
// The most prompt tokens a step evaluates for a job that wants every one's log-probability (each
// needs its row of logits).
constexpr int64_t kPromptLogprobChunk = 32;

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

bool BatchEngine::Job::wait(std::vector<Piece>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !out_.empty() || ended_; });
  for (Piece& p : out_) out.push_back(std::move(p));
  out_.clear();
  return !ended_;
}

void BatchEngine::Job::cancel() {
  std::lock_guard lk(mu_);
  cancel_ = true;
}

BatchEngine::BatchEngine(const Model& model, const Tokenizer& tok, const SessionParams& params,
                         const BatchEngineOptions& options)
    : model_(model), tok_(tok), opts_(options), session_(model, params) {
  EMBER_CHECK(session_.max_batch() >= session_.n_seq(),
              "a batch of {} tokens cannot hold one token of each of {} sequences: raise the batch size (-b) or "
              "lower --parallel",
              session_.max_batch(), session_.n_seq());
  EMBER_CHECK(opts_.prompt_chunk >= 0, "the prompt chunk must not be negative, got {}", opts_.prompt_chunk);
  if (opts_.prompt_chunk == 0) opts_.prompt_chunk = session_.max_batch();
  thread_ = std::thread([this] { loop(); });
}

BatchEngine::~BatchEngine() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t BatchEngine::cached_prefix(int seq, const std::vector<int32_t>& prompt) const {
  return ember::cached_prefix(session_.tokens(seq), prompt);
}

int64_t BatchEngine::kv_tokens() const {
  std::lock_guard lk(mu_);
  return kv_tokens_;
}

std::optional<MapReadStats> BatchEngine::map_read_stats() const {
  std::lock_guard lk(mu_);
  return map_read_stats_;
}

std::optional<ExpertCacheStats> BatchEngine::expert_stats() const {
  std::lock_guard lk(mu_);
  return expert_stats_;
}

uint64_t BatchEngine::steps() const {
  std::lock_guard lk(mu_);
  return steps_;
}

uint64_t BatchEngine::step_rows() const {
  std::lock_guard lk(mu_);
  return step_rows_;
}

std::shared_ptr<BatchEngine::Job> BatchEngine::start(int seq, std::vector<int32_t> prompt,
                                                     const GenerateParams& params) {
  EMBER_CHECK(seq >= 0 && seq < session_.n_seq(), "sequence {} does not exist (the engine has {})", seq,
              session_.n_seq());
  EMBER_CHECK(!prompt.empty(), "the prompt is empty");
  EMBER_CHECK(static_cast<int64_t>(prompt.size()) < session_.n_ctx(), "the prompt has {} tokens but the context holds {}",
              prompt.size(), session_.n_ctx());
  auto job = std::make_shared<Job>();
  Job* j = job.get();  // the generation's callbacks run on the engine thread while the job lives
  j->seq_ = seq;
  j->gen_ = std::make_unique<Generation>(
      tok_, model_.hp.n_vocab, prompt, params,
      [j](std::string_view text) {
        std::lock_guard lk(j->mu_);
        j->out_.push_back({std::string(text), std::move(j->lp_pending_)});
        j->lp_pending_.clear();
        return !j->cancel_;
      },
      [j](const TokenLogprobs& t) { j->lp_pending_.push_back(t); });
  j->prompt_ = std::move(prompt);
  if (params.prompt_logprobs && params.n_logprobs >= 0) {
    j->prompt_top_ = params.n_logprobs;
    j->logits_.resize(static_cast<size_t>(kPromptLogprobChunk * model_.hp.n_vocab));
  }
  return enqueue(std::move(job));
}

std::shared_ptr<BatchEngine::Job> BatchEngine::embed(int seq, std::vector<int32_t> tokens, Pooling pooling) {
  EMBER_CHECK(seq >= 0 && seq < session_.n_seq(), "sequence {} does not exist (the engine has {})", seq,
              session_.n_seq());
  EMBER_CHECK(!tokens.empty(), "the input is empty");
  EMBER_CHECK(static_cast<int64_t>(tokens.size()) <= session_.n_ctx(), "the input has {} tokens but the context holds {}",
              tokens.size(), session_.n_ctx());
  auto job = std::make_shared<Job>();
  job->seq_ = seq;
  const int64_t n = static_cast<int64_t>(tokens.size()), d = model_.hp.n_embd;
  job->pooler_ = std::make_unique<Pooler>(pooling, d, n);
  job->hidden_.resize(static_cast<size_t>(std::min(n, session_.max_batch()) * d));
  job->prompt_ = std::move(tokens);
  return enqueue(std::move(job));
}

std::shared_ptr<BatchEngine::Job> BatchEngine::enqueue(std::shared_ptr<Job> job) {
  job->t_start_ = std::chrono::steady_clock::now();
  {
    std::lock_guard lk(mu_);
    EMBER_CHECK(!stopping_, "the engine is stopping");
    incoming_.push_back(job);
  }
  cv_.notify_all();
  return job;
}

void BatchEngine::abort(Job& job, const std::string& error, bool request_error) {
  if (job.gen_) job.gen_->cancel();
  job.embed_done_ = true;
  end(job, error, request_error);
}

void BatchEngine::end(Job& job, const std::string& error, bool request_error) {
  const auto now = std::chrono::steady_clock::now();
  GenerateResult r;
  if (job.gen_) {
    r = job.gen_->result();
  } else {  // an embedding: the whole input read, or cancelled before
    r.n_prompt = static_cast<int64_t>(job.prompt_.size());
    r.finish = job.embedding_.empty() ? FinishReason::cancelled : FinishReason::length;
  }
  r.n_cached = job.result_.n_cached;
  if (job.t_first_ == std::chrono::steady_clock::time_point{}) job.t_first_ = now;
  r.prompt_seconds = seconds_between(job.t_start_, job.t_first_);
  r.gen_seconds = seconds_between(job.t_first_, now);
  {
    std::lock_guard lk(job.mu_);
    if (!job.lp_pending_.empty()) job.out_.push_back({std::string(), std::move(job.lp_pending_)});
    job.result_ = r;
    job.error_ = error;
    job.request_error_ = request_error;
    job.ended_ = true;
  }
  job.cv_.notify_all();
}

void BatchEngine::prompt_logprobs(Job& job, int64_t n) {
  const int64_t nv = model_.hp.n_vocab, size = static_cast<int64_t>(job.prompt_.size());
  if (job.n_done_ == 0) {
    TokenLogprobs first;
    first.token = job.prompt_[0];
    first.known = false;
    job.lp_pending_.push_back(std::move(first));
  }
  for (int64_t r = 0; r < n && job.n_done_ + r + 1 < size; ++r)  // row r predicts the token after it
    job.lp_pending_.push_back(token_logprobs(job.logits_.data() + r * nv, nv,
                                             job.prompt_[static_cast<size_t>(job.n_done_ + r + 1)], job.prompt_top_));
}

void BatchEngine::loop() {
  std::vector<std::shared_ptr<Job>> jobs;  // running, oldest first
  for (;;) {
    std::deque<std::shared_ptr<Job>> joining;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !incoming_.empty() || !jobs.empty(); });
      if (stopping_) break;
      joining.swap(incoming_);
    }
    for (auto& job : joining) {
      // The prompt cache: keep what the sequence holds of this prompt, drop the rest (all of it
      // for an embedding, which reads every token's state).
      job->n_done_ =
          job->gen_ && job->prompt_top_ < 0 ? ember::cached_prefix(session_.tokens(job->seq_), job->prompt_) : 0;
      job->result_.n_cached = job->n_done_;
      session_.truncate(job->n_done_, job->seq_);
      jobs.push_back(std::move(job));
    }
    step(jobs);
    std::erase_if(jobs, [](const std::shared_ptr<Job>& j) { return j->finished(); });
  }
  std::lock_guard lk(mu_);
  for (auto& job : incoming_) jobs.push_back(std::move(job));
  for (auto& job : jobs) abort(*job, "the server is shutting down");
}

void BatchEngine::step(std::vector<std::shared_ptr<Job>>& jobs) {
  for (auto& job : jobs) {
    bool cancel;
    {
      std::lock_guard lk(job->mu_);
      cancel = job->cancel_;
    }
    if (cancel) abort(*job);
  }
  std::erase_if(jobs, [](const std::shared_ptr<Job>& j) { return j->finished(); });
  if (jobs.empty()) return;

  // The generating sequences' next tokens first, then prompt chunks, oldest job first.
  std::vector<Session::SeqEval>& items = items_;
  std::vector<Job*>& owners = owners_;
  items.clear();
  owners.clear();
  int64_t budget = session_.max_batch();
  bool generating = false;
  for (auto& job : jobs) {
    if (!job->gen_ || job->n_done_ < static_cast<int64_t>(job->prompt_.size())) continue;
    items.push_back({job->seq_, &job->next_, 1});
    owners.push_back(job.get());
    --budget;
    generating = true;
  }
  for (auto& job : jobs) {
    const int64_t left = static_cast<int64_t>(job->prompt_.size()) - job->n_done_;
    if (left <= 0 || budget <= 0) continue;
    int64_t chunk = std::min(left, budget);
    if (generating) chunk = std::min(chunk, opts_.prompt_chunk);
    if (job->prompt_top_ >= 0) chunk = std::min(chunk, kPromptLogprobChunk);
    items.push_back({job->seq_, job->prompt_.data() + job->n_done_, chunk, job->gen_ ? nullptr : job->hidden_.data(),
                     job->prompt_top_ >= 0 ? job->logits_.data() : nullptr});
    owners.push_back(job.get());
    budget -= chunk;
  }

  try {
    session_.eval_seqs(items);
  } catch (const std::exception& e) {
    log_warn("a batch of {} sequences failed: {}", items.size(), e.what());
    for (Job* job : owners) abort(*job, e.what());
    return;
  }
  int64_t cached = 0;  // the caches' tokens after this step (the engine thread's to read)
  for (int s = 0; s < session_.n_seq(); ++s) cached += static_cast<int64_t>(session_.tokens(s).size());
  {
    std::lock_guard lk(mu_);
    ++steps_;
    step_rows_ += static_cast<uint64_t>(session_.max_batch() - budget);
    kv_tokens_ = cached;
    if (model_.expert_cache) expert_stats_ = model_.expert_cache->stats();
    if (const SparseFfn* sp = session_.sparse_ffn(); sp && sp->map_read_stats()) map_read_stats_ = *sp->map_read_stats();
  }

  for (size_t i = 0; i < items.size(); ++i) {
    Job& job = *owners[i];
    if (!job.gen_) {  // an embedding: its chunk's states pooled, the vector once all are in
      job.pooler_->add(job.hidden_.data(), job.n_done_, items[i].n);
      job.n_done_ += items[i].n;
      if (job.n_done_ < static_cast<int64_t>(job.prompt_.size())) continue;
      job.embedding_ = job.pooler_->result();
      job.embed_done_ = true;
      job.t_first_ = std::chrono::steady_clock::now();
      end(job);
      continue;
    }
    if (job.n_done_ < static_cast<int64_t>(job.prompt_.size())) {
      if (job.prompt_top_ >= 0) prompt_logprobs(job, items[i].n);
      job.n_done_ += items[i].n;
      if (job.n_done_ < static_cast<int64_t>(job.prompt_.size())) continue;  // more of the prompt next step
      job.t_first_ = std::chrono::steady_clock::now();
    }
    // Sampling runs the request's own rules (its grammar, its callbacks): what fails there ends
    // this job with the error and no other.
    int32_t t = -1;
    try {
      t = job.gen_->next(session_.logits(job.seq_), session_.pos(job.seq_), session_.n_ctx());
    } catch (const std::exception& e) {
      abort(job, e.what(), dynamic_cast<const GrammarError*>(&e) != nullptr);
      continue;
    }
    job.cv_.notify_all();
    if (t < 0) end(job);
    else job.next_ = t;
  }
}

}  // namespace ember
