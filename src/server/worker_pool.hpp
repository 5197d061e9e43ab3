// The HTTP server's worker threads (a task is one connection: reading its requests, handling
// them, writing the answers; server/http_server.hpp). `base` threads always run; when every one
// is busy a connection gets a thread of its own, up to `max` in all, which ends after a few idle
// seconds. Connections that read slowly (closed after the read timeout) then take extra
// threads, not the ones /health, the queue's 503 and the generating requests need.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ember::server {

class WorkerPool {
 public:
  WorkerPool(size_t base, size_t max);
  ~WorkerPool();
  void enqueue(std::function<void()> fn);
  // Runs what is queued, then ends every thread; returns when all have ended.
  void shutdown();
  size_t threads() const;  // running now

 private:
  void start(bool extra);  // under mu_
  void work(bool extra);
  const size_t base_, max_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_;
  std::deque<std::function<void()>> jobs_;
  size_t running_ = 0, idle_ = 0;
  bool stop_ = false;
};

}  // namespace ember::server
