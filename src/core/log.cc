// Logging (core/log.h).
#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>

namespace tz {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("TZ_LOG_LEVEL");
  if (env != nullptr) {
    if (auto level = parse_log_level(env)) return *level;
  }
  return LogLevel::kInfo;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

const auto kStart = std::chrono::steady_clock::now();

}  // namespace

std::optional<LogLevel> parse_log_level(std::string_view name) {
  if (name == "error") return LogLevel::kError;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "info") return LogLevel::kInfo;
  if (name == "debug") return LogLevel::kDebug;
  return std::nullopt;
}

void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(level_storage().load()); }
bool log_enabled(LogLevel level) { return static_cast<int>(level) <= level_storage().load(); }

void log_line(LogLevel level, std::string_view message) {
  static std::mutex mu;
  static const char* const kNames[] = {"error", "warn", "info", "debug"};
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - kStart).count();
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[tierzero %s %.3fs] %.*s\n", kNames[static_cast<int>(level)], elapsed,
               static_cast<int>(message.size()), message.data());
}

}  // namespace tz
