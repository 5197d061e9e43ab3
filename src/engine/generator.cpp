#include "engine/generator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "engine/session.hpp"
#include "tokenizer/tokenizer.hpp"

namespace ember {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  if (stops_.empty()) return std::exchange(pending_, {});
  // The earliest full match wins; text before it is emitted, the rest dropped.
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    pending_.resize(first);
    return std::exchange(pending_, {});
  }
  // Hold back the longest suffix that is a proper prefix of some stop string. Stop strings are
  // valid UTF-8, so such a suffix starts on a character boundary and what is emitted stays valid.
  size_t hold = 0;
  for (const auto& s : stops_) {
    size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(pending_, {});
}

const char* finish_reason_name(FinishReason r) {
  static constexpr EnumName<FinishReason> kNames[] = {{FinishReason::length, "length"},
                                                      {FinishReason::context, "context"},
                                                      {FinishReason::eog, "eog"},
                                                      {FinishReason::stop, "stop"},
                                                      {FinishReason::cancelled, "cancelled"}};
  return enum_name(kNames, r);
}

Generation::Generation(const Tokenizer& tok, int64_t n_vocab, const std::vector<int32_t>& prompt,
                       const GenerateParams& params, PieceCallback on_piece, LogprobCallback on_logprobs)
    : tok_(tok),
      n_vocab_(n_vocab),
      params_(params),
      on_piece_(std::move(on_piece)),
      on_logprobs_(std::move(on_logprobs)),
      sampler_(params.sampling, n_vocab),
      stops_(params.stop),
      limit_(params.max_tokens < 0 ? INT64_MAX : params.max_tokens) {  // no limit: the context's end stops it
  EMBER_CHECK(!prompt.empty(), "the prompt is empty");
  for (int32_t t : prompt) sampler_.accept(t);
  res_.n_prompt = static_cast<int64_t>(prompt.size());
  if (params_.grammar) {
    EMBER_CHECK(params_.grammar_vocab && params_.grammar_vocab->n_vocab() == n_vocab,
                "a grammar needs the token bytes of the model's vocabulary");
    matcher_.emplace(params_.grammar);
  }
}

void Generation::emit(const std::string& text) {
  if (!text.empty() && !cancelled_ && !on_piece_(text)) cancelled_ = true;
}

void Generation::finish(FinishReason why) {
  done_ = true;
  res_.finish = why;
  if (why == FinishReason::cancelled || why == FinishReason::stop) return;
  emit(stops_.push(utf8_.flush()));  // the held-back text: split UTF-8, a partial stop string
  if (stops_.stopped()) res_.finish = FinishReason::stop;
  emit(stops_.flush());
  if (cancelled_) res_.finish = FinishReason::cancelled;
}

void Generation::cancel() {
  if (done_) return;
  cancelled_ = true;
  finish(FinishReason::cancelled);
}

int32_t Generation::next(const float* logits, int64_t pos, int64_t n_ctx) {
  if (done_) return -1;
  if (res_.n_generated >= limit_) return finish(FinishReason::length), -1;
  if (pos >= n_ctx) return finish(FinishReason::context), -1;
  check_logits(logits, n_vocab_, pos - 1);
  int32_t t;
  if (matcher_) {
    const TokenGrammar& vocab = *params_.grammar_vocab;
    t = sampler_.sample(logits, [&](int32_t v) { return vocab.allows(*matcher_, v); });
    EMBER_CHECK(t >= 0, "the grammar allows no token of the vocabulary here");
  } else {
    t = sampler_.sample(logits);
  }
  sampler_.accept(t, /*generated=*/true);
  ++res_.n_generated;
  const bool eog = tok_.is_eog(t) && (!params_.ignore_eos || matcher_);
  // The end-of-generation token's log-probability is reported where the prompt's are (echo:
  // an evaluator reads the one sampled token after the prompt's), not otherwise.
  if (params_.n_logprobs >= 0 && on_logprobs_ && (!eog || params_.prompt_logprobs))
    on_logprobs_(token_logprobs(logits, n_vocab_, t, params_.n_logprobs));
  if (eog) return finish(FinishReason::eog), -1;
  emit(stops_.push(utf8_.push(tok_.token_to_piece(t))));
  if (stops_.stopped()) return finish(FinishReason::stop), -1;
  if (matcher_) {
    params_.grammar_vocab->accept(*matcher_, t);
    if (!matcher_->can_continue()) return finish(FinishReason::eog), -1;  // complete, and nothing may follow
  }
  if (cancelled_) return finish(FinishReason::cancelled), -1;
  if (res_.n_generated >= limit_) return finish(FinishReason::length), -1;
  if (pos >= n_ctx) return finish(FinishReason::context), -1;
  return t;
}

namespace {

// Evaluates prompt[n_cached ..) after what the session holds, then generates; the sampler sees
// the whole prompt.
GenerateResult run(Session& session, const Tokenizer& tok, const std::vector<int32_t>& prompt, int64_t n_cached,
                   const GenerateParams& params, const PieceCallback& on_piece, const LogprobCallback& on_logprobs) {
  EMBER_CHECK(!prompt.empty(), "the prompt is empty");
  const int64_t n_new = static_cast<int64_t>(prompt.size()) - n_cached;
  EMBER_CHECK(session.pos() + n_new < session.n_ctx(), "the prompt has {} tokens but the context holds {}",
              session.pos() + n_new, session.n_ctx());
  Generation gen(tok, session.model().hp.n_vocab, prompt, params, on_piece, on_logprobs);
  Timer prompt_timer;
  session.eval(prompt.data() + n_cached, n_new);
  const double prompt_seconds = prompt_timer.seconds();
  Timer gen_timer;
  for (int32_t t; (t = gen.next(session.logits(), session.pos(), session.n_ctx())) >= 0;) session.eval(&t, 1);
  GenerateResult res = gen.result();
  res.n_cached = n_cached;
  res.prompt_seconds = prompt_seconds;
  res.gen_seconds = gen_timer.seconds();
  return res;
}

}  // namespace

TokenLogprobs token_logprobs(const float* logits, int64_t n_vocab, int32_t token, int n) {
  EMBER_CHECK(token >= 0 && token < n_vocab, "token {} is not in the vocabulary of {}", token, n_vocab);
  float mx = logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double log_z = mx + std::log(sum);
  const auto lp = [&](int32_t i) { return static_cast<float>(static_cast<double>(logits[i]) - log_z); };
  TokenLogprobs r;
  r.token = token;
  r.logprob = lp(token);
  // The k best in one pass, kept sorted in r.top (k is small: at most 20 from the server), so
  // nothing of the vocabulary's size is allocated per token.
  const size_t k = static_cast<size_t>(std::clamp<int64_t>(n, 0, n_vocab));
  r.top.reserve(k + 1);
  for (int64_t i = 0; i < n_vocab && k > 0; ++i) {
    if (r.top.size() == k && logits[i] <= logits[r.top.back().first]) continue;  // ties: the lower id stays
    auto at = std::find_if(r.top.begin(), r.top.end(), [&](const auto& e) { return logits[i] > logits[e.first]; });
    r.top.insert(at, {static_cast<int32_t>(i), 0.0f});
    if (r.top.size() > k) r.top.pop_back();
  }
  for (auto& [id, v] : r.top) v = lp(id);
  return r;
}

GenerateResult generate(Session& session, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                        const GenerateParams& params, const PieceCallback& on_piece,
                        const LogprobCallback& on_logprobs) {
  return run(session, tok, prompt, 0, params, on_piece, on_logprobs);
}

int64_t cached_prefix(const Session& session, const std::vector<int32_t>& prompt) {
  return cached_prefix(session.tokens(), prompt);
}

int64_t cached_prefix(const std::vector<int32_t>& held, const std::vector<int32_t>& prompt) {
  const size_t most = prompt.empty() ? 0 : std::min(held.size(), prompt.size() - 1);
  size_t k = 0;
  while (k < most && held[k] == prompt[k]) ++k;
  return static_cast<int64_t>(k);
}

GenerateResult generate_cached(Session& session, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                               const GenerateParams& params, const PieceCallback& on_piece,
                               const LogprobCallback& on_logprobs) {
  const int64_t keep = cached_prefix(session, prompt);
  session.truncate(keep);
  return run(session, tok, prompt, keep, params, on_piece, on_logprobs);
}

}  // namespace ember
