#include "core/background_job.hpp"

namespace ember {

BackgroundJob::BackgroundJob() : thread_([this] { main(); }) {}

BackgroundJob::~BackgroundJob() {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !pending_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundJob::start(std::function<void()> job) {
  wait();
  {
    std::lock_guard lock(mu_);
    job_ = std::move(job);
    pending_ = true;
  }
  cv_.notify_all();
}

void BackgroundJob::wait() {
  std::exception_ptr e;
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !pending_; });
    std::swap(e, error_);
  }
  if (e) std::rethrow_exception(e);
}

void BackgroundJob::main() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return pending_ || stop_; });
    if (!pending_) return;  // stopped, nothing left to run
    std::function<void()> job = std::move(job_);
    lock.unlock();
    std::exception_ptr e;
    try {
      job();
    } catch (...) {
      e = std::current_exception();
    }
    lock.lock();
    error_ = e;
    pending_ = false;
    cv_.notify_all();
  }
}

}  // namespace ember
