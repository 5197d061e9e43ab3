#include "core/json.hpp"

#include <algorithm>

namespace ember {

namespace {
// Calls f(i, +1) at each '[' or '{' of text[from..) outside strings and f(i, -1) at each ']' or
// '}', until f returns false; returns where it stopped (npos when it did not).
template <class F>
size_t for_each_bracket(std::string_view text, size_t from, F f) {
  bool in_string = false;
  for (size_t i = from; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if ((c == '[' || c == '{') && !f(i, 1)) {
      return i;
    } else if ((c == ']' || c == '}') && !f(i, -1)) {
      return i;
    }
  }
  return std::string_view::npos;
}
}  // namespace

int json_nesting(std::string_view text, int stop_at) {
  int depth = 0, deepest = 0;
  for_each_bracket(text, 0, [&](size_t, int step) {
    depth += step;
    deepest = std::max(deepest, depth);
    return deepest < stop_at;
  });
  return deepest;
}

size_t json_value_end(std::string_view text, size_t begin) {
  int depth = 0;
  const size_t at = for_each_bracket(text, begin, [&](size_t, int step) { return (depth += step) != 0; });
  return at == std::string_view::npos ? at : at + 1;
}

}  // namespace ember
