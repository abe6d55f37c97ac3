// core/output_file.h: temporary file, fsync, rename; folders made once; inputs never overwritten.
#include "core/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <optional>
#include <utility>

#include "core/host_probe.h"
#include "core/units.h"

namespace tz {
namespace fs = std::filesystem;

namespace {

// Writes all of `bytes` at `offset` (pwrite), or at the file's position without one (write);
// EINTR and short writes are retried. Returns 0, or the errno of the failed call.
int write_fully(int fd, std::span<const std::byte> bytes, std::optional<std::uint64_t> offset) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::byte* p = bytes.data() + done;
    const std::size_t left = bytes.size() - done;
    const ssize_t n =
        offset ? ::pwrite(fd, p, left, static_cast<off_t>(*offset + done)) : ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

std::string folder_of(const std::string& path) {
  const std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? std::string(".") : parent;
}

std::string prefixed(std::string_view what, const std::string& rest) {
  return what.empty() ? rest : std::string(what) + ": " + rest;
}

Status with_what(std::string_view what, Status st) {
  if (st.is_ok() || what.empty()) return st;
  return Status(st.code(), st.sys_code(), std::string(what) + ": " + st.message());
}

Status fsync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::from_errno(errno, "open folder", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems (tmpfs on old kernels) refuse fsync on a folder; the rename already
  // happened, so only a real I/O error is reported.
  if (rc != 0 && err != EINVAL) return Status::from_errno(err, "fsync folder", dir);
  return Status::ok();
}

}  // namespace

Status make_folders(const std::string& dir) {
  if (dir.empty()) return Status::ok();
  std::string partial;
  const fs::path p(dir);
  for (const auto& part : p) {
    partial = partial.empty() ? part.string()
              : partial == "/" ? "/" + part.string()
                               : partial + "/" + part.string();
    if (part.empty() || part == "/" || part == "." || part == "..") continue;
    struct stat st {};
    if (::stat(partial.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return Status::invalid_argument("cannot create folder " + dir + ": " + partial +
                                        " is a file");
      }
      continue;
    }
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return Status::from_errno(errno, "cannot create folder", partial);
    }
  }
  return Status::ok();
}

Status check_output(std::string_view what, const std::string& path,
                    const std::vector<std::string>& inputs, std::uint64_t needed_bytes) {
  if (path.empty()) return Status::invalid_argument(prefixed(what, "empty output path"));
  struct stat out {};
  const bool exists = ::stat(path.c_str(), &out) == 0;
  if (exists && S_ISDIR(out.st_mode)) {
    return Status::invalid_argument(prefixed(what, path + " is a folder, not a file"));
  }
  for (const std::string& in : inputs) {
    if (in.empty()) continue;
    struct stat st {};
    const bool same = exists ? (::stat(in.c_str(), &st) == 0 && st.st_dev == out.st_dev &&
                                st.st_ino == out.st_ino)
                             : fs::weakly_canonical(in) == fs::weakly_canonical(path);
    if (same) {
      return Status::invalid_argument(prefixed(what, path + " is also an input (" + in +
                                                         "); write the output elsewhere"));
    }
  }
  // The old file's bytes come back once the rename replaces it.
  const std::uint64_t reclaimed = exists ? static_cast<std::uint64_t>(out.st_size) : 0;
  return check_folder(what, folder_of(path),
                      needed_bytes > reclaimed ? needed_bytes - reclaimed : 0);
}

Status check_folder(std::string_view what, const std::string& dir, std::uint64_t needed_bytes,
                    bool create) {
  // A missing folder is judged by its nearest existing ancestor, where it would be made when the
  // output is written: the check itself leaves nothing behind, so a run that fails later has
  // written nothing.
  std::string at = dir.empty() ? std::string(".") : dir;
  struct stat st {};
  while (::stat(at.c_str(), &st) != 0) {
    if (!create || (errno != ENOENT && errno != ENOTDIR)) {
      return with_what(what, Status::from_errno(errno, "cannot use folder", at));
    }
    const std::string parent = folder_of(at);
    if (parent == at) return with_what(what, Status::from_errno(ENOENT, "cannot use folder", dir));
    at = parent;
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::invalid_argument(prefixed(what, at + " is a file, not a folder"));
  }
  // Creating a file is the only reliable test (read-only mounts, ACLs, root on a read-only bind).
  const std::string probe = at + "/.tierzero-probe." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return with_what(what, Status::from_errno(errno, "cannot write in", at));
  ::close(fd);
  ::unlink(probe.c_str());
  if (needed_bytes > 0) {
    const Result<FilesystemSpace> space = filesystem_space(at);
    if (!space.is_ok()) return with_what(what, space.status());
    const std::uint64_t free_bytes = space->free_bytes;
    if (free_bytes < needed_bytes) {
      return Status::no_space(prefixed(
          what, at + " has " + format_bytes(static_cast<double>(free_bytes)) + " free but " +
                    format_bytes(static_cast<double>(needed_bytes)) + " are needed (short by " +
                    format_bytes(static_cast<double>(needed_bytes - free_bytes)) + ")"));
    }
  }
  return Status::ok();
}

Result<OutputFile> OutputFile::create(std::string_view what, const std::string& path,
                                      const std::vector<std::string>& inputs) {
  TZ_RETURN_IF_ERROR(check_output(what, path, inputs));
  TZ_RETURN_IF_ERROR(with_what(what, make_folders(folder_of(path))));
  const fs::path p(path);
  const std::string temp = folder_of(path) + "/." + p.filename().string() + ".tmp." +
                           std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return with_what(what, Status::from_errno(errno, "cannot create", temp));
  return OutputFile(path, temp, fd);
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : path_(std::move(other.path_)), temp_(std::move(other.temp_)),
      fd_(std::exchange(other.fd_, -1)), bytes_(other.bytes_) {}

OutputFile& OutputFile::operator=(OutputFile&& other) noexcept {
  if (this != &other) {
    abandon();
    path_ = std::move(other.path_);
    temp_ = std::move(other.temp_);
    fd_ = std::exchange(other.fd_, -1);
    bytes_ = other.bytes_;
  }
  return *this;
}

OutputFile::~OutputFile() { abandon(); }

void OutputFile::abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(temp_.c_str());
  fd_ = -1;
}

Status OutputFile::write(std::span<const std::byte> bytes) {
  TZ_ASSERT(fd_ >= 0);
  if (const int err = write_fully(fd_, bytes, std::nullopt); err != 0) {
    abandon();
    return Status::from_errno(err, "write", path_);
  }
  bytes_ += bytes.size();
  return Status::ok();
}

Status OutputFile::write_at(std::uint64_t offset, std::span<const std::byte> bytes) {
  TZ_ASSERT(fd_ >= 0);
  if (const int err = write_fully(fd_, bytes, offset); err != 0) {
    abandon();
    return Status::from_errno(err, "write", path_);
  }
  return Status::ok();
}

Status OutputFile::commit() {
  TZ_ASSERT(fd_ >= 0);
  if (::fsync(fd_) != 0) {
    const int err = errno;
    abandon();
    return Status::from_errno(err, "fsync", path_);
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp_.c_str());
    return Status::from_errno(err, "close", path_);
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_.c_str());
    return Status::from_errno(err, "rename into place", path_);
  }
  return fsync_folder(folder_of(path_));
}

Status write_output_file(std::string_view what, const std::string& path, std::string_view text,
                         const std::vector<std::string>& inputs) {
  TZ_ASSIGN_OR_RETURN(OutputFile out, OutputFile::create(what, path, inputs));
  TZ_RETURN_IF_ERROR(out.write(text));
  return out.commit();
}

}  // namespace tz
