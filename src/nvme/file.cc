// IoFileHandle: open with O_DIRECT fallback, alignment discovery and preallocation.
#include "nvme/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/check.h"
#include "core/host_probe.h"
#include "core/units.h"

namespace tz::nvme {

std::uint32_t direct_io_alignment(int fd) {
  struct statx stx {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) &&
      stx.stx_dio_offset_align > 0) {
    return std::max(stx.stx_dio_offset_align, stx.stx_dio_mem_align);
  }
  return 4096;
}

std::uint64_t free_bytes_at(const std::string& path) {
  const Result<FilesystemSpace> space = filesystem_space(path);
  return space.is_ok() ? space->free_bytes : 0;
}

Result<IoFileHandle> IoFileHandle::open(const std::string& path, const FileOpenOptions& options) {
  int flags = O_RDWR | O_CLOEXEC;
  if (options.create) flags |= O_CREAT;
  if (options.exclusive) flags |= O_EXCL;
  if (options.truncate) flags |= O_TRUNC;
  IoFileHandle h;
  h.path_ = path;
  int fd = -1;
  if (options.direct != DirectMode::kOff) {
    do {
      fd = ::open(path.c_str(), flags | O_DIRECT, options.mode);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0) {
      h.direct_ = true;
    } else if (errno != EINVAL) {
      return Status::from_errno(errno, "open", path);
    } else if (options.direct == DirectMode::kRequire) {
      return Status(ErrorCode::kUnavailable, EINVAL,
                    "open " + path + ": the filesystem does not support O_DIRECT");
    }
  }
  if (fd < 0) {
    do {
      fd = ::open(path.c_str(), flags, options.mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return Status::from_errno(errno, "open", path);
  }
  h.fd_ = fd;
  h.align_bytes_ = h.direct_ ? direct_io_alignment(fd) : 1;
  return h;
}

IoFileHandle::IoFileHandle(IoFileHandle&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), direct_(other.direct_),
      align_bytes_(other.align_bytes_) {
  other.fd_ = -1;
}

IoFileHandle& IoFileHandle::operator=(IoFileHandle&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    direct_ = other.direct_;
    align_bytes_ = other.align_bytes_;
    other.fd_ = -1;
  }
  return *this;
}

IoFileHandle::~IoFileHandle() {
  // close() errors on a file only read or written with O_DIRECT carry no lost data.
  if (fd_ >= 0) ::close(fd_);
}

Status IoFileHandle::preallocate(std::uint64_t bytes) const {
  if (bytes == 0) return Status::ok();
  int rc;
  do {
    rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return Status::ok();
  const int err = errno;
  if (err == ENOSPC || err == EDQUOT) {
    return Status(ErrorCode::kNoSpace, err,
                  "preallocating " + path_ + ": asked for " + format_bytes(static_cast<double>(bytes)) +
                      " (" + std::to_string(bytes) + " bytes) but the filesystem has " +
                      format_bytes(static_cast<double>(free_bytes_at(path_))) + " free");
  }
  if (err == EOPNOTSUPP) {
    return Status(ErrorCode::kUnavailable, err,
                  "preallocating " + path_ + ": the filesystem does not support fallocate");
  }
  return Status::from_errno(err, "fallocate", path_);
}

Result<std::uint64_t> IoFileHandle::size_bytes() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return Status::from_errno(errno, "fstat", path_);
  return static_cast<std::uint64_t>(st.st_size);
}

}  // namespace tz::nvme
