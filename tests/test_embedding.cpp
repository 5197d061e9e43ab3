// Embeddings (engine/embedding.hpp, BatchEngine::embed): the pooler against a direct
// computation, and the engine's pooled final hidden states against independent runs: the last
// token's state is what the output head turns into the logits a Session computes, the mean is
// the mean of every prefix's last state, cls the first token's; chunking and sharing the pass
// with generations change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/thread_pool.hpp"
#include "engine/batch_engine.hpp"
#include "engine/embedding.hpp"
#include "engine/generator.hpp"
#include "engine/session.hpp"
#include "synth/synth.hpp"
#include "ops/cpu/matmul.hpp"
#include "support/session_logits.hpp"
#include "support/session_params.hpp"
#include "support/synth_suite.hpp"

using namespace ember;
using test_support::greedy;
using test_support::tokens_from;

namespace {

// The largest |a - b| relative to the largest |b|.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) {
    ADD_FAILURE() << a.size() << " values, not " << b.size();
    return 1e30;
  }
  return test_support::max_rel_diff(test_support::Logits{b}, test_support::Logits{a});
}

// Runs a generation job to its end; returns its text.
std::string text_of(BatchEngine::Job& job) {
  std::vector<BatchEngine::Piece> pieces;
  while (job.wait(pieces, std::chrono::milliseconds(200))) {}
  std::string text;
  for (auto& p : pieces) text += p.text;
  return text;
}

// Waits for an embedding job; returns its vector (empty when it failed).
std::vector<float> embedding_of(BatchEngine::Job& job) {
  std::vector<BatchEngine::Piece> pieces;
  while (job.wait(pieces, std::chrono::milliseconds(200))) EXPECT_TRUE(pieces.empty());
  EXPECT_EQ(job.error(), "");
  return job.embedding();
}

class EmbeddingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SynthOptions o = synth_preset("tiny");
    o.type = DType::Q8_0;
    o.n_ctx = 128;
    o.seed = 21;
    o.n_threads = 1;
    suite_.open(o, "ember_embedding");
  }
  static void TearDownTestSuite() { suite_.close(); }
  static SessionParams params(int n_seq, int64_t n_batch) {
    SessionParams p = test_support::session_params(2, 128, n_batch);
    p.n_seq = n_seq;
    return p;
  }
  static std::vector<float> embed(const std::vector<int32_t>& t, Pooling pooling, int64_t n_batch = 32) {
    BatchEngine engine(*suite_.model, *suite_.tok, params(1, n_batch));
    return embedding_of(*engine.embed(0, t, pooling));
  }
  static inline test_support::SynthSuite suite_;
};

}  // namespace

TEST(Pooler, ChunksPoolAsTheWholeAndRefuseDisorder) {
  const int64_t d = 3, n = 5;
  std::vector<float> rows(static_cast<size_t>(n * d));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 7) - 2.5f;
  for (Pooling p : {Pooling::mean, Pooling::last, Pooling::cls}) {
    SCOPED_TRACE(pooling_name(p));
    Pooler whole(p, d, n), parts(p, d, n);
    whole.add(rows.data(), 0, n);
    parts.add(rows.data(), 0, 2);
    parts.add(rows.data() + 2 * d, 2, 3);
    std::vector<float> want(static_cast<size_t>(d));
    for (int64_t j = 0; j < d; ++j) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += rows[static_cast<size_t>(i * d + j)];
      want[static_cast<size_t>(j)] = p == Pooling::mean ? static_cast<float>(s / n)
                                     : p == Pooling::last ? rows[static_cast<size_t>((n - 1) * d + j)]
                                                          : rows[static_cast<size_t>(j)];
    }
    EXPECT_EQ(whole.result(), want);
    EXPECT_EQ(parts.result(), want);
    Pooler early(p, d, n);
    early.add(rows.data(), 0, 2);
    EXPECT_THROW(early.result(), Error);     // three tokens short
    EXPECT_THROW(early.add(rows.data(), 1, 2), Error);  // rows out of order
  }
  std::vector<float> v = {3, 4, 0};
  l2_normalize(v);
  EXPECT_EQ(v, (std::vector<float>{0.6f, 0.8f, 0.0f}));
  EXPECT_EQ(parse_pooling("last"), Pooling::last);
  EXPECT_FALSE(parse_pooling("max"));
}

// The last token's final hidden state is what the head reads: output x it gives the logits a
// Session computes for the same tokens.
TEST_F(EmbeddingTest, LastPoolingIsWhatTheHeadReads) {
  const Model& m = *suite_.model;
  const std::vector<int32_t> t = tokens_from(3, 9, m.hp.n_vocab);
  const std::vector<float> h = embed(t, Pooling::last);
  ASSERT_EQ(static_cast<int64_t>(h.size()), m.hp.n_embd);
  Session s(m, test_support::session_params(1, 128, 32));
  s.eval(t);
  ThreadPool pool(1);
  std::vector<uint8_t> scratch(cpu::matmul_scratch_bytes(m.output.type, m.hp.n_embd, 1) + 64);
  std::vector<float> logits(static_cast<size_t>(m.hp.n_vocab));
  cpu::matmul(pool, m.output, h.data(), 1, logits.data(), scratch.data());
  EXPECT_LT(rel_diff(logits, std::vector<float>(s.logits(), s.logits() + m.hp.n_vocab)), 1e-5);
}

// Mean pooling is the mean of the last states of every prefix (each its own run); cls is the
// first token's state.
TEST_F(EmbeddingTest, MeanIsTheMeanOfEveryPrefixsLastState) {
  const std::vector<int32_t> t = tokens_from(4, 7, suite_.model->hp.n_vocab);
  std::vector<float> want(static_cast<size_t>(suite_.model->hp.n_embd), 0.0f);
  for (size_t i = 1; i <= t.size(); ++i) {
    const std::vector<float> h = embed(std::vector<int32_t>(t.begin(), t.begin() + static_cast<long>(i)), Pooling::last);
    for (size_t j = 0; j < want.size(); ++j) want[j] += h[j] / static_cast<float>(t.size());
  }
  EXPECT_LT(rel_diff(embed(t, Pooling::mean), want), 1e-5);
  EXPECT_LT(rel_diff(embed(t, Pooling::cls), embed({t[0]}, Pooling::last)), 1e-6);
}

// A text longer than the batch is read in chunks; embeddings and generations share the engine's
// passes (two sequences), each getting what it gets alone.
TEST_F(EmbeddingTest, ChunksAndSharedPassesChangeNothing) {
  const int64_t nv = suite_.model->hp.n_vocab;
  const std::vector<int32_t> long_text = tokens_from(5, 50, nv), prompt = tokens_from(6, 6, nv);
  const std::vector<float> whole = embed(long_text, Pooling::mean, 64);
  EXPECT_LT(rel_diff(embed(long_text, Pooling::mean, 8), whole), 1e-5);

  std::string alone;
  {
    BatchEngine engine(*suite_.model, *suite_.tok, params(1, 64));
    alone = text_of(*engine.start(0, prompt, greedy(24)));
  }
  BatchEngineOptions o;
  o.prompt_chunk = 8;
  BatchEngine engine(*suite_.model, *suite_.tok, params(2, 64), o);
  auto gen = engine.start(0, prompt, greedy(24));
  auto emb = engine.embed(1, long_text, Pooling::mean);
  EXPECT_EQ(text_of(*gen), alone);
  EXPECT_LT(rel_diff(embedding_of(*emb), whole), 1e-5);
  EXPECT_EQ(emb->result().n_prompt, 50);
  EXPECT_GT(engine.steps(), 1u);  // the text took several chunks beside the generation

  // The sequence's cache holds the text afterwards, and a generation after it starts clean.
  EXPECT_EQ(text_of(*engine.start(1, prompt, greedy(24))), alone);
}

TEST_F(EmbeddingTest, RefusesWhatItCannotEmbed) {
  BatchEngine engine(*suite_.model, *suite_.tok, params(1, 32));
  EXPECT_THROW(engine.embed(0, {}, Pooling::mean), Error);
  EXPECT_THROW(engine.embed(0, std::vector<int32_t>(129, 1), Pooling::mean), Error);
  EXPECT_THROW(engine.embed(1, {1, 2}, Pooling::mean), Error);
  // A whole context is fine: nothing is generated after it.
  EXPECT_EQ(embedding_of(*engine.embed(0, std::vector<int32_t>(128, 1), Pooling::last)).size(),
            static_cast<size_t>(suite_.model->hp.n_embd));
}
