#include "core/thread_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>

#include "core/error.hpp"
#include <vector>

using namespace ember;

TEST(ThreadPool, EveryThreadRunsOncePerJob) {
  for (int n : {1, 2, 3, 7}) {
    ThreadPool pool(n);
    std::vector<std::atomic<int>> hits(n);
    const int jobs = n <= 2 ? 500 : 50;  // more threads than cores: each job waits on wake-ups
    for (int job = 0; job < jobs; ++job) {
      pool.run([&](int ith, int nth) {
        ASSERT_EQ(nth, n);
        hits[ith].fetch_add(1);
      });
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), jobs) << "thread " << i << " of " << n;
  }
}

TEST(ThreadPool, ParallelForCoversRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 5, 1000, 1023}) {
    std::vector<std::atomic<int>> seen(n > 0 ? n : 1);
    pool.parallel_for(n, 7, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) seen[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i].load(), 1) << i;
  }
}

TEST(ThreadPool, SplitRangePartitions) {
  for (int64_t n : {0, 1, 10, 33}) {
    for (int nth : {1, 2, 5}) {
      int64_t expect_begin = 0;
      for (int ith = 0; ith < nth; ++ith) {
        int64_t b, e;
        split_range(n, ith, nth, b, e);
        EXPECT_EQ(b, expect_begin);
        EXPECT_LE(e - b, n / nth + 1);
        expect_begin = e;
      }
      EXPECT_EQ(expect_begin, n);
    }
  }
}

// Each round every thread writes its own slot (plain ints: a barrier that published nothing
// would show up here, and under ThreadSanitizer as a race), waits, reads everyone's, and waits
// again before the next round overwrites them; over several jobs, so the barrier's count and
// generation carry over correctly from job to job.
TEST(ThreadPool, BarrierSeparatesStepsOfAJob) {
  for (int n : {1, 2, 3, 7}) {
    ThreadPool pool(n);
    std::vector<int> slot(n, -1);
    std::vector<int64_t> seen(n, 0);
    const int jobs = n <= 2 ? 50 : 10, rounds = 20;
    for (int job = 0; job < jobs; ++job) {
      pool.run([&](int ith, int nth) {
        for (int r = 0; r < rounds; ++r) {
          slot[ith] = job * rounds + r + ith;
          pool.barrier();
          for (int t = 0; t < nth; ++t) seen[ith] += slot[t] == job * rounds + r + t ? 1 : 0;
          pool.barrier();
        }
      });
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(seen[i], int64_t{jobs} * rounds * n) << "thread " << i << " of " << n;
  }
}

TEST(ThreadPool, RejectsBadThreadCount) { EXPECT_THROW(ThreadPool(0), Error); }
