// Fair admission to a fixed number of sessions ("slots", each with its own KV cache): requests
// get slots in arrival order (FIFO), at most `max_waiting` wait beyond the busy slots, and a
// request past that is turned away at once (the server answers 503). A Ticket is RAII: while
// it lives it holds a place in the line or a slot; destroying it (request done, client gone)
// gives the place back and wakes the next waiter.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace ember::server {

class SlotQueue {
 public:
  SlotQueue(size_t n_slots, size_t max_waiting);
  SlotQueue(const SlotQueue&) = delete;
  SlotQueue& operator=(const SlotQueue&) = delete;

  // How much a request gains from a slot (the server: prompt tokens the slot's cache already
  // holds); called for free slots, with the queue's lock held.
  using Affinity = std::function<size_t(size_t slot)>;

  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    // Waits for a slot in FIFO order. Every `poll` it calls `cancelled` (without the lock held);
    // when that returns true it leaves the line and returns -1. Returns the slot index.
    int wait(const std::function<bool()>& cancelled = {}, std::chrono::milliseconds poll = std::chrono::milliseconds(100));
    int slot() const { return slot_; }

   private:
    friend class SlotQueue;
    Ticket(SlotQueue& q, uint64_t id, Affinity affinity) : q_(q), id_(id), affinity_(std::move(affinity)) {}
    SlotQueue& q_;
    uint64_t id_;
    Affinity affinity_;
    int slot_ = -1;
    bool in_line_ = true;
  };

  // A place in line, or nullptr when busy slots plus waiters already reach n_slots + max_waiting.
  // When its turn comes the ticket gets the free slot of the highest affinity (the lowest index
  // among equals; any free slot without an affinity).
  std::unique_ptr<Ticket> enqueue(Affinity affinity = {});

  struct Stats {
    size_t n_slots = 0, max_waiting = 0;
    size_t busy = 0, waiting = 0;
    uint64_t admitted = 0, rejected = 0;
  };
  Stats stats() const;

 private:
  void leave(Ticket& t);
  int free_slot_locked(const Affinity& affinity) const;

  const size_t max_waiting_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> busy_;
  size_t n_busy_ = 0;
  std::deque<uint64_t> line_;
  uint64_t next_id_ = 0;
  uint64_t admitted_ = 0, rejected_ = 0;
};

}  // namespace ember::server
