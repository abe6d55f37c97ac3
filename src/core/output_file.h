// The one rule for every file tierzero writes (weights, exports, token files, traces, metrics,
// checkpoints' files, bench outputs): the bytes go to a temporary file in the destination's own
// folder, which is flushed and renamed over the destination only when complete, and removed on
// any failure or when the writer is dropped; so a reader sees the old file, or none, or the whole
// new one, never a half-written one. Parent folders are created the same way everywhere, and an
// output that is also one of the command's inputs is refused before anything is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tz {

// Creates `dir` and its missing parents (mode 0755). kPermission / kNoSpace / kIoError naming
// the folder that could not be made; kInvalidArgument when a component is a file.
Status make_folders(const std::string& dir);

// Checks, before any work, that files can be created in the folder `dir` (a probe file is created
// and removed) and, when `needed_bytes` > 0, that its file system has that much free space (the
// shortfall named). With `create`, a missing folder is judged by its nearest existing ancestor
// (where it would be made when the output is written; the check makes nothing); without it a
// missing folder is an error. `what` names the folder's role in messages ("NVMe path",
// "--save-dir"). kInvalidArgument for a path that is not a folder, kNoSpace for too little space,
// the errno's category for the rest.
Status check_folder(std::string_view what, const std::string& dir, std::uint64_t needed_bytes = 0,
                    bool create = true);

// Checks, before any work, that `path` can be written as an output: its folder exists or can be
// created (check_folder with `create`), a file can be created in it, `path` is not a
// folder, and it is none of `inputs` (the same file by device and inode, or by path when it does
// not exist yet). When `needed_bytes` > 0, the file system's free space must hold it, with the
// shortfall named. `what` names the output in messages ("--save-weights", "--out").
Status check_output(std::string_view what, const std::string& path,
                    const std::vector<std::string>& inputs = {}, std::uint64_t needed_bytes = 0);

// A file being written: create() opens "<folder>/.<name>.tmp.<pid>", write() appends, commit()
// flushes, fsyncs and renames it over `path` (then fsyncs the folder). Destroying an uncommitted
// OutputFile, or any failed write/commit, removes the temporary file. Move-only.
class OutputFile {
 public:
  // Runs check_output(what, path, inputs) first, then creates the temporary file.
  static Result<OutputFile> create(std::string_view what, const std::string& path,
                                   const std::vector<std::string>& inputs = {});
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) noexcept;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();

  // Appends `bytes` (short writes and EINTR retried). kNoSpace / kIoError naming the output.
  Status write(std::span<const std::byte> bytes);
  Status write(std::string_view text) {
    return write(std::as_bytes(std::span<const char>(text.data(), text.size())));
  }
  // Writes `bytes` at `offset` (a header rewritten after the body, say).
  Status write_at(std::uint64_t offset, std::span<const std::byte> bytes);
  // Makes the file whole and visible at its path. After it the object is empty.
  Status commit();
  // Drops the temporary file (also what the destructor does when commit was not reached).
  void abandon();

  // False once committed, abandoned, or after a failed write (which drops the temporary file).
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_; }
  std::uint64_t bytes_written() const { return bytes_; }

 private:
  OutputFile(std::string path, std::string temp, int fd) : path_(std::move(path)),
      temp_(std::move(temp)), fd_(fd) {}
  std::string path_;
  std::string temp_;
  int fd_ = -1;
  std::uint64_t bytes_ = 0;
};

// The whole of `text` into `path` by the rule above.
Status write_output_file(std::string_view what, const std::string& path, std::string_view text,
                         const std::vector<std::string>& inputs = {});

}  // namespace tz
