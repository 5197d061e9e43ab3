// SessionParams for tests, set by name (an aggregate initializer would silently bind a new
// member inserted in the middle of the struct).
#pragma once
#include <cstdint>

#include "engine/session.hpp"

namespace ember::test_support {

inline SessionParams session_params(int threads, int64_t n_ctx, int64_t n_batch) {
  SessionParams p;
  p.n_threads = threads;
  p.n_ctx = n_ctx;
  p.n_batch = n_batch;
  return p;
}

}  // namespace ember::test_support
