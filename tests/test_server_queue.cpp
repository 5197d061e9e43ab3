// The server's fair queue of sessions: FIFO order, bounded slots and waiters, cancellation.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "server/slot_queue.hpp"

using namespace ember::server;
using namespace std::chrono_literals;

TEST(SlotQueue, LimitsSlotsPlusWaiters) {
  SlotQueue q(2, 3);
  std::vector<std::unique_ptr<SlotQueue::Ticket>> held;
  for (int i = 0; i < 5; ++i) {
    held.push_back(q.enqueue());
    ASSERT_TRUE(held.back()) << i;
  }
  EXPECT_FALSE(q.enqueue());  // 2 slots + 3 waiting
  EXPECT_EQ(q.stats().rejected, 1u);
  EXPECT_EQ(held[0]->wait(), 0);
  EXPECT_EQ(held[1]->wait(), 1);
  EXPECT_EQ(q.stats().busy, 2u);
  EXPECT_EQ(q.stats().waiting, 3u);
  held.erase(held.begin());  // frees slot 0
  EXPECT_EQ(q.stats().busy, 1u);
  EXPECT_TRUE(q.enqueue());  // room again (and the temporary ticket leaves at once)
  EXPECT_EQ(held[1]->wait(), 0);
}

TEST(SlotQueue, ZeroQueueMeansOnlyFreeSlots) {
  SlotQueue q(1, 0);
  auto a = q.enqueue();
  ASSERT_TRUE(a);
  EXPECT_FALSE(q.enqueue());
  a.reset();
  EXPECT_TRUE(q.enqueue());
}

TEST(SlotQueue, ServesInArrivalOrder) {
  SlotQueue q(1, 16);
  auto first = q.enqueue();
  ASSERT_EQ(first->wait(), 0);
  std::vector<std::unique_ptr<SlotQueue::Ticket>> tickets;
  for (int i = 0; i < 8; ++i) tickets.push_back(q.enqueue());
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread> threads;
  // Start the waiters in reverse order: the queue, not the thread start order, decides.
  for (int i = 7; i >= 0; --i) {
    threads.emplace_back([&, i] {
      tickets[i]->wait({}, 5ms);
      {
        std::lock_guard lock(mu);
        order.push_back(i);
      }
      std::this_thread::sleep_for(2ms);
      tickets[i].reset();
    });
  }
  std::this_thread::sleep_for(20ms);
  first.reset();
  for (auto& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(q.stats().busy, 0u);
  EXPECT_EQ(q.stats().waiting, 0u);
}

TEST(SlotQueue, CancelledWaiterLeavesTheLine) {
  SlotQueue q(1, 4);
  auto a = q.enqueue();
  ASSERT_EQ(a->wait(), 0);
  auto b = q.enqueue();
  auto c = q.enqueue();
  std::atomic<bool> cancel{false};
  std::thread tb([&] { EXPECT_EQ(b->wait([&] { return cancel.load(); }, 1ms), -1); });
  std::this_thread::sleep_for(5ms);
  cancel = true;
  tb.join();
  EXPECT_EQ(q.stats().waiting, 1u);
  a.reset();
  EXPECT_EQ(c->wait({}, 1ms), 0);  // c moved up past the cancelled b
}

TEST(SlotQueue, DroppedTicketFreesItsPlace) {
  SlotQueue q(1, 1);
  auto a = q.enqueue();
  auto b = q.enqueue();
  EXPECT_FALSE(q.enqueue());
  b.reset();  // a client that went away while waiting
  EXPECT_EQ(q.stats().waiting, 1u);
  auto c = q.enqueue();
  EXPECT_TRUE(c);
}

TEST(SlotQueue, ManyThreadsNeverExceedTheSlots) {
  SlotQueue q(3, 64);
  std::atomic<int> running{0}, max_running{0}, served{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 20; ++k) {
        auto t = q.enqueue();
        ASSERT_TRUE(t);
        int slot = t->wait({}, 1ms);
        ASSERT_GE(slot, 0);
        ASSERT_LT(slot, 3);
        int now = ++running;
        int prev = max_running.load();
        while (now > prev && !max_running.compare_exchange_weak(prev, now)) {
        }
        std::this_thread::yield();
        --running;
        ++served;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(served.load(), 32 * 20);
  EXPECT_LE(max_running.load(), 3);
  EXPECT_EQ(q.stats().busy, 0u);
}

// The prompt cache's choice: the free slot of the highest affinity, the lowest index among
// equals, and never a busy one; FIFO order still decides who chooses first.
TEST(SlotQueue, AffinityPicksTheBestFreeSlot) {
  SlotQueue q(3, 4);
  const std::vector<size_t> gain = {2, 7, 7};
  auto a = q.enqueue([&](size_t s) { return gain[s]; });
  EXPECT_EQ(a->wait(), 1);  // 7 beats 2; slot 1 before slot 2
  auto b = q.enqueue([&](size_t s) { return gain[s]; });
  EXPECT_EQ(b->wait(), 2);  // slot 1 is busy
  auto c = q.enqueue([&](size_t s) { return s == 1 ? size_t{100} : 0; });
  EXPECT_EQ(c->wait(), 0);  // the only free one, whatever it prefers
  auto d = q.enqueue([&](size_t s) { return s == 2 ? size_t{100} : 0; });
  auto e = q.enqueue();
  a.reset();  // frees slot 1: d is first in line and takes it although it prefers the busy slot 2
  EXPECT_EQ(d->wait(), 1);
  b.reset();
  EXPECT_EQ(e->wait(), 2);
}
