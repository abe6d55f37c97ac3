// Levelled logging to stderr, safe from any thread. The level comes from TZ_LOG_LEVEL
// (error, warn, info, debug; default info) or set_log_level (the CLI's --log-level).
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace tz {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

std::optional<LogLevel> parse_log_level(std::string_view name);
void set_log_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);
// Writes one line "[tierzero <level> <elapsed>s] <message>".
void log_line(LogLevel level, std::string_view message);

namespace detail {
template <typename... Args>
std::string format(const char* fmt, Args&&... args) {
  if constexpr (sizeof...(Args) == 0) {
    return fmt;
  } else {
    const int n = std::snprintf(nullptr, 0, fmt, args...);
    std::string out(static_cast<std::size_t>(n > 0 ? n : 0), '\0');
    std::snprintf(out.data(), out.size() + 1, fmt, args...);
    return out;
  }
}
}  // namespace detail

}  // namespace tz

// printf-style; the arguments are evaluated only when the level is enabled.
#define TZ_LOG(level, ...)                                                          \
  do {                                                                              \
    if (::tz::log_enabled(::tz::LogLevel::level))                                   \
      ::tz::log_line(::tz::LogLevel::level, ::tz::detail::format(__VA_ARGS__));     \
  } while (0)
#define TZ_LOG_ERROR(...) TZ_LOG(kError, __VA_ARGS__)
#define TZ_LOG_WARN(...) TZ_LOG(kWarn, __VA_ARGS__)
#define TZ_LOG_INFO(...) TZ_LOG(kInfo, __VA_ARGS__)
#define TZ_LOG_DEBUG(...) TZ_LOG(kDebug, __VA_ARGS__)
