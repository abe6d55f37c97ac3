// PinnedPool: slab mapping (huge pages, pre-fault, mlock) and the first-fit, coalescing
// sub-allocator that hands out 4 KiB-aligned buffers under the pool's byte budget.
#include "cpu/pinned_pool.h"

#include <linux/io_uring.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include "core/check.h"
#include "core/host_probe.h"
#include "core/log.h"
#include "core/units.h"

namespace tz {

namespace {
constexpr std::uint64_t kAlign = 4096;
constexpr std::uint64_t kHugePage = 2ull << 20;
// One mmap; a sanity bound (io_uring's 1 GiB per registered buffer is met by registering a slab
// in pieces: store/pool_registration.h).
constexpr std::uint64_t kMaxSlab = 64ull << 30;

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older headers lack it
#endif

// Bytes of [data, data + bytes) on transparent huge pages: the AnonHugePages of the mappings of
// /proc/self/smaps that overlap it (a slab is one mapping, or part of one after alignment).
std::uint64_t thp_bytes(const void* data, std::uint64_t bytes) {
  std::ifstream in("/proc/self/smaps");
  const auto lo = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t hi = lo + bytes;
  std::string line;
  bool inside = false;
  std::uint64_t total = 0;
  while (std::getline(in, line)) {
    unsigned long long a = 0, b = 0;
    char dash = 0;
    if (std::sscanf(line.c_str(), "%llx%c%llx", &a, &dash, &b) == 3 && dash == '-' &&
        line.find(':') > line.find(' ')) {
      inside = a < hi && b > lo;
      continue;
    }
    unsigned long long kb = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kb) == 1) total += kb * 1024;
  }
  return std::min(total, bytes);
}

// Faults [data, data + bytes) in through a long-term pin: registering it as an io_uring fixed
// buffer on a throw-away ring (raw syscalls; nothing of io_uring is kept) and unregistering it.
// Why: pages faulted for a long-term pin are allocated without __GFP_MOVABLE, from unmovable
// pageblocks, which on a busy host come back in physically contiguous runs (9-50 KB measured),
// while touching or MADV_POPULATE_WRITE takes movable pages scattered page by page (4-5 KB).
// Each run is one scatter-gather segment of a request on 4 KiB pages, and on the virtio disk we
// measured reads at 1.15-1.6 GB/s with the first against 0.67-0.8 with the second (issue 15; fio's
// registered buffers get the first because fio never touches them before registering).
// False when the kernel refuses (io_uring disabled, registration over RLIMIT_MEMLOCK).
bool fault_in_by_long_term_pin(void* data, std::uint64_t bytes) {
  io_uring_params params{};
  const long fd = syscall(__NR_io_uring_setup, 1, &params);
  if (fd < 0) return false;
  iovec iov{data, static_cast<std::size_t>(bytes)};
  const long rc = syscall(__NR_io_uring_register, static_cast<int>(fd), IORING_REGISTER_BUFFERS,
                          &iov, 1);
  if (rc == 0) {
    syscall(__NR_io_uring_register, static_cast<int>(fd), IORING_UNREGISTER_BUFFERS, nullptr, 0);
  }
  close(static_cast<int>(fd));
  return rc == 0;
}

// Faults [data, data + bytes) in for writing: MADV_POPULATE_WRITE (kernels before 5.14: one write
// per page) in 64 MiB pieces on oneTBB's threads. A first touch is the kernel zeroing the pages
// and, in a VM, the host backing them: 0.28-0.29 GB/s on one core of a 2-core EPYC VM, 0.49-0.56
// GB/s on both (6 GiB, transparent huge pages); llama-3.2-1b's 11.4 GiB pool took 36-47 s to
// create on one thread there and 22-26 s on two (bench/RESULTS.md, eighth session).
void populate_for_write(std::byte* data, std::uint64_t bytes) {
  constexpr std::uint64_t kPiece = 64ull << 20;  // a multiple of 2 MiB: huge pages stay whole
  auto fault = [&](const tbb::blocked_range<std::uint64_t>& pieces) {
    std::byte* p = data + pieces.begin() * kPiece;
    const std::uint64_t len = std::min(bytes, pieces.end() * kPiece) - pieces.begin() * kPiece;
    if (madvise(p, len, MADV_POPULATE_WRITE) != 0) {
      auto* v = reinterpret_cast<volatile std::byte*>(p);
      for (std::uint64_t off = 0; off < len; off += kAlign) v[off] = std::byte{0};
    }
  };
  tbb::parallel_for(tbb::blocked_range<std::uint64_t>(0, (bytes + kPiece - 1) / kPiece), fault);
}

}  // namespace

namespace detail {

struct SlabState {
  PinnedSlab slab;
  std::byte* map_base = nullptr;  // what munmap gets (may precede slab.data for alignment)
  std::uint64_t map_bytes = 0;
  std::map<std::uint64_t, std::uint64_t> free;  // offset -> length, coalesced
};

struct PinnedPoolState {
  PinnedPoolOptions options;
  mutable std::mutex mu;
  std::vector<SlabState> slabs;
  std::vector<PinnedSlabHook> hooks;
  std::uint64_t in_use = 0;
  std::uint64_t peak = 0;
  std::uint64_t live = 0;
  std::uint64_t allocations = 0;
  std::uint64_t failed = 0;

  void release(std::byte* data, std::uint64_t reserved, std::size_t slab_index) {
    std::lock_guard<std::mutex> lock(mu);
    TZ_ASSERT(slab_index < slabs.size());
    SlabState& s = slabs[slab_index];
    const auto offset = static_cast<std::uint64_t>(data - static_cast<std::byte*>(s.slab.data));
    TZ_ASSERT(offset + reserved <= s.slab.bytes, "pinned buffer outside its slab");
    auto next = s.free.lower_bound(offset);
    TZ_ASSERT(next == s.free.end() || next->first >= offset + reserved, "double free");
    std::uint64_t start = offset;
    std::uint64_t len = reserved;
    if (next != s.free.begin()) {
      auto prev = std::prev(next);
      TZ_ASSERT(prev->first + prev->second <= offset, "double free of a pinned buffer");
      if (prev->first + prev->second == offset) {
        start = prev->first;
        len += prev->second;
        s.free.erase(prev);
      }
    }
    if (next != s.free.end() && next->first == offset + reserved) {
      len += next->second;
      s.free.erase(next);
    }
    s.free.emplace(start, len);
    in_use -= reserved;
    --live;
  }

  void unmap_all() {
    for (auto it = hooks.rbegin(); it != hooks.rend(); ++it) {
      if (!it->on_remove) continue;
      for (const SlabState& s : slabs) it->on_remove(s.slab);
    }
    hooks.clear();
    for (SlabState& s : slabs) {
      if (s.slab.locked && munlock(s.slab.data, s.slab.bytes) != 0) {
        TZ_LOG_WARN("pinned pool: munlock of slab %zu failed: %s", s.slab.index,
                    std::strerror(errno));
      }
      if (munmap(s.map_base, s.map_bytes) != 0) {
        TZ_LOG_WARN("pinned pool: munmap of slab %zu failed: %s", s.slab.index,
                    std::strerror(errno));
      }
    }
    slabs.clear();
  }
};

}  // namespace detail

// --- PinnedBuffer ---------------------------------------------------------------------------

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : pool_(other.pool_),
      data_(other.data_),
      size_(other.size_),
      reserved_(other.reserved_),
      slab_(other.slab_) {
  other.pool_ = nullptr;
  other.data_ = nullptr;
  other.size_ = other.reserved_ = 0;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = other.pool_;
    data_ = other.data_;
    size_ = other.size_;
    reserved_ = other.reserved_;
    slab_ = other.slab_;
    other.pool_ = nullptr;
    other.data_ = nullptr;
    other.size_ = other.reserved_ = 0;
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() { reset(); }

void PinnedBuffer::reset() {
  if (pool_ != nullptr && data_ != nullptr) pool_->release(data_, reserved_, slab_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = reserved_ = 0;
}

// --- PinnedPool -----------------------------------------------------------------------------

namespace {

// Maps one slab of `bytes` (a multiple of 2 MiB). Tries reserved huge pages, then transparent
// huge pages on a 2 MiB-aligned anonymous mapping.
Result<detail::SlabState> map_slab(std::size_t index, std::uint64_t bytes,
                                   const PinnedPoolOptions& options) {
  detail::SlabState s;
  s.slab.index = index;
  s.slab.bytes = bytes;
  if (options.huge_pages) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (p != MAP_FAILED) {
      s.map_base = static_cast<std::byte*>(p);
      s.map_bytes = bytes;
      s.slab.data = p;
      s.slab.hugetlb = true;
    }
  }
  if (s.slab.data == nullptr) {
    // Over-map by one huge page so the slab can start on a 2 MiB boundary (THP needs it).
    const std::uint64_t map_bytes = bytes + (options.huge_pages ? kHugePage : 0);
    void* p = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return Status(ErrorCode::kOutOfMemory, errno,
                    "pinned pool: mmap of a " + format_bytes(static_cast<double>(bytes)) +
                        " slab failed: " + std::strerror(errno));
    }
    s.map_base = static_cast<std::byte*>(p);
    s.map_bytes = map_bytes;
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t aligned = options.huge_pages ? round_up(addr, kHugePage) : addr;
    s.slab.data = s.map_base + (aligned - addr);
    if (options.huge_pages && madvise(s.slab.data, bytes, MADV_HUGEPAGE) != 0) {
      // THP disabled ("never") is not an error: the slab works with 4 KiB pages.
      TZ_LOG_DEBUG("pinned pool: madvise(MADV_HUGEPAGE) refused: %s", std::strerror(errno));
    }
  }
  if (options.prefault) {
    // A slab meant for 4 KiB pages is faulted through a long-term pin (see above); huge pages are
    // contiguous however they are faulted.
    const bool pinned_fault =
        !options.huge_pages && !s.slab.hugetlb && fault_in_by_long_term_pin(s.slab.data, bytes);
    if (!pinned_fault) populate_for_write(static_cast<std::byte*>(s.slab.data), bytes);
  }
  if (s.slab.hugetlb) {
    s.slab.huge_bytes = bytes;
  } else if (options.huge_pages && options.prefault) {
    s.slab.huge_bytes = thp_bytes(s.slab.data, bytes);
    if (s.slab.huge_bytes < bytes) {
      // The advice was not enough (THP "never", or no free 2 MiB blocks at fault time): collapse
      // synchronously, compacting if needed. Refusal leaves the slab usable on 4 KiB pages.
      if (madvise(s.slab.data, bytes, MADV_COLLAPSE) != 0) {
        TZ_LOG_DEBUG("pinned pool: madvise(MADV_COLLAPSE) refused: %s", std::strerror(errno));
      }
      s.slab.huge_bytes = thp_bytes(s.slab.data, bytes);
    }
  }
  if (options.lock != MemlockPolicy::kOff) {
    // A slab not yet faulted in: mlock would fault every page in on this thread. Lock its pages as
    // they fault instead, then fault them in on every CPU; where the lock is refused they stay
    // unfaulted. Kernels without MLOCK_ONFAULT (before 4.4) take the plain mlock.
    bool locked = false;
    if (!options.prefault && mlock2(s.slab.data, bytes, MLOCK_ONFAULT) == 0) {
      populate_for_write(static_cast<std::byte*>(s.slab.data), bytes);
      locked = true;
    } else if (options.prefault || errno == EINVAL || errno == ENOSYS) {
      locked = mlock(s.slab.data, bytes) == 0;
    }
    if (locked) {
      s.slab.locked = true;
    } else {
      const int err = errno;
      std::string msg = "pinned pool: mlock of " + format_bytes(static_cast<double>(bytes)) +
                        " refused (" + std::strerror(err) + "); the memlock limit is " +
                        memlock_limit_text(memlock_limit()) +
                        ": raise it with `ulimit -l unlimited`, LimitMEMLOCK= in systemd or "
                        "--ulimit memlock=-1 in docker, or run with CAP_IPC_LOCK";
      if (options.lock == MemlockPolicy::kRequired) {
        if (munmap(s.map_base, s.map_bytes) != 0) {
          TZ_LOG_WARN("pinned pool: munmap failed: %s", std::strerror(errno));
        }
        return Status(ErrorCode::kPermission, err, std::move(msg));
      }
      static std::once_flag warned;
      std::call_once(warned, [&] { TZ_LOG_WARN("%s; continuing with unlocked memory", msg.c_str()); });
    }
  }
  s.free.emplace(0, bytes);
  return s;
}

}  // namespace

Result<PinnedPool> PinnedPool::create(const PinnedPoolOptions& options) {
  if (options.budget_bytes == 0) return Status::invalid_argument("pinned pool: budget is 0 bytes");
  const std::uint64_t slab_bytes = round_up(std::max<std::uint64_t>(options.slab_bytes, 1), kHugePage);
  if (slab_bytes > kMaxSlab) {
    return Status::invalid_argument("pinned pool: slab_bytes " +
                                    format_bytes(static_cast<double>(options.slab_bytes)) +
                                    " exceeds 64 GiB");
  }
  auto state = std::make_unique<detail::PinnedPoolState>();
  state->options = options;
  state->options.budget_bytes = round_up(options.budget_bytes, kAlign);
  state->options.slab_bytes = slab_bytes;
  std::uint64_t left = round_up(state->options.budget_bytes, kHugePage);
  while (left > 0) {
    const std::uint64_t bytes = std::min(left, slab_bytes);
    auto slab = map_slab(state->slabs.size(), bytes, state->options);
    if (!slab.is_ok()) {
      state->unmap_all();
      return std::move(slab).take_status();
    }
    state->slabs.push_back(std::move(slab).value());
    left -= bytes;
  }
  return PinnedPool(std::move(state));
}

PinnedPool::PinnedPool(std::unique_ptr<detail::PinnedPoolState> state) : state_(std::move(state)) {}
PinnedPool::PinnedPool(PinnedPool&&) noexcept = default;
PinnedPool& PinnedPool::operator=(PinnedPool&& other) noexcept {
  if (this != &other) {
    if (state_) {
      TZ_ASSERT(state_->live == 0, "pinned pool replaced while buffers are live");
      state_->unmap_all();
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

PinnedPool::~PinnedPool() {
  if (!state_) return;
  TZ_ASSERT(state_->live == 0, "pinned pool destroyed while buffers are live");
  state_->unmap_all();
}

Result<PinnedBuffer> PinnedPool::allocate(std::uint64_t bytes) {
  TZ_ASSERT(state_ != nullptr, "use of a moved-from PinnedPool");
  if (bytes == 0) return Status::invalid_argument("pinned pool: allocation of 0 bytes");
  const std::uint64_t reserved = round_up(bytes, kAlign);
  std::lock_guard<std::mutex> lock(state_->mu);
  auto& st = *state_;
  std::uint64_t largest = 0;
  if (st.in_use + reserved <= st.options.budget_bytes) {
    for (detail::SlabState& s : st.slabs) {
      for (auto it = s.free.begin(); it != s.free.end(); ++it) {
        largest = std::max(largest, it->second);
        if (it->second < reserved) continue;
        const std::uint64_t offset = it->first;
        const std::uint64_t rest = it->second - reserved;
        s.free.erase(it);
        if (rest > 0) s.free.emplace(offset + reserved, rest);
        st.in_use += reserved;
        st.peak = std::max(st.peak, st.in_use);
        ++st.live;
        ++st.allocations;
        return PinnedBuffer(state_.get(), static_cast<std::byte*>(s.slab.data) + offset, bytes,
                            reserved, s.slab.index);
      }
    }
  } else {
    for (const detail::SlabState& s : st.slabs)
      for (const auto& [off, len] : s.free) largest = std::max(largest, len);
  }
  ++st.failed;
  return Status(ErrorCode::kOutOfMemory, ENOMEM,
                "pinned pool: cannot allocate " + format_bytes(static_cast<double>(bytes)) +
                    " (budget " + format_bytes(static_cast<double>(st.options.budget_bytes)) +
                    ", in use " + format_bytes(static_cast<double>(st.in_use)) +
                    ", largest free piece " + format_bytes(static_cast<double>(largest)) + ")");
}

std::vector<PinnedSlab> PinnedPool::slabs() const {
  TZ_ASSERT(state_ != nullptr, "use of a moved-from PinnedPool");
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<PinnedSlab> out;
  out.reserve(state_->slabs.size());
  for (const auto& s : state_->slabs) out.push_back(s.slab);
  return out;
}

Status PinnedPool::add_slab_hook(PinnedSlabHook hook) {
  TZ_ASSERT(state_ != nullptr, "use of a moved-from PinnedPool");
  std::lock_guard<std::mutex> lock(state_->mu);
  if (hook.on_add) {
    for (std::size_t i = 0; i < state_->slabs.size(); ++i) {
      Status st = hook.on_add(state_->slabs[i].slab);
      if (!st.is_ok()) {
        if (hook.on_remove)
          for (std::size_t j = 0; j < i; ++j) hook.on_remove(state_->slabs[j].slab);
        return std::move(st).with_context("pinned pool: registering slabs with " + hook.name);
      }
    }
  }
  state_->hooks.push_back(std::move(hook));
  return Status::ok();
}

bool PinnedPool::contains(const void* data, std::uint64_t bytes, std::size_t* slab) const {
  TZ_ASSERT(state_ != nullptr, "use of a moved-from PinnedPool");
  const auto p = reinterpret_cast<std::uintptr_t>(data);
  for (const auto& s : state_->slabs) {
    const auto base = reinterpret_cast<std::uintptr_t>(s.slab.data);
    if (p >= base && p + bytes <= base + s.slab.bytes) {
      if (slab != nullptr) *slab = s.slab.index;
      return true;
    }
  }
  return false;
}

PinnedPoolStats PinnedPool::stats() const {
  TZ_ASSERT(state_ != nullptr, "use of a moved-from PinnedPool");
  std::lock_guard<std::mutex> lock(state_->mu);
  PinnedPoolStats s;
  s.budget_bytes = state_->options.budget_bytes;
  s.in_use_bytes = state_->in_use;
  s.peak_bytes = state_->peak;
  s.live_buffers = state_->live;
  s.allocations = state_->allocations;
  s.failed_allocations = state_->failed;
  s.locked = !state_->slabs.empty();
  for (const auto& slab : state_->slabs) {
    s.mapped_bytes += slab.slab.bytes;
    s.huge_bytes += slab.slab.huge_bytes;
    s.locked = s.locked && slab.slab.locked;
  }
  return s;
}

}  // namespace tz
