#include "server/slot_queue.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace ember::server {

SlotQueue::SlotQueue(size_t n_slots, size_t max_waiting) : max_waiting_(max_waiting), busy_(n_slots, false) {
  EMBER_CHECK(n_slots >= 1, "the number of parallel sessions must be at least 1");
}

std::unique_ptr<SlotQueue::Ticket> SlotQueue::enqueue(Affinity affinity) {
  std::lock_guard lock(mu_);
  if (n_busy_ + line_.size() >= busy_.size() + max_waiting_) {
    ++rejected_;
    return nullptr;
  }
  ++admitted_;
  uint64_t id = next_id_++;
  line_.push_back(id);
  return std::unique_ptr<Ticket>(new Ticket(*this, id, std::move(affinity)));
}

int SlotQueue::free_slot_locked(const Affinity& affinity) const {
  int best = -1;
  size_t best_gain = 0;
  for (size_t i = 0; i < busy_.size(); ++i) {
    if (busy_[i]) continue;
    if (!affinity) return static_cast<int>(i);
    const size_t gain = affinity(i);
    if (best < 0 || gain > best_gain) best = static_cast<int>(i), best_gain = gain;
  }
  return best;
}

int SlotQueue::Ticket::wait(const std::function<bool()>& cancelled, std::chrono::milliseconds poll) {
  if (slot_ >= 0) return slot_;
  if (!in_line_) return -1;
  std::unique_lock lock(q_.mu_);
  for (;;) {
    const bool first = !q_.line_.empty() && q_.line_.front() == id_;
    const int free = first ? q_.free_slot_locked(affinity_) : -1;
    if (free >= 0) {
      q_.line_.pop_front();
      q_.busy_[free] = true;
      ++q_.n_busy_;
      in_line_ = false;
      slot_ = free;
      // Another slot may be free for the next in line.
      q_.cv_.notify_all();
      return slot_;
    }
    q_.cv_.wait_for(lock, poll);
    if (cancelled) {
      lock.unlock();
      bool stop = cancelled();
      lock.lock();
      if (stop) {
        auto it = std::find(q_.line_.begin(), q_.line_.end(), id_);
        if (it != q_.line_.end()) q_.line_.erase(it);
        in_line_ = false;
        q_.cv_.notify_all();
        return -1;
      }
    }
  }
}

void SlotQueue::leave(Ticket& t) {
  std::lock_guard lock(mu_);
  if (t.in_line_) {
    auto it = std::find(line_.begin(), line_.end(), t.id_);
    if (it != line_.end()) line_.erase(it);
    t.in_line_ = false;
  }
  if (t.slot_ >= 0) {
    busy_[t.slot_] = false;
    --n_busy_;
    t.slot_ = -1;
  }
  cv_.notify_all();
}

SlotQueue::Ticket::~Ticket() { q_.leave(*this); }

SlotQueue::Stats SlotQueue::stats() const {
  std::lock_guard lock(mu_);
  return Stats{busy_.size(), max_waiting_, n_busy_, line_.size(), admitted_, rejected_};
}

}  // namespace ember::server
