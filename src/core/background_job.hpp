// One thread that runs one job at a time behind the caller's back: start() hands it a job (after
// the one before has finished), wait() returns once the job has finished and rethrows what it
// threw. The memory tier reads the next layer's experts on it while this layer computes.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace ember {

class BackgroundJob {
 public:
  BackgroundJob();
  ~BackgroundJob();  // waits for the job under way
  BackgroundJob(const BackgroundJob&) = delete;
  BackgroundJob& operator=(const BackgroundJob&) = delete;

  void start(std::function<void()> job);
  void wait();

 private:
  void main();

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  std::exception_ptr error_;
  bool pending_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace ember
