#include "core/thread_pool.hpp"

#include <immintrin.h>

#include "core/error.hpp"

namespace ember {

namespace {
// About 100 microseconds of spinning (pause is ~40-140 cycles) before a thread sleeps.
constexpr int kSpinIterations = 1 << 11;
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  EMBER_CHECK(n_threads >= 1 && n_threads <= 1024, "thread count must be between 1 and 1024, got {}", n_threads);
  workers_.reserve(n_threads - 1);
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_raw(RawFn fn, void* ctx) {
  if (n_threads_ == 1) {
    fn(ctx, 0, 1);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(ctx, 0, n_threads_);
  // Wait for the workers: spin first (jobs are short), then block.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kSpinIterations) {
      _mm_pause();
    } else {
      int p = pending_.load(std::memory_order_acquire);
      if (p != 0) pending_.wait(p, std::memory_order_acquire);
    }
  }
}

void ThreadPool::worker_main(int ith) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t gen;
    for (int spins = 0;; ++spins) {
      gen = generation_.load(std::memory_order_acquire);
      if (gen != seen) break;
      if (spins < kSpinIterations) {
        _mm_pause();
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    fn_(ctx_, ith, n_threads_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace ember
