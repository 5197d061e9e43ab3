// A persistent pool of worker threads. The calling thread takes part as thread 0, so a pool of
// n threads starts n - 1 workers. Each job is a function of (ith, nth): the kernels partition
// their own work, as ggml's compute threads do. Workers spin briefly between jobs (a decode step
// issues hundreds of small jobs) and then sleep, so an idle pool costs no CPU.
#pragma once
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace ember {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs f(ith, nth) on every thread and returns when all have finished. Not reentrant.
  template <class F>
  void run(F&& f) {
    run_raw(&invoke<std::remove_reference_t<F>>, static_cast<void*>(&f));
  }

  // Inside a job: returns once all nth threads of the job have called it (each the same number
  // of times), with their writes before the call visible to all. Lets one job run steps that
  // depend on each other's results (a split of work by what an earlier step found) without a
  // second dispatch. Spins briefly, then blocks, as the pool does between jobs.
  void barrier();

  // Splits [0, n) into chunks of `grain` handed out dynamically; f(begin, end, ith).
  template <class F>
  void parallel_for(int64_t n, int64_t grain, F&& f) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (n_threads_ == 1 || n <= grain) {
      f(int64_t{0}, n, 0);
      return;
    }
    std::atomic<int64_t> next{0};
    run([&](int ith, int) {
      for (;;) {
        int64_t begin = next.fetch_add(grain, std::memory_order_relaxed);
        if (begin >= n) break;
        int64_t end = begin + grain < n ? begin + grain : n;
        f(begin, end, ith);
      }
    });
  }

 private:
  using RawFn = void (*)(void*, int, int);
  template <class F>
  static void invoke(void* ctx, int ith, int nth) {
    (*static_cast<F*>(ctx))(ith, nth);
  }
  void run_raw(RawFn fn, void* ctx);
  void worker_main(int ith);

  int n_threads_;
  std::vector<std::thread> workers_;
  RawFn fn_ = nullptr;
  void* ctx_ = nullptr;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<bool> stop_{false};
  alignas(64) std::atomic<int> barrier_count_{0};
  alignas(64) std::atomic<uint32_t> barrier_gen_{0};
};

// Splits n items evenly over nth threads: the [begin, end) range of thread ith.
inline void split_range(int64_t n, int ith, int nth, int64_t& begin, int64_t& end) {
  int64_t per = n / nth, rem = n % nth;
  begin = ith * per + (ith < rem ? ith : rem);
  end = begin + per + (ith < rem ? 1 : 0);
}

}  // namespace ember
