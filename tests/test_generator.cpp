// The engine's generation loop and its stop-string matcher (used by the CLI and the server).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <cstdio>
#include <vector>

#include "core/error.hpp"
#include "engine/generator.hpp"
#include "engine/session.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"
#include "tokenizer/tokenizer.hpp"
#include "support/session_params.hpp"
#include "support/synth_suite.hpp"

using namespace ember;

namespace {
// Feeds `pieces` one by one; returns the concatenated output (after flush unless stopped).
std::string feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) {
    out += m.push(p);
    if (m.stopped()) return out;
  }
  return out + m.flush();
}
}  // namespace

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m;
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.push(""), "");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, MatchInsideOnePiece) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("helloSTOPworld"), "hello");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, MatchAcrossPiecesHoldsBackThePrefix) {
  StopMatcher m({"</end>"});
  EXPECT_EQ(m.push("text </"), "text ");  // "</" could start the stop string
  EXPECT_EQ(m.held(), 2u);
  EXPECT_EQ(m.push("en"), "");
  EXPECT_EQ(m.push("d> tail"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, FalseStartIsReleased) {
  StopMatcher m({"</end>"});
  EXPECT_EQ(m.push("a </e"), "a ");
  EXPECT_EQ(m.push("x"), "</ex");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("</en"), "");
  EXPECT_EQ(m.flush(), "</en");  // the end of the stream releases the held text
}

TEST(StopMatcher, EarliestOfSeveralWins) {
  StopMatcher m({"world", "lo w", "zzz"});
  EXPECT_EQ(feed(m, {"hel", "lo", " wor", "ld"}), "hel");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, OverlappingPrefixes) {
  // "aab": after "aaa" the held suffix must be "aa", not "a".
  StopMatcher m({"aab"});
  EXPECT_EQ(feed(m, {"a", "a", "a", "b", "c"}), "a");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, EmptyStopStringsAreIgnored) {
  StopMatcher m({"", "x"});
  EXPECT_EQ(feed(m, {"ab", "cx"}), "abc");
}

TEST(StopMatcher, StopAtTheVeryStart) {
  StopMatcher m({"Q"});
  EXPECT_EQ(feed(m, {"Qabc"}), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, MultiByteUtf8StaysWhole) {
  // A stop string starting with "é" (C3 A9): the held suffix starts on a character boundary.
  StopMatcher m({"\xC3\xA9t\xC3\xA9"});
  std::string out = feed(m, {"caf\xC3\xA9", " \xC3\xA9", "t", "\xC3\xA9!"});
  EXPECT_EQ(out, "caf\xC3\xA9 ");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, EveryPieceSplitGivesTheSameResult) {
  const std::string text = "The answer is 42.\nUser: next question";
  const std::vector<std::string> stops = {"\nUser:", "###"};
  for (size_t cut1 = 0; cut1 <= text.size(); ++cut1) {
    for (size_t cut2 = cut1; cut2 <= text.size(); cut2 += 3) {
      StopMatcher m(stops);
      std::string out = feed(m, {text.substr(0, cut1), text.substr(cut1, cut2 - cut1), text.substr(cut2)});
      ASSERT_EQ(out, "The answer is 42.") << cut1 << " " << cut2;
      ASSERT_TRUE(m.stopped());
    }
  }
}

class GeneratorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SynthOptions o = synth_preset("tiny");
    o.n_ctx = 64;
    suite_.open(o, "ember_generator_test");
  }
  static void TearDownTestSuite() { suite_.close(); }
  static GenerateParams greedy(int64_t n) { return test_support::greedy(n); }
  static std::string run(const GenerateParams& g, GenerateResult* res = nullptr, int stop_after = -1) {
    Session s(*suite_.model, test_support::session_params(1, 64, 16));
    std::string out;
    int calls = 0;
    GenerateResult r = generate(s, *suite_.tok, suite_.tok->encode("hello world", true, false), g, [&](std::string_view p) {
      out.append(p);
      return ++calls != stop_after;
    });
    if (res) *res = r;
    return out;
  }
  static inline test_support::SynthSuite suite_;
};

TEST_F(GeneratorTest, CountsAndLengthLimit) {
  GenerateResult r;
  std::string out = run(greedy(10), &r);
  EXPECT_EQ(r.n_prompt, static_cast<int64_t>(suite_.tok->encode("hello world", true, false).size()));
  EXPECT_EQ(r.n_generated, 10);
  EXPECT_EQ(r.finish, FinishReason::length);
  EXPECT_FALSE(out.empty());
}

TEST_F(GeneratorTest, ContextLimitEndsGeneration) {
  GenerateResult r;
  run(greedy(-1), &r);
  EXPECT_EQ(r.finish, FinishReason::context);
  EXPECT_EQ(r.n_prompt + r.n_generated, 64);  // each sampled token is evaluated until the context is full
}

TEST_F(GeneratorTest, StopStringCutsTheOutputAtItsFirstOccurrence) {
  std::string full = run(greedy(40));
  ASSERT_GE(full.size(), 6u);
  // Stop on a substring from the middle of the greedy output.
  std::string stop = full.substr(full.size() / 2, 3);
  GenerateParams g = greedy(40);
  g.stop = {stop};
  GenerateResult r;
  std::string out = run(g, &r);
  EXPECT_EQ(r.finish, FinishReason::stop);
  EXPECT_EQ(out, full.substr(0, full.find(stop)));
}

TEST_F(GeneratorTest, CallbackReturningFalseCancels) {
  GenerateResult r;
  run(greedy(40), &r, 2);
  EXPECT_EQ(r.finish, FinishReason::cancelled);
  EXPECT_LT(r.n_generated, 40);
}

TEST_F(GeneratorTest, SameSeedSameText) {
  GenerateParams g = greedy(20);
  g.sampling.temperature = 0.9f;
  g.sampling.seed = 7;
  EXPECT_EQ(run(g), run(g));
}

TEST_F(GeneratorTest, PromptLongerThanTheContextThrows) {
  Session s(*suite_.model, test_support::session_params(1, 8, 16));
  std::vector<int32_t> prompt(8, 65);
  EXPECT_THROW(generate(s, *suite_.tok, prompt, greedy(4), [](std::string_view) { return true; }), Error);
  EXPECT_THROW(generate(s, *suite_.tok, {}, greedy(4), [](std::string_view) { return true; }), Error);
}

// The prompt cache (generate_cached): a chat's next turn evaluates only what is new, and the
// text is what a fresh session gives for the whole prompt.
TEST_F(GeneratorTest, PromptCacheEvaluatesOnlyTheNewSuffixAndChangesNothing) {
  const auto collect = [](std::string& out) {
    return [&out](std::string_view p) {
      out.append(p);
      return true;
    };
  };
  const auto fresh = [&](const std::vector<int32_t>& prompt) {
    Session s(*suite_.model, test_support::session_params(1, 64, 16));
    std::string out;
    generate(s, *suite_.tok, prompt, greedy(6), collect(out));
    return out;
  };
  Session cached(*suite_.model, test_support::session_params(1, 64, 16));
  const std::vector<int32_t> first = suite_.tok->encode("hello world", true, false);
  std::string a;
  GenerateResult r = generate_cached(cached, *suite_.tok, first, greedy(6), collect(a));
  EXPECT_EQ(r.n_cached, 0);
  EXPECT_EQ(a, fresh(first));
  // The cache holds the prompt and every sampled token but the last (never evaluated).
  ASSERT_EQ(cached.tokens().size(), first.size() + 5);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), cached.tokens().begin()));

  // The next turn: everything so far, then new text.
  std::vector<int32_t> second = cached.tokens();
  for (int32_t t : suite_.tok->encode(" and then", false, false)) second.push_back(t);
  std::string b;
  r = generate_cached(cached, *suite_.tok, second, greedy(6), collect(b));
  EXPECT_EQ(r.n_cached, static_cast<int64_t>(first.size() + 5));
  EXPECT_EQ(r.n_prompt, static_cast<int64_t>(second.size()));
  EXPECT_EQ(b, fresh(second));

  // The same prompt again: all of it but the last token comes from the cache.
  std::string c;
  r = generate_cached(cached, *suite_.tok, second, greedy(6), collect(c));
  EXPECT_EQ(r.n_cached, static_cast<int64_t>(second.size()) - 1);
  EXPECT_EQ(c, b);

  // A prompt that differs at its second token keeps one: the rest of the cache is dropped.
  std::vector<int32_t> other = second;
  other[1] = other[1] == 65 ? 66 : 65;
  std::string d;
  r = generate_cached(cached, *suite_.tok, other, greedy(6), collect(d));
  EXPECT_EQ(r.n_cached, 1);
  EXPECT_EQ(d, fresh(other));
  EXPECT_EQ(cached_prefix(cached, {}), 0);
}

// token_logprobs: the log-softmax of the logits, the alternatives most likely first.
TEST(TokenLogprobs, LogSoftmaxAndTopTokens) {
  const float logits[4] = {0.0f, std::log(3.0f), 0.0f, -100.0f};  // p = 1/5, 3/5, 1/5, ~0
  TokenLogprobs t = token_logprobs(logits, 4, 2, 3);
  EXPECT_EQ(t.token, 2);
  EXPECT_NEAR(t.logprob, std::log(0.2), 1e-6);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].first, 1);
  EXPECT_NEAR(t.top[0].second, std::log(0.6), 1e-6);
  EXPECT_EQ(t.top[1].first, 0);  // a tie: the lower id first
  EXPECT_EQ(t.top[2].first, 2);
  EXPECT_TRUE(token_logprobs(logits, 4, 3, 0).top.empty());
  EXPECT_EQ(token_logprobs(logits, 4, 3, 9).top.size(), 4u);
  EXPECT_THROW(token_logprobs(logits, 4, 4, 1), Error);
  // Many ties (values from a small set), against a full sort.
  std::vector<float> many(1000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<float>((i * 7919) % 13);
  std::vector<int32_t> order(many.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return many[a] > many[b]; });
  const TokenLogprobs m = token_logprobs(many.data(), 1000, 5, 20);
  ASSERT_EQ(m.top.size(), 20u);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(m.top[i].first, order[i]) << i;
}

// Through generate: one entry per sampled token, the greedy token the most likely one, its
// log-probability the log-softmax of the session's logits at that step.
TEST_F(GeneratorTest, LogprobsOfEachSampledToken) {
  GenerateParams g = greedy(5);
  g.n_logprobs = 3;
  Session s(*suite_.model, test_support::session_params(1, 64, 16));
  const std::vector<int32_t> prompt = suite_.tok->encode("hello world", true, false);
  std::vector<TokenLogprobs> got;
  GenerateResult r = generate(
      s, *suite_.tok, prompt, g, [](std::string_view) { return true; }, [&](const TokenLogprobs& t) { got.push_back(t); });
  ASSERT_EQ(static_cast<int64_t>(got.size()), r.n_generated);
  for (const TokenLogprobs& t : got) {
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.token, t.top[0].first);
    EXPECT_EQ(t.logprob, t.top[0].second);
    EXPECT_GE(t.top[0].second, t.top[1].second);
    EXPECT_GE(t.top[1].second, t.top[2].second);
    EXPECT_LE(std::exp(t.top[0].second) + std::exp(t.top[1].second) + std::exp(t.top[2].second), 1.0 + 1e-5);
  }
  // The first token against a double log-softmax of a fresh session's logits.
  Session f(*suite_.model, test_support::session_params(1, 64, 16));
  f.eval(prompt);
  const int64_t nv = suite_.model->hp.n_vocab;
  double mx = f.logits()[0], z = 0;
  for (int64_t i = 0; i < nv; ++i) mx = std::max(mx, static_cast<double>(f.logits()[i]));
  for (int64_t i = 0; i < nv; ++i) z += std::exp(f.logits()[i] - mx);
  EXPECT_NEAR(got[0].logprob, f.logits()[got[0].token] - mx - std::log(z), 1e-5);
  // Not asked for: no calls.
  int calls = 0;
  generate(
      f, *suite_.tok, prompt, greedy(3), [](std::string_view) { return true; }, [&](const TokenLogprobs&) { ++calls; });
  EXPECT_EQ(calls, 0);
}
