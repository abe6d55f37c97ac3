// Checked-call helpers (core/check.h).
#include "core/check.h"

#include <cerrno>
#include <string>

namespace tz {

Status check_posix(long rc, std::string_view what, std::string_view path) {
  if (rc != -1) return Status::ok();
  return Status::from_errno(errno, what, path);
}

Status check_neg_errno(long rc, std::string_view what, std::string_view path) {
  if (rc >= 0) return Status::ok();
  return Status::from_errno(static_cast<int>(-rc), what, path);
}

Status check_cuda(int code, const char* code_name, const char* code_text, std::string_view what) {
  if (code == 0) return Status::ok();
  std::string msg(what);
  msg += ": ";
  msg += code_name ? code_name : "cudaError";
  msg += " (";
  msg += code_text ? code_text : "unknown";
  msg += ", code " + std::to_string(code) + ")";
  return {ErrorCode::kDeviceError, code, std::move(msg)};
}

Status check_nccl(int code, const char* code_text, std::string_view what) {
  if (code == 0) return Status::ok();
  std::string msg(what);
  msg += ": NCCL error ";
  msg += std::to_string(code);
  msg += " (";
  msg += code_text ? code_text : "unknown";
  msg += ")";
  return {ErrorCode::kCommError, code, std::move(msg)};
}

Status check_mpi(int code, const char* code_text, std::string_view what) {
  if (code == 0) return Status::ok();
  std::string msg(what);
  msg += ": MPI error ";
  msg += std::to_string(code);
  msg += " (";
  msg += code_text ? code_text : "unknown";
  msg += ")";
  return {ErrorCode::kCommError, code, std::move(msg)};
}

}  // namespace tz
