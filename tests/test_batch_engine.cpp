// Continuous batching: Session::eval_seqs (several sequences in one forward pass, each its own
// KV cache) against each sequence run alone, and the BatchEngine (jobs joining and leaving
// between steps, prompt chunks, the prompt cache per sequence, cancellation) against generate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "engine/batch_engine.hpp"
#include "engine/generator.hpp"
#include "engine/session.hpp"
#include "model/model.hpp"
#include "synth/synth.hpp"
#include "support/session_params.hpp"
#include "support/synth_suite.hpp"
#include "tokenizer/tokenizer.hpp"

using namespace ember;
using test_support::greedy;
using test_support::tokens_from;

namespace {

SynthOptions synth_options(const std::string& arch, DType type) {
  SynthOptions o = synth_options_for(synth_preset("tiny"), arch);
  o.type = type;
  o.n_ctx = 128;
  o.seed = 11;
  if (type == DType::Q4_K || type == DType::Q6_K) o.n_embd = 256, o.n_ff = 512;  // rows of whole 256-blocks
  o.n_threads = 1;
  return o;
}

std::string synth_file(const std::string& arch, DType type, const std::string& name) {
  const std::string path = ::testing::TempDir() + "ember_batch_" + name + ".gguf";
  synth_write(synth_options(arch, type), path);
  return path;
}

// The largest |a - b| relative to the largest |b| of the row.
double rel_diff(const float* a, const float* b, int64_t n) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
    m = std::max(m, std::fabs(static_cast<double>(b[i])));
  }
  return d / std::max(m, 1e-30);
}

// Runs a job to its end; returns its text.
std::string drain(BatchEngine::Job& job, std::vector<TokenLogprobs>* lps = nullptr) {
  std::string text;
  std::vector<BatchEngine::Piece> pieces;
  for (bool more = true; more;) {
    more = job.wait(pieces, std::chrono::milliseconds(200));
    for (auto& p : pieces) {
      text += p.text;
      if (lps) lps->insert(lps->end(), p.logprobs.begin(), p.logprobs.end());
    }
    pieces.clear();
  }
  return text;
}

}  // namespace

// Three sequences of different lengths in one pass, then decode steps of all three together, give
// each the logits it gets alone, to the bit: every row of a product runs the same kernel over the
// same quantized activations in the same order whatever the batch (decode alone splits rows over
// threads, a batch splits row blocks: neither changes a row's sum), and each sequence attends
// over its own cache exactly as alone.
TEST(EvalSeqs, EachSequenceGetsItsLogitsAlone) {
  for (DType type : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K}) {
    for (const Architecture& a : architectures()) {  // every row of the table
      const std::string arch = a.name;
      SCOPED_TRACE(std::string(dtype_name(type)) + " " + arch);
      const std::string path = synth_file(arch, type, arch + std::string(dtype_name(type)));
      auto model = load_model(path);
      const int64_t nv = model->hp.n_vocab;
      const std::vector<std::vector<int32_t>> prompts = {tokens_from(1, 5, nv), tokens_from(2, 9, nv), tokens_from(3, 1, nv)};
      const int n_steps = 6;
      // Alone: each sequence's logits after its prompt and after each decode token.
      std::vector<std::vector<std::vector<float>>> alone(prompts.size());
      std::vector<std::vector<int32_t>> follow(prompts.size());
      for (size_t s = 0; s < prompts.size(); ++s) {
        Session one(*model, test_support::session_params(2, 64, 32));
        one.eval(prompts[s]);
        alone[s].emplace_back(one.logits(), one.logits() + nv);
        follow[s] = tokens_from(static_cast<uint32_t>(10 + s), n_steps, nv);
        for (int32_t t : follow[s]) {
          one.eval(&t, 1);
          alone[s].emplace_back(one.logits(), one.logits() + nv);
        }
      }
      SessionParams p = test_support::session_params(2, 64, 32);
      p.n_seq = 4;  // sequence 1 stays idle; the three run on 0, 2, 3
      Session batch(*model, p);
      const int ids[] = {0, 2, 3};
      std::vector<Session::SeqEval> items;
      for (size_t s = 0; s < prompts.size(); ++s)
        items.push_back({ids[s], prompts[s].data(), static_cast<int64_t>(prompts[s].size())});
      batch.eval_seqs(items);
      for (size_t s = 0; s < prompts.size(); ++s) {
        EXPECT_EQ(rel_diff(batch.logits(ids[s]), alone[s][0].data(), nv), 0.0) << "prompt of sequence " << s;
        EXPECT_EQ(batch.pos(ids[s]), static_cast<int64_t>(prompts[s].size()));
      }
      EXPECT_EQ(batch.pos(1), 0);
      for (int k = 0; k < n_steps; ++k) {
        items.clear();
        for (size_t s = 0; s < prompts.size(); ++s) items.push_back({ids[s], &follow[s][static_cast<size_t>(k)], 1});
        std::reverse(items.begin(), items.end());  // any order of sequences
        batch.eval_seqs(items);
        for (size_t s = 0; s < prompts.size(); ++s)
          EXPECT_EQ(rel_diff(batch.logits(ids[s]), alone[s][static_cast<size_t>(k + 1)].data(), nv), 0.0)
              << "step " << k << " of sequence " << s;
      }
      std::remove(path.c_str());
    }
  }
}

TEST(EvalSeqs, RefusesWhatItCannotRun) {
  const std::string path = synth_file("llama", DType::F32, "refuse");
  auto model = load_model(path);
  SessionParams p = test_support::session_params(1, 16, 8);
  p.n_seq = 2;
  Session s(*model, p);
  const std::vector<int32_t> t(9, 5);
  const Session::SeqEval twice[] = {{0, t.data(), 1}, {0, t.data(), 1}};
  EXPECT_THROW(s.eval_seqs(twice), Error);
  const Session::SeqEval too_many[] = {{0, t.data(), 5}, {1, t.data(), 4}};
  EXPECT_THROW(s.eval_seqs(too_many), Error);
  const Session::SeqEval no_such[] = {{2, t.data(), 1}};
  EXPECT_THROW(s.eval_seqs(no_such), Error);
  const Session::SeqEval empty[] = {{1, t.data(), 0}};
  EXPECT_THROW(s.eval_seqs(empty), Error);
  // A hybrid session with a budget and no profile to place by is refused at construction.
  SessionParams h = p;
  h.hybrid.vram_budget = 1 << 20;
  EXPECT_THROW(Session(*model, h), Error);
  std::remove(path.c_str());
}

class BatchEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { suite_.open(synth_options("llama", DType::Q8_0), "ember_batch_engine"); }
  static void TearDownTestSuite() { suite_.close(); }
  static std::string alone(const std::vector<int32_t>& prompt, const GenerateParams& g,
                           std::vector<TokenLogprobs>* lps = nullptr) {
    Session s(*suite_.model, test_support::session_params(2, 128, 32));
    std::string out;
    generate(
        s, *suite_.tok, prompt, g,
        [&](std::string_view p) {
          out.append(p);
          return true;
        },
        [&](const TokenLogprobs& t) {
          if (lps) lps->push_back(t);
        });
    return out;
  }
  static SessionParams engine_params(int n_seq, int64_t n_batch = 32) {
    SessionParams p = test_support::session_params(2, 128, n_batch);
    p.n_seq = n_seq;
    return p;
  }
  static inline test_support::SynthSuite suite_;
};

// Jobs of different prompt lengths and limits, started together and one after another, each
// give the greedy text they give alone; prompts longer than the chunk join over several steps.
TEST_F(BatchEngineTest, JobsTogetherGiveTheirTextsAlone) {
  BatchEngineOptions o;
  o.prompt_chunk = 4;  // the 40-token prompt joins in chunks while the others generate
  BatchEngine engine(*suite_.model, *suite_.tok, engine_params(4), o);
  const int64_t nv = suite_.model->hp.n_vocab;
  const std::vector<std::vector<int32_t>> prompts = {tokens_from(5, 3, nv), tokens_from(6, 40, nv),
                                                      tokens_from(7, 12, nv), tokens_from(8, 1, nv)};
  const int64_t limits[] = {20, 9, 30, 5};
  std::vector<std::shared_ptr<BatchEngine::Job>> jobs;
  for (size_t i = 0; i < prompts.size(); ++i) jobs.push_back(engine.start(static_cast<int>(i), prompts[i], greedy(limits[i])));
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(drain(*jobs[i]), alone(prompts[i], greedy(limits[i])));
    EXPECT_TRUE(jobs[i]->error().empty()) << jobs[i]->error();
    EXPECT_EQ(jobs[i]->result().n_generated, limits[i]);
    EXPECT_EQ(jobs[i]->result().finish, FinishReason::length);
    EXPECT_EQ(jobs[i]->result().n_prompt, static_cast<int64_t>(prompts[i].size()));
  }
  // Steps held several sequences: fewer steps than tokens evaluated.
  EXPECT_LT(engine.steps(), engine.step_rows());
  // A job joining while another runs.
  auto a = engine.start(0, prompts[2], greedy(25));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto b = engine.start(1, prompts[0], greedy(25));
  EXPECT_EQ(drain(*b), alone(prompts[0], greedy(25)));
  EXPECT_EQ(drain(*a), alone(prompts[2], greedy(25)));
}

// Sampled generation with a seed and log-probabilities: the same as alone.
TEST_F(BatchEngineTest, SamplingAndLogprobsAsAlone) {
  BatchEngine engine(*suite_.model, *suite_.tok, engine_params(3));
  GenerateParams g = greedy(15);
  g.sampling.temperature = 0.8f;
  g.sampling.seed = 42;
  g.n_logprobs = 2;
  const auto prompt = tokens_from(9, 6, suite_.model->hp.n_vocab);
  auto other = engine.start(1, tokens_from(10, 8, suite_.model->hp.n_vocab), greedy(30));
  auto job = engine.start(0, prompt, g);
  std::vector<TokenLogprobs> got, want;
  const std::string text = drain(*job, &got);
  EXPECT_EQ(text, alone(prompt, g, &want));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].token, want[i].token);
    EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-3);
    ASSERT_EQ(got[i].top.size(), 2u);
  }
  drain(*other);
}

// Echo: the prompt's tokens' log-probabilities (the first unknown), each the log-softmax of the
// logits at the position before it as a whole-prompt pass gives them, over prompt chunks of the
// engine's own size beside another job, from the prompt's start even where the cache holds it;
// then the sampled tokens' as without echo. With no token to generate, the prompt's only.
TEST_F(BatchEngineTest, EchoGivesThePromptsLogprobs) {
  BatchEngineOptions o;
  o.prompt_chunk = 8;
  BatchEngine engine(*suite_.model, *suite_.tok, engine_params(2), o);
  const int64_t nv = suite_.model->hp.n_vocab;
  const auto prompt = tokens_from(12, 45, nv);
  Session whole(*suite_.model, test_support::session_params(2, 128, 64));
  std::vector<float> logits(prompt.size() * static_cast<size_t>(nv));
  whole.eval_all_logits(prompt.data(), static_cast<int64_t>(prompt.size()), logits.data());
  std::vector<TokenLogprobs> plain_lps;
  GenerateParams g = greedy(6);
  g.n_logprobs = 3;
  const std::string plain = drain(*engine.start(0, prompt, g), &plain_lps);  // (the cache now holds the prompt)
  g.prompt_logprobs = true;
  auto other = engine.start(1, tokens_from(13, 10, nv), greedy(40));
  std::vector<TokenLogprobs> got;
  auto job = engine.start(0, prompt, g);
  EXPECT_EQ(drain(*job, &got), plain);
  EXPECT_EQ(job->result().n_cached, 0);
  ASSERT_EQ(got.size(), prompt.size() + plain_lps.size());
  EXPECT_FALSE(got[0].known);
  EXPECT_EQ(got[0].token, prompt[0]);
  for (size_t i = 1; i < prompt.size(); ++i) {
    SCOPED_TRACE(i);
    const TokenLogprobs want = token_logprobs(logits.data() + (i - 1) * static_cast<size_t>(nv), nv, prompt[i], 3);
    EXPECT_TRUE(got[i].known);
    EXPECT_EQ(got[i].token, prompt[i]);
    EXPECT_NEAR(got[i].logprob, want.logprob, 2e-3);
    ASSERT_EQ(got[i].top.size(), 3u);
    EXPECT_EQ(got[i].top[0].first, want.top[0].first);
  }
  for (size_t i = 0; i < plain_lps.size(); ++i) {
    EXPECT_EQ(got[prompt.size() + i].token, plain_lps[i].token);
    EXPECT_NEAR(got[prompt.size() + i].logprob, plain_lps[i].logprob, 2e-3);
  }
  GenerateParams none = g;
  none.max_tokens = 0;
  std::vector<TokenLogprobs> only;
  EXPECT_EQ(drain(*engine.start(0, prompt, none), &only), "");
  EXPECT_EQ(only.size(), prompt.size());
  drain(*other);
}

// The prompt cache per sequence: a second turn on the same sequence evaluates only what is new.
TEST_F(BatchEngineTest, PromptCacheKeepsEachSequencesPrefix) {
  BatchEngine engine(*suite_.model, *suite_.tok, engine_params(2));
  const int64_t nv = suite_.model->hp.n_vocab;
  const auto first = tokens_from(12, 10, nv);
  auto j0 = engine.start(0, first, greedy(6));
  auto j1 = engine.start(1, tokens_from(13, 7, nv), greedy(6));
  drain(*j0);
  drain(*j1);
  EXPECT_EQ(engine.cached_prefix(0, first), 9);  // all but the last prompt token
  EXPECT_EQ(engine.cached_prefix(1, first), 0);
  std::vector<int32_t> second = first;
  for (int32_t t : tokens_from(14, 5, nv)) second.push_back(t);
  auto j2 = engine.start(0, second, greedy(8));
  EXPECT_EQ(drain(*j2), alone(second, greedy(8)));
  EXPECT_EQ(j2->result().n_cached, 10);
}

// A cancelled job ends at the next step; the others go on undisturbed. The engine thread may
// run a job to its end (~120 steps of a tiny model, a few milliseconds) before the request's
// thread gets to cancel it, so each case tries until a cancel lands first (almost always the first
// try): every try must end cancelled or complete, and one of them cancelled early.
TEST_F(BatchEngineTest, CancelEndsOneJob) {
  const int64_t nv = suite_.model->hp.n_vocab;
  const int64_t full = 128 - 4;  // what a job that runs until the context is full generates
  auto ends_well = [&](const BatchEngine::Job& j, const std::string& why) {
    if (j.result().finish == FinishReason::cancelled) {
      EXPECT_EQ(j.error(), why);
      return j.result().n_generated < 100;
    }
    EXPECT_EQ(j.error(), "");
    EXPECT_EQ(j.result().n_generated, full);
    return false;
  };
  BatchEngine engine(*suite_.model, *suite_.tok, engine_params(2));
  auto keep = engine.start(0, tokens_from(15, 4, nv), greedy(40));
  bool cancelled = false;
  for (int t = 0; t < 20 && !cancelled; ++t) {
    auto stop = engine.start(1, tokens_from(16, 4, nv), greedy(-1));
    stop->cancel();
    drain(*stop);
    cancelled = ends_well(*stop, "");
  }
  EXPECT_TRUE(cancelled) << "no cancel ended its job in 20 tries";
  EXPECT_EQ(drain(*keep), alone(tokens_from(15, 4, nv), greedy(40)));
  // The engine ends what still runs when it is destroyed, and says why.
  cancelled = false;
  for (int t = 0; t < 20 && !cancelled; ++t) {
    std::shared_ptr<BatchEngine::Job> left;
    {
      BatchEngine e2(*suite_.model, *suite_.tok, engine_params(1));
      left = e2.start(0, tokens_from(17, 4, nv), greedy(-1));
    }
    drain(*left);
    cancelled = ends_well(*left, "the server is shutting down");
  }
  EXPECT_TRUE(cancelled) << "no engine's end cancelled its job in 20 tries";
}

// A job whose sampling fails (its grammar breaks a bound at the first byte it is asked about:
// 5000 alternatives after "[") ends alone with the error, marked as the request's; the job beside
// it goes on to the text it gives alone, and the engine takes the next job.
TEST_F(BatchEngineTest, AFailingSampleEndsOnlyItsJob) {
  auto g = std::make_shared<Grammar>();
  const int root = g->add_rule("root"), each = g->add_rule("each");
  g->add_alternative(root, {Grammar::Symbol::bytes(ByteSet::range(0, 255)), Grammar::Symbol::ref(each)});
  for (int i = 0; i < 5000; ++i) {
    Grammar::Sequence seq;
    Grammar::append_literal(seq, "v" + std::to_string(i));
    g->add_alternative(each, seq);
  }
  g->finish(root);
  GenerateParams bad = greedy(20);
  bad.grammar = g;
  bad.grammar_vocab = std::make_shared<TokenGrammar>(*suite_.tok);
  BatchEngine engine(*suite_.model, *suite_.tok, engine_params(2));
  const int64_t nv = suite_.model->hp.n_vocab;
  auto keep = engine.start(0, tokens_from(15, 4, nv), greedy(40));
  auto fail = engine.start(1, tokens_from(16, 4, nv), bad);
  EXPECT_EQ(drain(*fail), "");
  EXPECT_NE(fail->error().find("more than 4096 readings"), std::string::npos) << fail->error();
  EXPECT_TRUE(fail->request_error());
  EXPECT_EQ(drain(*keep), alone(tokens_from(15, 4, nv), greedy(40)));
  EXPECT_TRUE(keep->error().empty());
  auto next = engine.start(1, tokens_from(17, 4, nv), greedy(10));
  EXPECT_EQ(drain(*next), alone(tokens_from(17, 4, nv), greedy(10)));
}

TEST_F(BatchEngineTest, RefusesWhatItCannotRun) {
  EXPECT_THROW(BatchEngine(*suite_.model, *suite_.tok, engine_params(4, 2)), Error);  // 4 sequences, batch of 2
  BatchEngine engine(*suite_.model, *suite_.tok, engine_params(1));
  EXPECT_THROW(engine.start(1, {1, 2}, greedy(2)), Error);
  EXPECT_THROW(engine.start(0, {}, greedy(2)), Error);
  EXPECT_THROW(engine.start(0, std::vector<int32_t>(128, 1), greedy(2)), Error);
}
