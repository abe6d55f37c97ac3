// TZ_ASSERT: always-on checks of invariants (programmer errors). A failure prints the condition,
// file, line and message, then aborts; operating errors use Status instead (core/status.h).
#pragma once

namespace tz::detail {
[[noreturn]] void assert_fail(const char* condition, const char* file, int line,
                              const char* message);
inline const char* assert_message() { return ""; }
inline const char* assert_message(const char* message) { return message; }
}  // namespace tz::detail

#define TZ_ASSERT(cond, ...)                                                        \
  do {                                                                              \
    if (__builtin_expect(!(cond), 0))                                               \
      ::tz::detail::assert_fail(#cond, __FILE__, __LINE__,                            \
                                ::tz::detail::assert_message(__VA_ARGS__));                 \
  } while (0)
