#include "core/thread_pool.hpp"

#include <immintrin.h>

#include <chrono>

#include "core/error.hpp"

namespace ember {

namespace {
// How long a thread spins before it sleeps. Timed rather than counted: the cost of a pause
// ranges from ~10 to ~140 cycles across CPUs, and 2048 of them (the count used before) lasted
// only ~10-30 us on Zen 4, so decode steps went to sleep between jobs and paid a futex wake-up
// (tens of microseconds) on many of their ~150 jobs per token.
constexpr auto kSpin = std::chrono::microseconds(500);

// Past this long a spinning thread yields its core between checks (a job's threads mostly finish
// within a few microseconds of each other). Where more threads are runnable than there are cores
// (two engines, a test runner's parallel jobs) the thread it waits for may be the one waiting for
// this core: holding it to the end of the time slice made every job last a slice. Two engines
// decoding SmolLM2 side by side on 2 cores: 6 tok/s each holding the core, 93 yielding after 5 us
// (282 alone, unchanged).
constexpr auto kSpinAlone = std::chrono::microseconds(5);

// Spins while pred() holds, for at most kSpin; returns whether pred() still holds.
template <class Pred>
bool spin_while(Pred pred) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (!pred()) return false;
      _mm_pause();
    }
    const auto spent = std::chrono::steady_clock::now() - start;
    if (spent > kSpin) return pred();
    if (spent > kSpinAlone) std::this_thread::yield();
  }
}
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
  if (!spin_while([&] { return pending_.load(std::memory_order_acquire) != 0; })) return;
  for (int p; (p = pending_.load(std::memory_order_acquire)) != 0;) pending_.wait(p, std::memory_order_acquire);
}

void ThreadPool::barrier() {
  if (n_threads_ == 1) return;
  // The generation cannot move before this thread has arrived, so reading it first is safe.
  const uint32_t gen = barrier_gen_.load(std::memory_order_acquire);
  if (barrier_count_.fetch_add(1, std::memory_order_acq_rel) == n_threads_ - 1) {
    barrier_count_.store(0, std::memory_order_relaxed);  // before the release below: the next round starts at 0
    barrier_gen_.store(gen + 1, std::memory_order_release);
    barrier_gen_.notify_all();
    return;
  }
  if (spin_while([&] { return barrier_gen_.load(std::memory_order_acquire) == gen; }))
    while (barrier_gen_.load(std::memory_order_acquire) == gen) barrier_gen_.wait(gen, std::memory_order_acquire);
}

void ThreadPool::worker_main(int ith) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t gen;
    if (spin_while([&] { return generation_.load(std::memory_order_acquire) == seen; }))
      while (generation_.load(std::memory_order_acquire) == seen) generation_.wait(seen, std::memory_order_acquire);
    gen = generation_.load(std::memory_order_acquire);
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    fn_(ctx_, ith, n_threads_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace ember
