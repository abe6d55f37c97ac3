// The safetensors file format (Hugging Face): an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw little-endian tensor bytes. This
// file owns the format only (no model names): validating a header against the file, streaming
// tensors (or element ranges of them) in and out as fp32 with the dtype conversions of core/dtype.h,
// so neither weights nor checkpoints are ever materialised whole in memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace tz {

// One tensor of a file. begin/end are byte offsets into the data section (after the header).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t numel() const;
};

// "F32", "BF16", "F16" for the dtypes tierzero reads and writes.
std::string_view safetensors_dtype_name(DType dtype);

// How error messages about tensors write them, the same in every module that reads or checks a
// file: a shape as "[2, 3]" ("[]" for a scalar), and the context "PATH: tensor 'NAME'".
std::string shape_text(const std::vector<std::int64_t>& shape);
std::string tensor_context(const std::string& path, std::string_view name);

// Reads a file. Move-only; owns the descriptor.
class SafetensorsReader {
 public:
  // Opens and validates the whole header: a length that fits the file, JSON that parses, every
  // entry with a known dtype (F32, F16, BF16), non-negative dims, a byte range that matches its
  // shape and dtype, ranges that neither overlap nor leave the data section, and a data section
  // that the ranges cover exactly. Errors name the file and, where one is at fault, the tensor:
  // kNotFound / kPermission for a file that cannot be opened, kCorrupt for a malformed one,
  // kInvalidArgument for a dtype tierzero does not read.
  static Result<SafetensorsReader> open(const std::string& path);
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  ~SafetensorsReader();

  const std::string& path() const { return path_; }
  // Entries in file order (by begin offset).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(std::string_view name) const;
  // The "__metadata__" string map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads elements [first_elem, first_elem + out.size()) of `entry` converted to fp32. Errors:
  // kInvalidArgument for a range past the tensor, kIoError (naming file and tensor) for a failed
  // or short read (a file truncated after open).
  Status read_f32(const SafetensorsEntry& entry, std::span<float> out,
                  std::uint64_t first_elem = 0) const;
  // The raw bytes [begin, begin + out.size()) of `entry` as stored.
  Status read_raw(const SafetensorsEntry& entry, std::span<std::uint8_t> out,
                  std::uint64_t first_byte = 0) const;

 private:
  friend class SafetensorsWriter;  // open_existing reuses the validated header
  SafetensorsReader() = default;
  // Reads of at least 1 MiB go through `direct_fd_` (O_DIRECT; -1 on a file system without it)
  // into an aligned buffer of their own: the page cache's copy cost more than the disk on a VM
  // (a checkpoint file read 1.4 GB/s cached, 2.3 GB/s direct).
  Status read_direct(std::uint64_t offset, std::span<std::uint8_t> out,
                     const std::string& what) const;
  std::string path_;
  int fd_ = -1;
  int direct_fd_ = -1;
  std::uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// What a writer lays out: names must be unique; data is placed in the given order.
struct SafetensorsTensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
};

// Writes a file whose header is fixed up front, so tensors (or element ranges of them, by several
// writers of the same file) can be written in any order with pwrite.
class SafetensorsWriter {
 public:
  // Creates `path`'s file under a temporary name in the same folder (finish() renames it into
  // place; a writer dropped or failing before that removes it, so `path` is never half-written),
  // writes the header (padded with spaces to a multiple of 8 bytes, as Hugging Face writes it)
  // and sizes the file. kInvalidArgument for duplicate names or a
  // negative dim; the errno's error naming the file otherwise.
  static Result<SafetensorsWriter> create(const std::string& path,
                                          const std::vector<SafetensorsTensorSpec>& tensors,
                                          const std::map<std::string, std::string>& metadata = {});
  // Opens a file that create() made (perhaps another process's) to write ranges into it.
  static Result<SafetensorsWriter> open_existing(const std::string& path);
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  // Writes `values` (rounded to the entry's dtype) as elements [first_elem, +values.size()) of the
  // tensor `name`. kNotFound for an unknown name, kInvalidArgument for a range past the tensor,
  // the errno's error (kNoSpace, kIoError) naming the file and tensor.
  Status write_f32(std::string_view name, std::span<const float> values,
                   std::uint64_t first_elem = 0);
  // fsyncs and closes; a writer from create() then renames its file into place. Errors name the
  // file (and leave no file behind). Idempotent.
  Status finish();

  // Where the writer's bytes go: whole 4 KiB pages of each run of contiguous writes through a
  // second, O_DIRECT descriptor (from a write-combining buffer), the partial pages at a run's ends
  // through the page cache. kCache on a file system that refuses O_DIRECT (tmpfs).
  enum class Path : std::uint8_t { kDirect, kCache };
  Path path_kind() const;

 private:
  struct DirectWrites;  // the O_DIRECT descriptor and its write-combining buffer
  SafetensorsWriter();
  void drop();  // closes and removes an unfinished temporary file
  Status open_direct(const std::string& file);
  Status write_bytes(const void* src, std::size_t bytes, std::uint64_t offset,
                     const std::string& what);
  Status flush_direct(const std::string& what);
  std::string path_;
  std::string temp_;  // create()'s temporary name until finish() renames it; empty otherwise
  int fd_ = -1;
  std::uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::unique_ptr<DirectWrites> direct_;
};

}  // namespace tz
