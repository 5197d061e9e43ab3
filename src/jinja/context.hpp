// A render's state: the scopes of variables (builtins, the caller's values, the template's
// top level, then one per loop body and macro call), the loop control in flight, and the bounds
// every render runs within (steps, output bytes, macro call depth), so that no template, however
// written, runs away.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "jinja/value.hpp"

namespace ember::jinja {

struct Limits {
  int64_t max_steps = 5'000'000;      // expressions evaluated and statements run
  size_t max_output = 64u << 20;      // bytes of text written
  int max_call_depth = 64;            // macros calling macros
  int64_t max_range = 1'000'000;      // items range() may make
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

  void tick(int line);                     // one step; throws past Limits::max_steps
  void wrote(const std::string& out) const;  // throws past Limits::max_output

  const Limits& limits() const { return limits_; }
  Flow flow = Flow::normal;
  int call_depth = 0;

 private:
  std::vector<Scope> scopes_;
  Limits limits_;
  int64_t steps_ = 0;
};

}  // namespace ember::jinja
