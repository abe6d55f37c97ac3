// Checked calls: one helper per C API family, each turning a return code into a Status that
// carries the code and names what failed. Transient codes (EINTR, EAGAIN) are the caller's to
// retry before calling these; they are reported like any other code here.
#pragma once

#include <string_view>

#include "core/status.h"

namespace tz {

// POSIX calls returning -1 and setting errno (open, fallocate, mlock, ...).
Status check_posix(long rc, std::string_view what, std::string_view path = {});
// liburing and libaio calls returning -errno (io_uring_queue_init, io_setup, a cqe's res, ...).
Status check_neg_errno(long rc, std::string_view what, std::string_view path = {});
// CUDA runtime: `code` is the cudaError_t, `code_name`/`code_text` from cudaGetErrorName/String.
Status check_cuda(int code, const char* code_name, const char* code_text, std::string_view what);
// NCCL: `code` is the ncclResult_t, `code_text` from ncclGetErrorString.
Status check_nccl(int code, const char* code_text, std::string_view what);
// MPI: `code` is the MPI return code, `code_text` from MPI_Error_string.
Status check_mpi(int code, const char* code_text, std::string_view what);

}  // namespace tz
