#include "core/log.hpp"

#include <atomic>
#include <mutex>

namespace ember {
namespace {
std::atomic<LogLevel> g_level{LogLevel::info};
std::mutex g_mutex;
}  // namespace

LogLevel log_level() { return g_level.load(std::memory_order_relaxed); }
void set_log_level(LogLevel level) { g_level.store(level, std::memory_order_relaxed); }

void log_write(LogLevel level, const std::string& message) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::lock_guard lock(g_mutex);
  std::fprintf(stderr, "%s: %s\n", names[static_cast<int>(level)], message.c_str());
}

}  // namespace ember
