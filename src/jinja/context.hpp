// A render's state: the scopes of variables (builtins, the caller's values, the template's
// top level, then one per loop body and macro call), the loop control in flight, and the bounds
// every render runs within (steps, time, output bytes, bytes of values made, macro call depth),
// so that no template, however written, runs away.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "jinja/value.hpp"

namespace ember::jinja {

struct Limits {
  int64_t max_steps = 5'000'000;      // expressions evaluated, statements run and loop iterations
  double max_seconds = 5;             // wall time
  size_t max_output = 64u << 20;      // bytes of text written
  size_t max_made = 256u << 20;       // bytes of strings and list items made, in all
  int max_call_depth = 64;            // macros calling macros
  int64_t max_range = 1'000'000;      // items range() may make
  const std::atomic<bool>* cancel = nullptr;  // where set and true, the render stops (an Error)
};

class Context {
 public:
  using Scope = std::unordered_map<std::string, Value>;
  enum class Flow { normal, break_loop, continue_loop };

  Context(const Value& variables, const Limits& limits);

  // The innermost binding of a name (undefined where none).
  Value lookup(const std::string& name) const;
  void set(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }
  void push() { scopes_.emplace_back(); }
  void pop() { scopes_.pop_back(); }
  // For a macro call: only the template's top level and a frame of its own are visible.
  std::vector<Scope> enter_macro();
  void leave_macro(std::vector<Scope> saved) { scopes_ = std::move(saved); }

  // One step; throws past Limits::max_steps, past max_seconds or once cancel is set (both looked
  // at every 1024 steps).
  void tick(int line);
  void wrote(const std::string& out) const;  // throws past Limits::max_output

  const Limits& limits() const { return limits_; }
  Flow flow = Flow::normal;
  int call_depth = 0;

 private:
  std::vector<Scope> scopes_;
  Limits limits_;
  int64_t steps_ = 0;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace ember::jinja
