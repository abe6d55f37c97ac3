// PinnedPool owns the host staging memory every I/O and device copy goes through: a few large
// slabs mapped once (2 MiB huge pages where the kernel gives them), pre-faulted and mlocked, then
// sub-allocated in 4 KiB-aligned buffers under a byte budget with peak accounting.
//
// The pool knows nothing of io_uring or CUDA: later layers register its slabs (io_uring fixed
// buffers, cudaHostRegister) through slabs() and add_slab_hook().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace tz {

// What to do when mlock is refused (RLIMIT_MEMLOCK too low and no CAP_IPC_LOCK).
enum class MemlockPolicy : std::uint8_t {
  kOff,         // do not lock
  kBestEffort,  // try; on refusal log one warning naming the limit and continue unlocked
  kRequired,    // try; on refusal create() fails with the limit and how to raise it
};

struct PinnedPoolOptions {
  // Bytes that may be handed out at once; rounded up to 4 KiB. The slabs together cover it.
  std::uint64_t budget_bytes = 256ull << 20;
  // Size of one slab (one mmap), rounded up to 2 MiB; a buffer never spans two slabs, so this is
  // also the largest buffer. At most 1 GiB (io_uring's limit on one registered buffer).
  std::uint64_t slab_bytes = 256ull << 20;
  // MAP_HUGETLB if reserved pages exist, else madvise(MADV_HUGEPAGE) and, where that left 4 KiB
  // pages (THP "never", defrag refused), madvise(MADV_COLLAPSE), which the kernel (6.1+) honours
  // whatever the THP sysfs mode. False keeps the slab on 4 KiB pages.
  bool huge_pages = true;
  // Fault every page in at create() (first touch runs at ~1 GB/s, 0.3 GB/s in a VM whose host
  // backs the pages on first touch). 4 KiB-page slabs are faulted through a long-term pin where
  // the kernel allows it, which gives physically contiguous runs (fewer scatter-gather segments
  // per I/O request); else MADV_POPULATE_WRITE in 64 MiB pieces on oneTBB's threads. False
  // leaves the pages to their first use, unless `lock` locks them: then they are faulted in the
  // same way (mlock2 with MLOCK_ONFAULT, then MADV_POPULATE_WRITE), and stay unfaulted where the
  // lock is refused.
  bool prefault = true;
  MemlockPolicy lock = MemlockPolicy::kBestEffort;
};

// One mapping of the pool: what io_uring or CUDA registers.
struct PinnedSlab {
  std::size_t index = 0;
  void* data = nullptr;
  std::uint64_t bytes = 0;
  bool hugetlb = false;  // backed by reserved huge pages (MAP_HUGETLB)
  bool locked = false;   // mlock succeeded
  // Bytes backed by 2 MiB pages (reserved or transparent) once faulted in. A slab on 4 KiB pages
  // gives io_uring one bvec per page, so every request is cut at the device's segment limit
  // (max_segments pages, about 1 MiB); huge pages give one bvec per 2 MiB.
  std::uint64_t huge_bytes = 0;
};

struct PinnedPoolStats {
  std::uint64_t budget_bytes = 0;
  std::uint64_t mapped_bytes = 0;
  std::uint64_t in_use_bytes = 0;
  std::uint64_t peak_bytes = 0;
  std::uint64_t live_buffers = 0;
  std::uint64_t allocations = 0;
  std::uint64_t failed_allocations = 0;
  std::uint64_t huge_bytes = 0;  // mapped bytes on 2 MiB pages (PinnedSlab::huge_bytes summed)
  bool locked = false;  // every slab is mlocked
};

// Called for every slab, present and future: on_add when the hook is added (or the slab is
// mapped), on_remove before the slab is unmapped. on_remove may be empty.
struct PinnedSlabHook {
  std::string name;  // for messages: "io_uring", "cuda"
  std::function<Status(const PinnedSlab&)> on_add;
  std::function<void(const PinnedSlab&)> on_remove;
};

namespace detail {
struct PinnedPoolState;
}

// A 4 KiB-aligned piece of a slab. Move-only; returns its bytes to the pool when destroyed. The
// pool must outlive its buffers (checked: destroying a pool with live buffers aborts).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  std::byte* data() const { return data_; }
  // The bytes asked for; the reservation is this rounded up to 4 KiB.
  std::uint64_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, static_cast<std::size_t>(size_)}; }
  std::size_t slab_index() const { return slab_; }
  bool valid() const { return data_ != nullptr; }
  // Returns the bytes now (no-op on an empty buffer).
  void reset();

 private:
  friend class PinnedPool;
  PinnedBuffer(detail::PinnedPoolState* pool, std::byte* data, std::uint64_t size,
               std::uint64_t reserved, std::size_t slab)
      : pool_(pool), data_(data), size_(size), reserved_(reserved), slab_(slab) {}

  detail::PinnedPoolState* pool_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t reserved_ = 0;
  std::size_t slab_ = 0;
};

class PinnedPool {
 public:
  // Maps, pre-faults and locks all slabs now. Errors: kOutOfMemory when mmap fails,
  // kPermission when options.lock is kRequired and mlock is refused (the message names
  // RLIMIT_MEMLOCK and `ulimit -l`), kInvalidArgument for a zero budget or slab over 64 GiB.
  static Result<PinnedPool> create(const PinnedPoolOptions& options);

  PinnedPool(PinnedPool&&) noexcept;
  PinnedPool& operator=(PinnedPool&&) noexcept;
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;
  // Runs every hook's on_remove, then unmaps. Live buffers at this point are a programmer error.
  ~PinnedPool();

  // A buffer of `bytes` (> 0), 4 KiB-aligned, from the first slab with room. Errors:
  // kOutOfMemory naming the request, the budget, what is in use and the largest free piece.
  // Thread-safe.
  Result<PinnedBuffer> allocate(std::uint64_t bytes);

  // The slabs, in index order (stable for the pool's lifetime).
  std::vector<PinnedSlab> slabs() const;
  // Calls hook.on_add for every slab now; on failure undoes the slabs already added (on_remove)
  // and returns that error. The hook is kept and its on_remove runs before the pool unmaps.
  Status add_slab_hook(PinnedSlabHook hook);
  // True when [data, data+bytes) lies inside one slab; `slab` receives its index.
  bool contains(const void* data, std::uint64_t bytes, std::size_t* slab = nullptr) const;
  PinnedPoolStats stats() const;

 private:
  explicit PinnedPool(std::unique_ptr<detail::PinnedPoolState> state);
  std::unique_ptr<detail::PinnedPoolState> state_;
};

}  // namespace tz
