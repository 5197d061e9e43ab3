// Logging to stderr. Levels keep progress messages apart from the generated text on stdout.
#pragma once
#include <cstdio>
#include <fmt/format.h>
#include <string>

namespace ember {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, quiet = 4 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, const std::string& message);

template <class... Args>
void log_info(fmt::format_string<Args...> fmt, Args&&... args) {
  if (log_level() <= LogLevel::info) log_write(LogLevel::info, fmt::format(fmt, std::forward<Args>(args)...));
}
template <class... Args>
void log_warn(fmt::format_string<Args...> fmt, Args&&... args) {
  if (log_level() <= LogLevel::warn) log_write(LogLevel::warn, fmt::format(fmt, std::forward<Args>(args)...));
}
template <class... Args>
void log_debug(fmt::format_string<Args...> fmt, Args&&... args) {
  if (log_level() <= LogLevel::debug) log_write(LogLevel::debug, fmt::format(fmt, std::forward<Args>(args)...));
}

}  // namespace ember
