// Status formatting and errno classification.
#include "core/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tz {

namespace detail {
void assert_fail(const char* condition, const char* file, int line, const char* message) {
  std::fprintf(stderr, "tierzero: assertion failed: %s at %s:%d%s%s\n", condition, file, line,
               (message && *message) ? ": " : "", message ? message : "");
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kIoError: return "io_error";
    case ErrorCode::kNoSpace: return "no_space";
    case ErrorCode::kOutOfMemory: return "out_of_memory";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kCorrupt: return "corrupt";
    case ErrorCode::kPermission: return "permission";
    case ErrorCode::kDeviceError: return "device_error";
    case ErrorCode::kCommError: return "comm_error";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

static ErrorCode classify_errno(int err) {
  switch (err) {
    case ENOSPC: case EDQUOT: return ErrorCode::kNoSpace;
    case ENOMEM: return ErrorCode::kOutOfMemory;
    case ENOENT: return ErrorCode::kNotFound;
    case EACCES: case EPERM: case EROFS: return ErrorCode::kPermission;
    case EINVAL: case EBADF: case EFAULT: case ENAMETOOLONG: return ErrorCode::kInvalidArgument;
    case ENOSYS: case EOPNOTSUPP: return ErrorCode::kUnavailable;
    default: return ErrorCode::kIoError;
  }
}

Status Status::from_errno(int err, std::string_view what, std::string_view path) {
  std::string msg(what);
  if (!path.empty()) {
    msg += ' ';
    msg += path;
  }
  msg += ": ";
  msg += std::strerror(err);
  msg += " (errno " + std::to_string(err) + ")";
  return {classify_errno(err), err, std::move(msg)};
}

Status Status::no_space(std::string_view what, std::string_view path) {
  Status s = from_errno(ENOSPC, what, path);
  return s;
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  std::string s(error_code_name(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::with_context(std::string_view context) && {
  if (is_ok()) return std::move(*this);
  message_ = std::string(context) + ": " + message_;
  return std::move(*this);
}

}  // namespace tz
