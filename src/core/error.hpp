// Errors: one exception type carrying a message that says what was wrong and what to do.
#pragma once
#include <stdexcept>
#include <string>
#include <fmt/format.h>

namespace ember {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <class... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> fmt, Args&&... args) {
  throw Error(fmt::format(fmt, std::forward<Args>(args)...));
}

}  // namespace ember

// Checks a condition that depends on input (files, flags); throws ember::Error when false.
#define EMBER_CHECK(cond, ...)                 \
  do {                                         \
    if (!(cond)) ::ember::fail(__VA_ARGS__);   \
  } while (0)
