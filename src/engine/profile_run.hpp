// Running a profile (sparse/profile.hpp) through a Session: the corpus in chunks, the
// profiler's FFN executor in place of the session's own.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/session.hpp"
#include "sparse/profile.hpp"

namespace ember {

// Runs the tokens through the session (chunks of opts.n_ctx from position 0) with the
// profiler's executor; `progress(tokens_done, tokens_total, pass)`. `samples`: records predictor
// training samples in the pass that counts (made for as many tokens as are profiled).
Profile run_profile(Session& session, const std::vector<int32_t>& tokens, const ProfileOptions& opts,
                    const std::function<void(int64_t, int64_t, int)>& progress = {},
                    FfnSampleRecorder* samples = nullptr);

}  // namespace ember
