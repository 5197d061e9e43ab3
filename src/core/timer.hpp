// Wall-clock timing for progress and benchmark reports.
#pragma once
#include <chrono>

namespace ember {

inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

class Timer {
 public:
  Timer() : start_(now_seconds()) {}
  double seconds() const { return now_seconds() - start_; }
  void reset() { start_ = now_seconds(); }

 private:
  double start_;
};

}  // namespace ember
