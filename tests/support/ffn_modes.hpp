// Running a model in one FFN mode for the sparse tests: the logits of a fixed token sequence
// (a 12-token batched prompt, then 6 single tokens) and the executor's counts.
#pragma once
#include <vector>

#include "engine/session.hpp"
#include "session_logits.hpp"

namespace ember::test_support {

// One row of n_vocab logits per token. `fused`: whether single tokens take SparseFfn's fused
// decode path; `mirrored`: whether mirrored predictors run at half rank.
inline Logits run_ffn_mode(const Model& m, FfnMode mode, int threads, FfnSparsityStats* stats = nullptr,
                           bool fused = true, bool mirrored = true) {
  SessionParams p;
  p.n_threads = threads;
  p.n_ctx = 64;
  p.sparse.mode = mode;
  p.sparse.mirrored_predictors = mirrored;
  Session s(m, p);
  if (s.sparse_ffn()) s.sparse_ffn()->set_fused_decode(fused);
  Logits out = session_logits(s);
  if (stats && s.sparse_ffn()) *stats = s.sparse_ffn()->stats();
  return out;
}

// max |a - b| / max |a| over all rows.
inline double rel_diff(const Logits& a, const Logits& b) { return max_rel_diff(a, b); }

}  // namespace ember::test_support
