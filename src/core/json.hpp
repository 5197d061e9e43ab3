// JSON text from outside (request bodies, tool-call arguments, a model's output) parsed with a
// bound on its nesting: nlohmann's parser keeps its own stack, but copying, comparing and printing
// a value recurse once per level, so an array nested 100,000 deep (a 200 KB body) would exhaust
// the thread's stack. kMaxJsonDepth levels of arrays and objects are far past any real request.
#pragma once
#include <string_view>

#include <nlohmann/json.hpp>

namespace ember {

constexpr int kMaxJsonDepth = 128;

// The deepest nesting of arrays and objects in JSON text (brackets inside strings not counted),
// counted up to `stop_at` (a deeper text returns stop_at).
int json_nesting(std::string_view text, int stop_at = kMaxJsonDepth + 1);
// The end of the JSON array or object that starts at text[begin] (one past its closing bracket),
// strings and nesting followed; npos when it does not close.
size_t json_value_end(std::string_view text, size_t begin);

// nlohmann's parse without exceptions (J: json or ordered_json): a discarded value for text that
// is not JSON or nests deeper than kMaxJsonDepth (too_deep, where given, says which).
template <class J = nlohmann::json>
J parse_json(std::string_view text, bool* too_deep = nullptr) {
  const bool deep = json_nesting(text) > kMaxJsonDepth;
  if (too_deep) *too_deep = deep;
  if (deep) return J(J::value_t::discarded);
  return J::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

}  // namespace ember
