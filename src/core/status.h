// Status and Result<T>: how operating errors travel (STYLE.md, "Errors"). A Status carries a
// category, the errno or library code that caused it and a message naming what failed; TZ_ASSERT
// is for broken invariants and aborts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "core/assert.h"

namespace tz {

enum class ErrorCode : std::uint8_t {
  kOk = 0,
  kInvalidArgument,  // bad input: a config value, a CLI flag, an alignment rule
  kNotFound,
  kIoError,          // EIO and other I/O failures
  kNoSpace,          // ENOSPC, a full swap space
  kOutOfMemory,      // a budget or an allocator refused
  kUnavailable,      // a feature or device the machine does not have
  kCorrupt,          // a checksum mismatch or a malformed file
  kPermission,
  kDeviceError,      // a failed CUDA call
  kCommError,        // a failed NCCL or MPI call
  kInternal,
};

std::string_view error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(ErrorCode code, int sys_code, std::string message)
      : code_(code), sys_code_(sys_code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  static Status invalid_argument(std::string message) {
    return {ErrorCode::kInvalidArgument, 0, std::move(message)};
  }
  static Status not_found(std::string message) {
    return {ErrorCode::kNotFound, 0, std::move(message)};
  }
  static Status unavailable(std::string message) {
    return {ErrorCode::kUnavailable, 0, std::move(message)};
  }
  static Status out_of_memory(std::string message) {
    return {ErrorCode::kOutOfMemory, 0, std::move(message)};
  }
  static Status corrupt(std::string message) {
    return {ErrorCode::kCorrupt, 0, std::move(message)};
  }
  static Status internal(std::string message) {
    return {ErrorCode::kInternal, 0, std::move(message)};
  }
  // "<what> <path>: <strerror> (errno N)"; category chosen from the errno (ENOSPC -> kNoSpace, ...).
  static Status from_errno(int err, std::string_view what, std::string_view path = {});
  static Status no_space(std::string_view what, std::string_view path = {});

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  // The errno or library code behind the error (0 if none).
  int sys_code() const { return sys_code_; }
  const std::string& message() const { return message_; }
  // "io_error: swap write /x: No space left on device (errno 28)".
  std::string to_string() const;
  // Prefixes the message with "context: " (no-op on OK), so callers add where the error surfaced.
  Status with_context(std::string_view context) &&;

  // Marks a status as deliberately ignored (for example a best-effort cleanup).
  void ignore() const {}

 private:
  ErrorCode code_ = ErrorCode::kOk;
  int sys_code_ = 0;
  std::string message_;
};

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<T, Status>, "Result<Status> makes no sense");

 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    TZ_ASSERT(!std::get<Status>(v_).is_ok(), "Result constructed from an OK status");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }

  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & {
    TZ_ASSERT(is_ok(), status().to_string().c_str());
    return std::get<T>(v_);
  }
  const T& value() const& {
    TZ_ASSERT(is_ok(), status().to_string().c_str());
    return std::get<T>(v_);
  }
  T&& value() && {
    TZ_ASSERT(is_ok(), status().to_string().c_str());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  Status take_status() && { return is_ok() ? Status{} : std::get<Status>(std::move(v_)); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tz

#define TZ_CONCAT_INNER_(a, b) a##b
#define TZ_CONCAT_(a, b) TZ_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) is not OK.
#define TZ_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::tz::Status tz_status_ = (expr);             \
    if (!tz_status_.is_ok()) return tz_status_;   \
  } while (0)

// `lhs = value of expr` (a Result<T>), or returns its Status from the enclosing function.
#define TZ_ASSIGN_OR_RETURN(lhs, expr) \
  TZ_ASSIGN_OR_RETURN_IMPL_(TZ_CONCAT_(tz_result_, __LINE__), lhs, expr)
#define TZ_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)            \
  auto tmp = (expr);                                         \
  if (!tmp.is_ok()) return std::move(tmp).take_status();     \
  lhs = std::move(tmp).value()
