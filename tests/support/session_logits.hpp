// Logits of a fixed token sequence through a Session (a batched prompt, then single tokens),
// and their largest difference relative to the largest logit: how the FFN executors' tests
// compare whole forward passes.
#pragma once
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/session.hpp"

namespace ember::test_support {

using Logits = std::vector<std::vector<float>>;

// The tokens session_logits runs: n random ids of the model's vocabulary (seed 9), so that a
// reference can be computed on the same sequence.
inline std::vector<int32_t> session_tokens(const Model& m, int64_t n = 18) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(m.hp.n_vocab - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = pick(rng);
  return tokens;
}

// Logits of a `prompt`-token batched prompt, then `decode` single tokens (session_tokens).
inline Logits session_logits(Session& s, int64_t prompt = 12, int64_t decode = 6) {
  const Model& m = s.model();
  const std::vector<int32_t> tokens = session_tokens(m, prompt + decode);
  const int64_t nv = m.hp.n_vocab;
  std::vector<float> all(static_cast<size_t>(prompt * nv));
  s.eval_all_logits(tokens.data(), prompt, all.data());
  Logits out;
  for (int64_t t = 0; t < prompt; ++t) out.emplace_back(all.begin() + t * nv, all.begin() + (t + 1) * nv);
  for (int64_t t = prompt; t < prompt + decode; ++t) {
    s.eval(&tokens[static_cast<size_t>(t)], 1);
    out.emplace_back(s.logits(), s.logits() + nv);
  }
  return out;
}

// Three sequences at once (a session of n_seq >= 3, batches of >= 6): prompts of 7, 4 and 9
// tokens one sequence at a time, three steps of one token each for all of them, then a step of
// 3 + 1 + 2 tokens (sequences 2, 0, 1): every sequence's logits after each step, sequence by
// sequence (session_tokens). kSeqSteps[step][seq] = {first token, count}.
inline constexpr int64_t kSeqSteps[5][3][2] = {{{0, 7}, {7, 4}, {11, 9}},
                                               {{20, 1}, {23, 1}, {26, 1}},
                                               {{21, 1}, {24, 1}, {27, 1}},
                                               {{22, 1}, {25, 1}, {28, 1}},
                                               {{32, 1}, {33, 2}, {29, 3}}};
inline Logits session_logits_seqs(Session& s) {
  const std::vector<int32_t> tok = session_tokens(s.model(), 35);
  const size_t nv = static_cast<size_t>(s.model().hp.n_vocab);
  Logits out;
  for (int step = 0; step < 5; ++step) {
    if (step == 0) {  // the prompts, one sequence at a time
      for (int seq = 0; seq < 3; ++seq) s.eval(&tok[kSeqSteps[0][seq][0]], kSeqSteps[0][seq][1], seq);
    } else {  // all at once; the last step in the order 2, 0, 1
      std::vector<Session::SeqEval> items;
      for (int seq : step == 4 ? std::vector<int>{2, 0, 1} : std::vector<int>{0, 1, 2})
        items.push_back({seq, &tok[kSeqSteps[step][seq][0]], kSeqSteps[step][seq][1]});
      s.eval_seqs(items);
    }
    for (int seq = 0; seq < 3; ++seq) out.emplace_back(s.logits(seq), s.logits(seq) + nv);
  }
  return out;
}

// The same sequences each alone, in a session of one sequence made with `p` (n_seq set to 1):
// what session_logits_seqs gives where batching sequences together changes nothing.
inline Logits session_logits_seqs_alone(const Model& m, SessionParams p) {
  p.n_seq = 1;
  const std::vector<int32_t> tok = session_tokens(m, 35);
  const size_t nv = static_cast<size_t>(m.hp.n_vocab);
  Logits out(15);
  for (int seq = 0; seq < 3; ++seq) {
    Session s(m, p);
    for (int step = 0; step < 5; ++step) {
      s.eval(&tok[kSeqSteps[step][seq][0]], kSeqSteps[step][seq][1], 0);
      out[static_cast<size_t>(step * 3 + seq)].assign(s.logits(0), s.logits(0) + nv);
    }
  }
  return out;
}

// max |got - ref| / max |ref| against a double-precision reference's logits.
inline double max_rel_diff(const Logits& got, const std::vector<std::vector<double>>& ref) {
  double d = 0, m = 0;
  for (size_t t = 0; t < ref.size(); ++t)
    for (size_t i = 0; i < ref[t].size(); ++i) {
      d = std::max(d, std::fabs(got[t][i] - ref[t][i]));
      m = std::max(m, std::fabs(ref[t][i]));
    }
  return d / m;
}

inline double max_rel_diff(const Logits& a, const Logits& b) {
  double d = 0, m = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t i = 0; i < a[t].size(); ++i) {
      d = std::max(d, static_cast<double>(std::fabs(a[t][i] - b[t][i])));
      m = std::max(m, static_cast<double>(std::fabs(a[t][i])));
    }
  return d / m;
}

}  // namespace ember::test_support
