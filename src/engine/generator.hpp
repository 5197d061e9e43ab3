// The generation loop shared by the CLI and the server: prompt tokens in, a stream of text
// pieces out. It samples, stops at end-of-generation tokens, at a token limit, at the end of the
// context or at stop strings (matched across token boundaries), and hands the caller only
// valid UTF-8 that can never turn out to be the start of a stop string.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/grammar.hpp"
#include "engine/sampler.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember {

class Session;
class Tokenizer;

// Finds the first occurrence of any stop string in a text that arrives in pieces. Text that
// could still be the start of a stop string is held back until the next piece decides it.
class StopMatcher {
 public:
  StopMatcher() = default;
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

  // Appends text; returns what is now safe to emit. After a match stopped() is true, the
  // returned text is everything before the stop string, and later pushes return nothing.
  std::string push(std::string_view text);
  // Returns the held-back text (no stop string can match any more) and clears it.
  std::string flush();
  bool stopped() const { return stopped_; }
  size_t held() const { return pending_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

struct GenerateParams {
  SamplerParams sampling;
  int64_t max_tokens = 128;  // < 0: until the context is full
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // >= 0: report each sampled token's log-probability and this many most likely alternatives
  // (TokenLogprobs, through the LogprobCallback); < 0: none.
  int n_logprobs = -1;
  // With n_logprobs >= 0: also the prompt's tokens' log-probabilities, before the sampled ones
  // (echo; the first prompt token's is unknown). The prompt is then evaluated from its start,
  // whatever the cache holds.
  bool prompt_logprobs = false;
  // Constrained generation (engine/grammar.hpp; the server's structured output): only tokens
  // whose text the grammar can still complete are sampled, end-of-generation only once the text
  // is complete, and generation ends when nothing may follow. `grammar_vocab` holds the
  // tokenizer's token bytes (one per tokenizer, shared).
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const TokenGrammar> grammar_vocab;
};

// A sampled token's log-probability under the model (log-softmax of the raw logits, before any
// sampling setting) and the most likely tokens with theirs, most likely first.
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
  bool known = true;  // false: the first prompt token's (nothing predicts it)
};
// The log-softmax of `logits` at `token`, and the n most likely tokens (ties: lower id first).
TokenLogprobs token_logprobs(const float* logits, int64_t n_vocab, int32_t token, int n);

enum class FinishReason {
  length,     // max_tokens reached
  context,    // the context is full
  eog,        // the model emitted an end-of-generation token
  stop,       // a stop string matched
  cancelled,  // the callback returned false
};
const char* finish_reason_name(FinishReason r);

struct GenerateResult {
  int64_t n_prompt = 0;     // tokens of the prompt
  int64_t n_cached = 0;     // of those, already in the session's cache (generate_cached)
  int64_t n_generated = 0;  // tokens sampled (including a final EOG token, as llama.cpp counts)
  FinishReason finish = FinishReason::length;
  double prompt_seconds = 0;
  double gen_seconds = 0;
};

// Called with each nonempty piece of text (valid UTF-8); return false to stop generating.
using PieceCallback = std::function<bool(std::string_view piece)>;
// Called for each sampled token but an end-of-generation one, before its text reaches the
// PieceCallback (which may hold text back: stop strings, split UTF-8), when
// GenerateParams::n_logprobs >= 0.
using LogprobCallback = std::function<void(const TokenLogprobs&)>;

// One generation's state between forward passes: the sampler (which has seen the prompt), the
// UTF-8 and stop-string filters, the limits and the counts. The caller evaluates tokens (the
// prompt first) and hands next() the logits of the last one; next() samples, reports the token
// and returns it for evaluation, or -1 once the generation has ended (result().finish says
// why). generate runs one on a Session; the server's batch engine runs many side by side.
class Generation {
 public:
  Generation(const Tokenizer& tok, int64_t n_vocab, const std::vector<int32_t>& prompt, const GenerateParams& params,
             PieceCallback on_piece, LogprobCallback on_logprobs = {});
  // `logits`: of the last token evaluated, which sits at position pos - 1 of a context of n_ctx.
  int32_t next(const float* logits, int64_t pos, int64_t n_ctx);
  // Ends the generation from outside (the client went away): finish cancelled, no more text.
  void cancel();
  bool done() const { return done_; }
  GenerateResult& result() { return res_; }

 private:
  void finish(FinishReason why);
  void emit(const std::string& text);

  const Tokenizer& tok_;
  int64_t n_vocab_;
  GenerateParams params_;
  PieceCallback on_piece_;
  LogprobCallback on_logprobs_;
  Sampler sampler_;
  Utf8Streamer utf8_;
  StopMatcher stops_;
  std::optional<GrammarMatcher> matcher_;
  GenerateResult res_;
  int64_t limit_;
  bool cancelled_ = false, done_ = false;
};

// Evaluates `prompt` after what the session already holds (reset it first for a fresh
// sequence), then generates. The prompt must be nonempty and fit in the context (throws
// ember::Error otherwise). The sampler sees the prompt tokens (repetition penalty).
GenerateResult generate(Session& session, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                        const GenerateParams& params, const PieceCallback& on_piece,
                        const LogprobCallback& on_logprobs = {});

// The prompt cache: how many leading tokens of `prompt` the session already holds, at most
// prompt.size() - 1 (the last prompt token is always evaluated, for its logits).
int64_t cached_prefix(const Session& session, const std::vector<int32_t>& prompt);
// The same for a cache holding `held` (Session::tokens of any sequence).
int64_t cached_prefix(const std::vector<int32_t>& held, const std::vector<int32_t>& prompt);

// As generate on a reset session, but the longest prefix of `prompt` the session already holds
// (cached_prefix: the earlier turns of a chat, a shared system prompt) is kept and only the rest
// is evaluated; the cache past that prefix is dropped. The sampler still sees the whole prompt.
// Greedy output equals generate's on a reset session up to the rounding of a different batch
// split of the prompt (tests/test_generator.cpp).
GenerateResult generate_cached(Session& session, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                               const GenerateParams& params, const PieceCallback& on_piece,
                               const LogprobCallback& on_logprobs = {});

}  // namespace ember
