// Running a model in one FFN mode for the sparse tests: the logits of a fixed token sequence
// (a 12-token batched prompt, then 6 single tokens) and the executor's counts.
#pragma once
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/session.hpp"

namespace ember::test_support {

// One row of n_vocab logits per token.
inline std::vector<std::vector<float>> run_ffn_mode(const Model& m, FfnMode mode, int threads,
                                                    FfnSparsityStats* stats = nullptr) {
  SessionParams p;
  p.n_threads = threads;
  p.n_ctx = 64;
  p.sparse.mode = mode;
  Session s(m, p);
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(m.hp.n_vocab - 1));
  std::vector<int32_t> tokens(18);
  for (auto& t : tokens) t = pick(rng);
  const int64_t nv = m.hp.n_vocab;
  std::vector<float> all(12 * nv);
  s.eval_all_logits(tokens.data(), 12, all.data());
  std::vector<std::vector<float>> out;
  for (int64_t t = 0; t < 12; ++t) out.emplace_back(all.begin() + t * nv, all.begin() + (t + 1) * nv);
  for (int64_t t = 12; t < 18; ++t) {
    s.eval(&tokens[t], 1);
    out.emplace_back(s.logits(), s.logits() + nv);
  }
  if (stats && s.sparse_ffn()) *stats = s.sparse_ffn()->stats();
  return out;
}

// max |a - b| / max |a| over all rows.
inline double rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double d = 0, m = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t i = 0; i < a[t].size(); ++i) {
      d = std::max(d, static_cast<double>(std::fabs(a[t][i] - b[t][i])));
      m = std::max(m, static_cast<double>(std::fabs(a[t][i])));
    }
  return d / m;
}

}  // namespace ember::test_support
