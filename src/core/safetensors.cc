// The safetensors reader and writer: header validation, ranged pread/pwrite of tensors, and the
// fp32 <-> F16/BF16 conversions of core/dtype.h. The JSON header goes through nlohmann-json with
// exceptions off, so a malformed file is a Status, never a throw.
#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/output_file.h"

namespace tz {
namespace fs = std::filesystem;
namespace {

// Hugging Face refuses headers above 100 MB; so do we (a lying length is caught before a huge read).
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;
// Conversions go through a bounded bounce buffer, large enough for direct reads.
constexpr std::size_t kChunkElems = 1u << 20;
// Reads from this size on bypass the page cache (SafetensorsReader::read_direct); direct reads
// and writes (SafetensorsWriter::DirectWrites) move at most kDirectBufBytes a request, in pages.
constexpr std::size_t kDirectReadMin = 1u << 20;
constexpr std::size_t kDirectBufBytes = 8u << 20;
constexpr std::size_t kPageBytes = 4096;

std::optional<DType> parse_st_dtype(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  return std::nullopt;
}

Status corrupt(const std::string& path, const std::string& what) {
  return Status::corrupt(path + ": " + what);
}

// One pread, retried on EINTR: the bytes read (0 at the end of the file).
Result<std::size_t> pread_some(int fd, void* dst, std::size_t bytes, std::uint64_t offset,
                               const std::string& what) {
  for (;;) {
    const ssize_t n = ::pread(fd, dst, bytes, static_cast<off_t>(offset));
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EINTR) return Status::from_errno(errno, "read", what);
  }
}

Status file_ends_early(const std::string& what) {
  return Status(ErrorCode::kIoError, 0, what + ": file ends early (truncated?)");
}

// Full-length pread/pwrite with EINTR and short transfers retried.
Status pread_all(int fd, void* dst, std::size_t bytes, std::uint64_t offset,
                 const std::string& what) {
  auto* p = static_cast<std::uint8_t*>(dst);
  while (bytes > 0) {
    TZ_ASSIGN_OR_RETURN(const std::size_t n, pread_some(fd, p, bytes, offset, what));
    if (n == 0) return file_ends_early(what);
    p += n;
    bytes -= n;
    offset += n;
  }
  return Status::ok();
}

Status pwrite_all(int fd, const void* src, std::size_t bytes, std::uint64_t offset,
                  const std::string& what) {
  const auto* p = static_cast<const std::uint8_t*>(src);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno(errno, "write", what);
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return Status::ok();
}

// Parses the header text into entries and metadata, checking each entry on its own; the checks
// across entries (overlap, coverage) are the caller's.
Status parse_header(const std::string& path, std::string_view text,
                    std::vector<SafetensorsEntry>& entries,
                    std::map<std::string, std::string>& metadata) {
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return corrupt(path, "header is not valid JSON");
  if (!header.is_object()) return corrupt(path, "header is not a JSON object");
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return corrupt(path, "__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) return corrupt(path, "__metadata__ '" + k + "' is not a string");
        metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string ctx = "tensor '" + name + "'";
    if (!value.is_object()) return corrupt(path, ctx + " is not an object");
    const auto dt = value.find("dtype");
    const auto sh = value.find("shape");
    const auto off = value.find("data_offsets");
    if (dt == value.end() || !dt->is_string()) return corrupt(path, ctx + " has no dtype string");
    if (sh == value.end() || !sh->is_array()) return corrupt(path, ctx + " has no shape array");
    if (off == value.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      return corrupt(path, ctx + " has no data_offsets [begin, end] of non-negative integers");
    }
    SafetensorsEntry e;
    e.name = name;
    const std::string dtype_text = dt->get<std::string>();
    const std::optional<DType> dtype = parse_st_dtype(dtype_text);
    if (!dtype) {
      return Status::invalid_argument(tensor_context(path, name) + ": dtype " + dtype_text +
                                      " is not one tierzero reads (F32, F16, BF16)");
    }
    e.dtype = *dtype;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) return corrupt(path, ctx + " has a shape entry that is not a non-negative integer");
      const std::uint64_t v = d.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return corrupt(path, ctx + " has a dimension too large");
      }
      e.shape.push_back(static_cast<std::int64_t>(v));
    }
    e.begin = (*off)[0].get<std::uint64_t>();
    e.end = (*off)[1].get<std::uint64_t>();
    if (e.end < e.begin) return corrupt(path, ctx + " has data_offsets with end before begin");
    const std::uint64_t need = e.numel() * dtype_size(e.dtype);
    if (e.end - e.begin != need) {
      return corrupt(path, ctx + ": data_offsets [" + std::to_string(e.begin) + ", " +
                               std::to_string(e.end) + ") hold " +
                               std::to_string(e.end - e.begin) + " bytes but shape " +
                               shape_text(e.shape) + " of " + dtype_text + " needs " +
                               std::to_string(need));
    }
    entries.push_back(std::move(e));
  }
  return Status::ok();
}

}  // namespace

std::uint64_t SafetensorsEntry::numel() const {
  std::uint64_t n = 1;
  for (const std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
  }
  return "?";
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string tensor_context(const std::string& path, std::string_view name) {
  return path + ": tensor '" + std::string(name) + "'";
}

// ---- Reader -------------------------------------------------------------------------------------

Result<SafetensorsReader> SafetensorsReader::open(const std::string& path) {
  SafetensorsReader r;
  r.path_ = path;
  r.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r.fd_ < 0) return Status::from_errno(errno, "open safetensors file", path);
  r.direct_fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);  // -1: cached reads only
  struct stat st {};
  if (::fstat(r.fd_, &st) != 0) return Status::from_errno(errno, "stat", path);
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
  if (file_bytes < 8) return corrupt(path, "file of " + std::to_string(file_bytes) +
                                               " bytes is too short for a safetensors header");
  std::uint8_t len_bytes[8];
  TZ_RETURN_IF_ERROR(pread_all(r.fd_, len_bytes, 8, 0, path));
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes || header_len > file_bytes - 8) {
    return corrupt(path, "header length " + std::to_string(header_len) + " does not fit the file (" +
                             std::to_string(file_bytes) + " bytes)");
  }
  std::string text(header_len, '\0');
  TZ_RETURN_IF_ERROR(pread_all(r.fd_, text.data(), header_len, 8, path));
  TZ_RETURN_IF_ERROR(parse_header(path, text, r.entries_, r.metadata_));
  r.data_start_ = 8 + header_len;
  const std::uint64_t data_bytes = file_bytes - r.data_start_;

  std::sort(r.entries_.begin(), r.entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  std::uint64_t covered = 0;
  for (const SafetensorsEntry& e : r.entries_) {
    if (e.end > data_bytes) {
      return corrupt(path, "tensor '" + e.name + "': data_offsets end " + std::to_string(e.end) +
                               " is past the data section (" + std::to_string(data_bytes) +
                               " bytes; truncated file?)");
    }
    if (e.begin < covered) {
      return corrupt(path, "tensor '" + e.name + "': data_offsets overlap the previous tensor");
    }
    if (e.begin > covered) {
      return corrupt(path, "tensor '" + e.name + "': a gap of " + std::to_string(e.begin - covered) +
                               " bytes precedes its data");
    }
    covered = e.end;
  }
  if (covered != data_bytes) {
    return corrupt(path, "data section has " + std::to_string(data_bytes) + " bytes but the tensors cover " +
                             std::to_string(covered));
  }
  return r;
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      direct_fd_(std::exchange(other.direct_fd_, -1)),
      data_start_(other.data_start_),
      entries_(std::move(other.entries_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    direct_fd_ = std::exchange(other.direct_fd_, -1);
    data_start_ = other.data_start_;
    entries_ = std::move(other.entries_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
}

const SafetensorsEntry* SafetensorsReader::find(std::string_view name) const {
  for (const SafetensorsEntry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

Status SafetensorsReader::read_raw(const SafetensorsEntry& entry, std::span<std::uint8_t> out,
                                   std::uint64_t first_byte) const {
  const std::uint64_t bytes = entry.end - entry.begin;
  if (first_byte > bytes || out.size() > bytes - first_byte) {
    return Status::invalid_argument(tensor_context(path_, entry.name) +
                                    ": read of bytes past its end");
  }
  const std::uint64_t offset = data_start_ + entry.begin + first_byte;
  if (direct_fd_ >= 0 && out.size() >= kDirectReadMin) {
    return read_direct(offset, out, tensor_context(path_, entry.name));
  }
  return pread_all(fd_, out.data(), out.size(), offset, tensor_context(path_, entry.name));
}

Status SafetensorsReader::read_direct(std::uint64_t offset, std::span<std::uint8_t> out,
                                      const std::string& what) const {
  // Enough for the range and the partial pages at its ends, up to one request.
  const std::size_t buf_bytes = std::min<std::size_t>(
      kDirectBufBytes, (out.size() + 2 * kPageBytes) / kPageBytes * kPageBytes);
  std::unique_ptr<std::uint8_t, decltype(&std::free)> buf(
      static_cast<std::uint8_t*>(std::aligned_alloc(kPageBytes, buf_bytes)), &std::free);
  if (buf == nullptr) return Status::out_of_memory("safetensors read buffer for " + what);
  for (std::size_t done = 0; done < out.size();) {
    const std::uint64_t at = offset + done;
    const std::uint64_t page = at / kPageBytes * kPageBytes;
    const std::size_t skip = static_cast<std::size_t>(at - page);
    const std::size_t want = std::min(
        buf_bytes, (skip + out.size() - done + kPageBytes - 1) / kPageBytes * kPageBytes);
    // A short read is the file's last page.
    Result<std::size_t> n = pread_some(direct_fd_, buf.get(), want, page, what);
    if (!n.is_ok() && n.status().sys_code() == EINVAL) {
      // A file system that took the descriptor but not the request: the rest is read cached.
      return pread_all(fd_, out.data() + done, out.size() - done, at, what);
    }
    TZ_RETURN_IF_ERROR(n.status());
    if (*n <= skip) return file_ends_early(what);
    const std::size_t k = std::min(*n - skip, out.size() - done);
    std::memcpy(out.data() + done, buf.get() + skip, k);
    done += k;
  }
  return Status::ok();
}

Status SafetensorsReader::read_f32(const SafetensorsEntry& entry, std::span<float> out,
                                   std::uint64_t first_elem) const {
  const std::uint64_t n = entry.numel();
  if (first_elem > n || out.size() > n - first_elem) {
    return Status::invalid_argument(
        tensor_context(path_, entry.name) + ": read of elements [" + std::to_string(first_elem) +
        ", " + std::to_string(first_elem + out.size()) + ") past its " + std::to_string(n));
  }
  const std::size_t es = dtype_size(entry.dtype);
  if (entry.dtype == DType::kF32) {
    return read_raw(entry, {reinterpret_cast<std::uint8_t*>(out.data()), out.size() * 4},
                    first_elem * 4);
  }
  std::vector<std::uint16_t> bounce(std::min<std::size_t>(kChunkElems, out.size()));
  for (std::size_t done = 0; done < out.size();) {
    const std::size_t k = std::min(bounce.size(), out.size() - done);
    TZ_RETURN_IF_ERROR(read_raw(entry, {reinterpret_cast<std::uint8_t*>(bounce.data()), k * es},
                                (first_elem + done) * es));
    for (std::size_t i = 0; i < k; ++i) {
      out[done + i] = entry.dtype == DType::kBF16 ? bf16_to_f32(bf16{bounce[i]})
                                                  : fp16_to_f32(fp16{bounce[i]});
    }
    done += k;
  }
  return Status::ok();
}

// ---- Writer -------------------------------------------------------------------------------------

// A checkpoint or weights file written through the page cache cost more than the disk: on a
// virtio VM, 8.4 GB written and fsynced that way took 25.7 s, 5.6x the 4.6 s of the same bytes
// with O_DIRECT. So runs of contiguous writes are gathered in a buffer whose start is a page of the
// file, and its whole pages go through an O_DIRECT descriptor; only the partial pages at a run's
// ends (and the header) go through the page cache. A writer never writes a byte twice, and another
// writer of the same file writes other bytes: a page written directly holds no byte another write
// puts through the cache. fsync of the cached descriptor makes both durable (one inode).
struct SafetensorsWriter::DirectWrites {
  static constexpr std::size_t kBytes = kDirectBufBytes;  // the buffer: a request at most
  static constexpr std::size_t kAlign = 2u << 20;  // so that huge pages can back it
  int fd = -1;
  std::byte* buf = nullptr;
  std::uint64_t base = 0;  // the file offset of buf[0], a page boundary
  std::size_t head = 0;    // buf[head, fill) are pending
  std::size_t fill = 0;

  DirectWrites() = default;
  DirectWrites(const DirectWrites&) = delete;
  DirectWrites& operator=(const DirectWrites&) = delete;
  ~DirectWrites() {
    if (fd >= 0) ::close(fd);
    std::free(buf);
  }
};

SafetensorsWriter::SafetensorsWriter() = default;

SafetensorsWriter::Path SafetensorsWriter::path_kind() const {
  return direct_ ? Path::kDirect : Path::kCache;
}

// A file system that refuses O_DIRECT (tmpfs: EINVAL; others with other errors, for a file the
// cached descriptor already opened) leaves every write to the page cache.
Status SafetensorsWriter::open_direct(const std::string& file) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return Status::ok();
  auto d = std::make_unique<DirectWrites>();
  d->fd = fd;
  d->buf = static_cast<std::byte*>(std::aligned_alloc(DirectWrites::kAlign, DirectWrites::kBytes));
  if (d->buf == nullptr) return Status::out_of_memory("safetensors write buffer for " + path_);
  (void)::madvise(d->buf, DirectWrites::kBytes, MADV_HUGEPAGE);  // best effort
  direct_ = std::move(d);
  return Status::ok();
}

// The pending run out: whole pages direct, the partial pages at its ends cached.
Status SafetensorsWriter::flush_direct(const std::string& what) {
  DirectWrites& d = *direct_;
  const std::size_t page = kPageBytes;
  const std::size_t lo = std::min((d.head + page - 1) / page * page, d.fill);
  const std::size_t hi = std::max(d.fill / page * page, lo);
  const std::size_t head = d.head;
  const std::size_t fill = d.fill;
  d.head = d.fill = 0;
  if (lo > head) TZ_RETURN_IF_ERROR(pwrite_all(fd_, d.buf + head, lo - head, d.base + head, what));
  if (fill > hi) TZ_RETURN_IF_ERROR(pwrite_all(fd_, d.buf + hi, fill - hi, d.base + hi, what));
  if (hi == lo) return Status::ok();
  const Status direct = pwrite_all(d.fd, d.buf + lo, hi - lo, d.base + lo, what);
  if (direct.is_ok() || direct.sys_code() != EINVAL) return direct;
  // The file system took the descriptor but not this request (EINVAL: an alignment it does not
  // take): this run's pages and every later write go cached.
  TZ_RETURN_IF_ERROR(pwrite_all(fd_, d.buf + lo, hi - lo, d.base + lo, what));
  direct_.reset();
  return Status::ok();
}

Status SafetensorsWriter::write_bytes(const void* src, std::size_t bytes, std::uint64_t offset,
                                      const std::string& what) {
  if (!direct_) return pwrite_all(fd_, src, bytes, offset, what);
  if (direct_->fill > direct_->head && offset != direct_->base + direct_->fill) {
    TZ_RETURN_IF_ERROR(flush_direct(what));  // not the pending run's continuation
  }
  const auto* p = static_cast<const std::byte*>(src);
  while (bytes > 0) {
    if (!direct_) return pwrite_all(fd_, p, bytes, offset, what);
    DirectWrites& d = *direct_;
    if (d.fill == d.head) {  // a new run
      d.base = offset / kPageBytes * kPageBytes;
      d.head = d.fill = static_cast<std::size_t>(offset - d.base);
    }
    const std::size_t k = std::min(bytes, DirectWrites::kBytes - d.fill);
    std::memcpy(d.buf + d.fill, p, k);
    d.fill += k;
    p += k;
    bytes -= k;
    offset += k;
    if (d.fill == DirectWrites::kBytes) TZ_RETURN_IF_ERROR(flush_direct(what));
  }
  return Status::ok();
}

Result<SafetensorsWriter> SafetensorsWriter::create(
    const std::string& path, const std::vector<SafetensorsTensorSpec>& tensors,
    const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w;
  w.path_ = path;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const SafetensorsTensorSpec& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      return Status::invalid_argument(tensor_context(path, t.name) +
                                      ": duplicate or reserved name");
    }
    SafetensorsEntry e;
    e.name = t.name;
    e.dtype = t.dtype;
    for (const std::int64_t d : t.shape) {
      if (d < 0) {
        return Status::invalid_argument(tensor_context(path, t.name) + ": negative dimension");
      }
      e.shape.push_back(d);
    }
    e.begin = offset;
    e.end = offset + e.numel() * dtype_size(e.dtype);
    offset = e.end;
    header[t.name] = {{"dtype", std::string(safetensors_dtype_name(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {e.begin, e.end}}};
    w.entries_.push_back(std::move(e));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  w.data_start_ = 8 + text.size();

  // The bytes go to a temporary name in the same folder; finish() renames it over `path`, and a
  // writer dropped before that removes it (core/output_file.h's rule): a failed export or save
  // never leaves a full-size file of zeros behind a valid header.
  const fs::path target(path);
  TZ_RETURN_IF_ERROR(make_folders(target.parent_path().string()));
  w.temp_ = (target.parent_path() / ("." + target.filename().string() + ".tmp." +
                                      std::to_string(::getpid()))).string();
  w.fd_ = ::open(w.temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) {
    const int err = errno;
    w.temp_.clear();
    return Status::from_errno(err, "create safetensors file", path);
  }
  std::uint8_t len_bytes[8];
  std::uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<std::uint8_t>(len >> (8 * i));
  TZ_RETURN_IF_ERROR(pwrite_all(w.fd_, len_bytes, 8, 0, path));
  TZ_RETURN_IF_ERROR(pwrite_all(w.fd_, text.data(), text.size(), 8, path));
  // Reserve the data section now, so running out of space shows here and not mid-tensor.
  if (offset > 0) {
    const int rc = ::posix_fallocate(w.fd_, static_cast<off_t>(w.data_start_),
                                     static_cast<off_t>(offset));
    if (rc == EOPNOTSUPP || rc == EINVAL) {
      if (::ftruncate(w.fd_, static_cast<off_t>(w.data_start_ + offset)) != 0) {
        return Status::from_errno(errno, "size safetensors file", path);
      }
    } else if (rc != 0) {
      return Status::from_errno(rc, "allocate safetensors file", path);
    }
  }
  TZ_RETURN_IF_ERROR(w.open_direct(w.temp_));
  return w;
}

Result<SafetensorsWriter> SafetensorsWriter::open_existing(const std::string& path) {
  TZ_ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::open(path));
  SafetensorsWriter w;
  w.path_ = path;
  w.entries_ = reader.entries();
  w.data_start_ = reader.data_start_;
  w.fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (w.fd_ < 0) return Status::from_errno(errno, "open safetensors file for writing", path);
  TZ_RETURN_IF_ERROR(w.open_direct(path));
  return w;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temp_(std::exchange(other.temp_, std::string())),
      fd_(std::exchange(other.fd_, -1)),
      data_start_(other.data_start_),
      entries_(std::move(other.entries_)),
      direct_(std::move(other.direct_)) {}

SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& other) noexcept {
  if (this != &other) {
    drop();
    path_ = std::move(other.path_);
    temp_ = std::exchange(other.temp_, std::string());
    fd_ = std::exchange(other.fd_, -1);
    data_start_ = other.data_start_;
    entries_ = std::move(other.entries_);
    direct_ = std::move(other.direct_);
  }
  return *this;
}

SafetensorsWriter::~SafetensorsWriter() { drop(); }

void SafetensorsWriter::drop() {
  direct_.reset();  // pending bytes of a dropped file are not wanted
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
}

Status SafetensorsWriter::write_f32(std::string_view name, std::span<const float> values,
                                    std::uint64_t first_elem) {
  const SafetensorsEntry* entry = nullptr;
  for (const SafetensorsEntry& e : entries_) {
    if (e.name == name) entry = &e;
  }
  if (entry == nullptr) return Status::not_found(tensor_context(path_, name) + ": not in the file");
  if (fd_ < 0) {
    return Status::invalid_argument(tensor_context(path_, name) + ": writer is finished");
  }
  const std::uint64_t n = entry->numel();
  if (first_elem > n || values.size() > n - first_elem) {
    return Status::invalid_argument(tensor_context(path_, name) + ": write of elements past its " +
                                    std::to_string(n));
  }
  const std::string what = tensor_context(path_, name);
  const std::size_t es = dtype_size(entry->dtype);
  const std::uint64_t base = data_start_ + entry->begin + first_elem * es;
  if (entry->dtype == DType::kF32) return write_bytes(values.data(), values.size() * 4, base, what);
  std::vector<std::uint16_t> bounce(std::min<std::size_t>(kChunkElems, values.size()));
  for (std::size_t done = 0; done < values.size();) {
    const std::size_t k = std::min(bounce.size(), values.size() - done);
    for (std::size_t i = 0; i < k; ++i) {
      bounce[i] = entry->dtype == DType::kBF16 ? f32_to_bf16(values[done + i]).bits
                                               : f32_to_fp16(values[done + i]).bits;
    }
    TZ_RETURN_IF_ERROR(write_bytes(bounce.data(), k * es, base + done * es, what));
    done += k;
  }
  return Status::ok();
}

Status SafetensorsWriter::finish() {
  if (fd_ < 0) return Status::ok();
  if (direct_) {
    if (Status st = flush_direct(path_); !st.is_ok()) {
      drop();
      return st;
    }
    direct_.reset();
  }
  if (::fsync(fd_) != 0) {
    const int err = errno;
    drop();
    return Status::from_errno(err, "fsync", path_);
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    drop();
    return Status::from_errno(err, "close", path_);
  }
  if (!temp_.empty()) {
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      drop();
      return Status::from_errno(err, "rename into place", path_);
    }
    temp_.clear();
  }
  return Status::ok();
}

}  // namespace tz
