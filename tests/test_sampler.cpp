#include "engine/sampler.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "core/error.hpp"

using namespace ember;

TEST(Sampler, GreedyPicksArgmax) {
  SamplerParams p;
  p.temperature = 0;
  Sampler s(p, 5);
  std::vector<float> l = {0.1f, 3.f, -1.f, 2.9f, 0.f};
  EXPECT_EQ(s.sample(l.data()), 1);
}

TEST(Sampler, RepeatPenaltyChangesGreedyChoice) {
  SamplerParams p;
  p.temperature = 0;
  p.repeat_penalty = 1.5f;
  Sampler s(p, 3);
  std::vector<float> l = {3.f, 2.5f, -1.f};
  s.accept(0);
  EXPECT_EQ(s.sample(l.data()), 1);  // 3 / 1.5 = 2 < 2.5
}

// OpenAI's logit_bias adds to the raw logits: -100 bans the argmax, +100 forces another.
TEST(Sampler, LogitBiasMovesTheChoice) {
  std::vector<float> l = {0.1f, 3.f, -1.f, 2.9f, 0.f};
  SamplerParams p;
  p.temperature = 0;
  p.logit_bias = {{1, -100.f}};
  EXPECT_EQ(Sampler(p, 5).sample(l.data()), 3);
  p.logit_bias = {{2, 100.f}};
  EXPECT_EQ(Sampler(p, 5).sample(l.data()), 2);
  p.temperature = 1.0f;  // sampled: a banned token never comes
  p.logit_bias = {{1, -100.f}, {3, -100.f}};
  Sampler s(p, 5);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = s.sample(l.data());
    EXPECT_NE(t, 1);
    EXPECT_NE(t, 3);
  }
  p.logit_bias = {{5, 1.f}};
  EXPECT_THROW(Sampler(p, 5), Error);
}

// OpenAI's penalties count generated tokens only: frequency_penalty per time, presence_penalty once.
TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  std::vector<float> l = {3.f, 2.5f, 0.f};
  SamplerParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.2f;
  Sampler f(p, 3);
  f.accept(0);  // a prompt token: no penalty
  EXPECT_EQ(f.sample(l.data()), 0);
  f.accept(0, true);
  f.accept(0, true);
  EXPECT_EQ(f.sample(l.data()), 0);  // 3 - 2 x 0.2 = 2.6 > 2.5
  f.accept(0, true);
  EXPECT_EQ(f.sample(l.data()), 1);  // 3 - 3 x 0.2 = 2.4 < 2.5
  p.frequency_penalty = 0;
  p.presence_penalty = 0.4f;
  Sampler pr(p, 3);
  for (int i = 0; i < 3; ++i) pr.accept(0, true);
  EXPECT_EQ(pr.sample(l.data()), 0);  // 3 - 0.4, once however often = 2.6 > 2.5
  p.presence_penalty = 0.6f;
  Sampler pr2(p, 3);
  pr2.accept(0, true);
  EXPECT_EQ(pr2.sample(l.data()), 1);  // 2.4 < 2.5
}

TEST(Sampler, TopKOneIsGreedyAndSeedIsDeterministic) {
  std::vector<float> l(100);
  for (int i = 0; i < 100; ++i) l[i] = std::sin(i * 1.3f);
  SamplerParams p;
  p.top_k = 1;
  p.temperature = 1.0f;
  Sampler s(p, 100);
  int best = 0;
  for (int i = 1; i < 100; ++i)
    if (l[i] > l[best]) best = i;
  EXPECT_EQ(s.sample(l.data()), best);

  SamplerParams q;
  q.top_k = 0;
  q.top_p = 1.0f;
  q.min_p = 0;
  q.temperature = 1.0f;
  q.seed = 123;
  Sampler a(q, 100), b(q, 100);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(l.data()), b.sample(l.data()));
}

// With no truncation, empirical frequencies follow softmax(logits / T).
TEST(Sampler, FrequenciesFollowSoftmax) {
  std::vector<float> l = {1.0f, 2.0f, 0.0f, 1.5f};
  SamplerParams p;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.temperature = 0.7f;
  p.seed = 7;
  Sampler s(p, 4);
  std::map<int, int> count;
  const int N = 40000;
  for (int i = 0; i < N; ++i) count[s.sample(l.data())]++;
  double z = 0;
  for (float x : l) z += std::exp(x / 0.7);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(count[i] / double(N), std::exp(l[i] / 0.7) / z, 0.01) << i;
}

// top-p and min-p remove the unlikely tail.
TEST(Sampler, TopPAndMinPTruncate) {
  std::vector<float> l = {5.f, 4.9f, 0.f, -1.f};
  SamplerParams p;
  p.top_k = 0;
  p.top_p = 0.9f;
  p.min_p = 0;
  p.temperature = 1.0f;
  Sampler s(p, 4);
  for (int i = 0; i < 2000; ++i) EXPECT_LT(s.sample(l.data()), 2);
  SamplerParams m = p;
  m.top_p = 1.0f;
  m.min_p = 0.5f;
  Sampler sm(m, 4);
  for (int i = 0; i < 2000; ++i) EXPECT_LT(sm.sample(l.data()), 2);
}

TEST(Sampler, RejectsBadParameters) {
  SamplerParams p;
  p.top_p = 0;
  EXPECT_THROW(Sampler(p, 10), Error);
  SamplerParams q;
  q.temperature = -1;
  EXPECT_THROW(Sampler(q, 10), Error);
}
