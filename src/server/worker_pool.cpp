#include "server/worker_pool.hpp"

#include <algorithm>
#include <chrono>

namespace ember::server {

namespace {
constexpr auto kExtraIdle = std::chrono::seconds(5);  // an extra thread's idle time before it ends
}

WorkerPool::WorkerPool(size_t base, size_t max) : base_(base), max_(std::max(base, max)) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < base_; ++i) start(false);
}

WorkerPool::~WorkerPool() { shutdown(); }

void WorkerPool::start(bool extra) {
  // Detached: an extra thread ends on its own; shutdown() waits for every one (running_).
  ++running_;
  std::thread([this, extra] { work(extra); }).detach();
}

void WorkerPool::enqueue(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back(std::move(fn));
  if (idle_ < jobs_.size() && running_ < max_ && !stop_) start(true);  // everyone busy: a thread of its own
  else cv_.notify_one();
}

void WorkerPool::shutdown() {
  std::unique_lock<std::mutex> lock(mu_);
  stop_ = true;
  cv_.notify_all();
  done_.wait(lock, [&] { return running_ == 0; });  // the queued jobs run first
}

size_t WorkerPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

void WorkerPool::work(bool extra) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    bool woke = true;
    if (extra) woke = cv_.wait_for(lock, kExtraIdle, [&] { return stop_ || !jobs_.empty(); });
    else cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    --idle_;
    if (jobs_.empty() && (stop_ || !woke)) break;  // stopping (every job done), or an idle extra
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
  --running_;
  done_.notify_all();  // under the lock: after it, this thread touches nothing of the pool
}

}  // namespace ember::server
