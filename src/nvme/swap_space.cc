// SwapSpace: directory and file lifecycle, striping arithmetic and extent bookkeeping.
#include "nvme/swap_space.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>

#include "core/assert.h"
#include "core/log.h"
#include "core/units.h"

namespace tz::nvme {

struct SwapSpace::State {
  SwapOptions options;
  std::uint64_t file_bytes = 0;
  std::vector<std::string> dirs;  // created by us, removed at the end
  std::vector<IoFileHandle> files;
  std::vector<int> file_ids;      // IoQueue ids
  std::unique_ptr<IoQueue> queue;
  std::unique_ptr<ExtentAllocator> allocator;

  ~State() {
    queue.reset();  // waits for in-flight requests before the files close
    std::vector<std::string> names;
    for (const IoFileHandle& f : files) names.push_back(f.path());
    files.clear();
    if (options.keep_files) {
      if (!names.empty()) TZ_LOG_INFO("swap space: keeping %zu swap files in %s", names.size(),
                                      dirs.empty() ? "?" : dirs.front().c_str());
      return;
    }
    for (const std::string& n : names) {
      if (::unlink(n.c_str()) != 0 && errno != ENOENT)
        TZ_LOG_WARN("swap space: cannot remove %s: %s", n.c_str(), std::strerror(errno));
    }
    for (const std::string& d : dirs) {
      if (::rmdir(d.c_str()) != 0 && errno != ENOENT)
        TZ_LOG_WARN("swap space: cannot remove %s: %s", d.c_str(), std::strerror(errno));
    }
  }
};

namespace {

constexpr std::string_view kSwapDirPrefix = "tierzero-swap-";

// Removes swap directories under `path` left by tierzero processes that no longer exist (killed
// before their clean shutdown), so a crash does not leak disk space run after run. A directory
// whose process is alive, or whose owner cannot be told, is left alone.
void remove_stale_swap_dirs(const std::string& path) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kSwapDirPrefix, 0) != 0 || !entry.is_directory(ec)) continue;
    const std::string rest = name.substr(kSwapDirPrefix.size());
    const std::size_t dash = rest.find('-');
    if (dash == 0 || dash == std::string::npos) continue;
    pid_t pid = 0;
    try {
      pid = static_cast<pid_t>(std::stol(rest.substr(0, dash)));
    } catch (...) {
      continue;
    }
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::uint64_t bytes = 0;
    for (const auto& f : std::filesystem::directory_iterator(entry.path(), ec)) {
      bytes += f.is_regular_file(ec) ? f.file_size(ec) : 0;
    }
    std::filesystem::remove_all(entry.path(), ec);
    if (ec) {
      TZ_LOG_WARN("swap space: cannot remove stale %s: %s", entry.path().c_str(),
                  ec.message().c_str());
    } else {
      TZ_LOG_WARN("swap space: removed %s (%s) left by process %d, which no longer runs",
                  entry.path().c_str(), format_bytes(static_cast<double>(bytes)).c_str(),
                  static_cast<int>(pid));
    }
  }
}

}  // namespace

Result<SwapSpace> SwapSpace::create(const SwapOptions& options, std::unique_ptr<IoEngine> engine,
                                    const IoQueueOptions& queue_options) {
  if (options.paths.empty()) return Status::invalid_argument("swap space: no paths given");
  if (options.stripe_bytes == 0 || options.stripe_bytes % 4096 != 0) {
    return Status::invalid_argument("swap space: stripe size must be a positive multiple of 4 KiB");
  }
  auto state = std::make_unique<State>();
  state->options = options;
  state->file_bytes = options.bytes_per_path / options.stripe_bytes * options.stripe_bytes;
  if (state->file_bytes == 0) {
    return Status::invalid_argument("swap space: bytes per path (" +
                                    std::to_string(options.bytes_per_path) +
                                    ") is smaller than one stripe");
  }
  TZ_ASSIGN_OR_RETURN(IoQueue queue, IoQueue::create(std::move(engine), queue_options));
  state->queue = std::make_unique<IoQueue>(std::move(queue));
  static std::atomic<int> counter{0};
  for (std::size_t i = 0; i < options.paths.size(); ++i) {
    remove_stale_swap_dirs(options.paths[i]);
    const std::string dir = options.paths[i] + "/" + std::string(kSwapDirPrefix) + std::to_string(::getpid()) +
                            "-" + std::to_string(counter.fetch_add(1));
    if (::mkdir(dir.c_str(), 0700) != 0) return Status::from_errno(errno, "swap space: mkdir", dir);
    state->dirs.push_back(dir);
    FileOpenOptions fo;
    fo.create = true;
    fo.exclusive = true;
    fo.mode = 0600;
    fo.direct = options.direct;
    TZ_ASSIGN_OR_RETURN(IoFileHandle file,
                        IoFileHandle::open(dir + "/swap." + std::to_string(i), fo));
    state->files.push_back(std::move(file));
    const IoFileHandle& f = state->files.back();
    if (!f.direct() && options.direct != DirectMode::kOff) {
      TZ_LOG_WARN("swap space: %s does not support O_DIRECT; its swap file goes through the page "
                  "cache", options.paths[i].c_str());
    }
    Status st = f.preallocate(state->file_bytes);
    if (st.code() == ErrorCode::kUnavailable) {
      TZ_LOG_WARN("%s; using a sparse file", st.message().c_str());
      if (::ftruncate(f.fd(), static_cast<off_t>(state->file_bytes)) != 0)
        return Status::from_errno(errno, "swap space: ftruncate", f.path());
    } else if (!st.is_ok()) {
      return std::move(st).with_context("swap space");
    }
    TZ_ASSIGN_OR_RETURN(const int id, state->queue->add_file(f.io_file()));
    state->file_ids.push_back(id);
  }
  state->allocator = std::make_unique<ExtentAllocator>(state->file_bytes * options.paths.size());
  TZ_LOG_INFO("swap space: %s on %zu path(s), stripe %s, engine %s",
              format_bytes(static_cast<double>(state->allocator->capacity_bytes())).c_str(),
              options.paths.size(), format_bytes(static_cast<double>(options.stripe_bytes)).c_str(),
              state->queue->engine().name());
  return SwapSpace(std::move(state));
}

SwapSpace::SwapSpace(std::unique_ptr<State> state) : state_(std::move(state)) {}
SwapSpace::SwapSpace(SwapSpace&&) noexcept = default;
SwapSpace& SwapSpace::operator=(SwapSpace&&) noexcept = default;
SwapSpace::~SwapSpace() = default;

Result<SwapExtent> SwapSpace::allocate(std::uint64_t bytes) {
  if (bytes == 0) return Status::invalid_argument("swap space: allocation of 0 bytes");
  auto e = state_->allocator->allocate(bytes);
  if (!e) {
    std::string where;
    for (const std::string& p : state_->options.paths) where += (where.empty() ? "" : ", ") + p;
    return Status(ErrorCode::kNoSpace, ENOSPC,
                  "swap space full: asked " + format_bytes(static_cast<double>(bytes)) + " (" +
                      std::to_string(bytes) + " bytes), " +
                      format_bytes(static_cast<double>(state_->allocator->free_bytes())) +
                      " free (largest free extent " +
                      format_bytes(static_cast<double>(state_->allocator->largest_free_bytes())) +
                      ") of " +
                      format_bytes(static_cast<double>(state_->allocator->capacity_bytes())) +
                      " on " + where);
  }
  return SwapExtent{e->offset, e->bytes};
}

void SwapSpace::free(const SwapExtent& extent) {
  state_->allocator->free(Extent{extent.offset, extent.bytes});
}

std::vector<Transfer> SwapSpace::transfers(IoOp op, const SwapExtent& extent, std::uint64_t offset,
                                           void* buf, std::uint64_t len) const {
  TZ_ASSERT(offset + len <= extent.bytes && offset + len >= offset, "range outside the extent");
  const std::uint64_t stripe = state_->options.stripe_bytes;
  const std::uint64_t n = state_->files.size();
  std::vector<Transfer> out;
  std::uint64_t logical = extent.offset + offset;
  auto* p = static_cast<std::byte*>(buf);
  std::uint64_t left = len;
  while (left > 0) {
    const std::uint64_t unit = logical / stripe;
    const std::uint64_t in_unit = logical % stripe;
    const std::uint64_t piece = std::min(left, stripe - in_unit);
    const int file = state_->file_ids[unit % n];
    const std::uint64_t file_offset = (unit / n) * stripe + in_unit;
    if (!out.empty() && out.back().file == file &&
        out.back().offset + out.back().len == file_offset &&
        static_cast<std::byte*>(out.back().buf) + out.back().len == p) {
      out.back().len += piece;  // one path: the whole range is one transfer
    } else {
      out.push_back(Transfer{op, file, file_offset, p, piece});
    }
    logical += piece;
    p += piece;
    left -= piece;
  }
  return out;
}

Status SwapSpace::write(const SwapExtent& extent, std::uint64_t offset, const void* buf,
                        std::uint64_t len) {
  auto t = transfers(IoOp::kWrite, extent, offset, const_cast<void*>(buf), len);
  return state_->queue->run(t);
}

Status SwapSpace::read(const SwapExtent& extent, std::uint64_t offset, void* buf, std::uint64_t len) {
  auto t = transfers(IoOp::kRead, extent, offset, buf, len);
  return state_->queue->run(t);
}

IoQueue& SwapSpace::queue() { return *state_->queue; }
std::uint64_t SwapSpace::capacity_bytes() const { return state_->allocator->capacity_bytes(); }
std::uint64_t SwapSpace::free_bytes() const { return state_->allocator->free_bytes(); }
const ExtentAllocator& SwapSpace::allocator() const { return *state_->allocator; }
bool SwapSpace::direct() const {
  for (const IoFileHandle& f : state_->files)
    if (!f.direct()) return false;
  return true;
}
std::vector<std::string> SwapSpace::file_paths() const {
  std::vector<std::string> out;
  for (const IoFileHandle& f : state_->files) out.push_back(f.path());
  return out;
}

}  // namespace tz::nvme
