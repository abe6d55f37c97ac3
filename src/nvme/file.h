// IoFileHandle owns one open file used for block I/O: opened with O_DIRECT when the filesystem
// allows it (else buffered, and said so), with the O_DIRECT alignment the kernel reports.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "core/status.h"
#include "nvme/io_queue.h"

namespace tz::nvme {

enum class DirectMode : std::uint8_t {
  kPrefer,   // O_DIRECT when the filesystem supports it, buffered otherwise
  kRequire,  // O_DIRECT or an error
  kOff,      // buffered
};

struct FileOpenOptions {
  bool create = false;     // O_CREAT (mode below); the file must not exist when exclusive
  bool exclusive = false;  // O_EXCL
  bool truncate = false;
  mode_t mode = 0600;
  DirectMode direct = DirectMode::kPrefer;
};

class IoFileHandle {
 public:
  // Opens `path` read-write. Errors: the open's errno naming the path; kUnavailable when
  // DirectMode::kRequire and the filesystem refuses O_DIRECT.
  static Result<IoFileHandle> open(const std::string& path, const FileOpenOptions& options);

  IoFileHandle() = default;
  IoFileHandle(IoFileHandle&& other) noexcept;
  IoFileHandle& operator=(IoFileHandle&& other) noexcept;
  IoFileHandle(const IoFileHandle&) = delete;
  IoFileHandle& operator=(const IoFileHandle&) = delete;
  ~IoFileHandle();  // closes; does not remove the file

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  std::uint32_t align_bytes() const { return align_bytes_; }
  // What IoQueue::add_file needs.
  IoFile io_file() const { return IoFile{fd_, path_, direct_, align_bytes_}; }
  // Reserves [0, bytes) with fallocate. Errors: kNoSpace with how much was asked and how much the
  // filesystem has free; kUnavailable when the filesystem cannot preallocate.
  Status preallocate(std::uint64_t bytes) const;
  Result<std::uint64_t> size_bytes() const;

 private:
  int fd_ = -1;
  std::string path_;
  bool direct_ = false;
  std::uint32_t align_bytes_ = 4096;
};

// O_DIRECT alignment for an open file (statx STATX_DIOALIGN: the larger of the memory and offset
// alignments); 4096 when the kernel does not say.
std::uint32_t direct_io_alignment(int fd);
// Free bytes for unprivileged writers on the filesystem holding `path` (0 when unknown).
std::uint64_t free_bytes_at(const std::string& path);

}  // namespace tz::nvme
