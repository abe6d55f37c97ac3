// Store: the hierarchical tiered store of DESIGN.md ("The store"). It owns every block's copies in
// three tiers (device memory, pinned host memory, NVMe swap extents), keeps each tier under a byte
// budget, moves copies asynchronously (NVMe <-> pinned through the swap space's IoQueue, pinned
// <-> device on the Device's copy streams, NVMe <-> device pipelined through pinned staging
// buffers), and decides what to prefetch and evict from the access trace of the previous step
// (Belady's rule) or, without a trace, by LRU.
//
// Threads: any number of caller threads may call the Store and its Leases; one mover thread owned
// by the store drives the I/O queue and starts copies. Every placement decision (what to load,
// what to evict, what to prefetch) is taken synchronously inside pin()/mark_step(), so the bytes a
// sequence of calls moves do not depend on timing; only when the moves finish does.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "cpu/pinned_pool.h"
#include "gpu/device.h"
#include "nvme/swap_space.h"
#include "store/stats.h"

namespace tz::store {

enum class Access : std::uint8_t {
  kRead,       // load the bytes, do not change them
  kReadWrite,  // load the bytes; the copy pinned becomes the only up-to-date one
  kWrite,      // no load: the caller overwrites every byte; the copy becomes the only current one
};
const char* access_name(Access access);

enum class Policy : std::uint8_t {
  kTrace,  // record the step's pin order; from the next step prefetch ahead and evict by Belady
  kLru,    // no prefetch, evict the least recently used copy
};
const char* policy_name(Policy policy);
Result<Policy> parse_policy(std::string_view name);  // "trace" or "lru"

using BlockId = std::uint32_t;

// How NVMe reads and writes share the disk.
enum class IoGrouping : std::uint8_t {
  kMixed,    // issue reads and writes as they come
  kGrouped,  // never mix directions in flight; reads first, writes in runs of `write_run_bytes`
};

struct StoreOptions {
  std::uint64_t device_budget_bytes = 1ull << 30;
  std::uint64_t host_budget_bytes = 2ull << 30;  // host-tier copies; staging is extra
  Policy policy = Policy::kTrace;
  // Unit of NVMe transfers and of checksums (a multiple of 4 KiB), and the size of one staging
  // buffer of the NVMe <-> device pipeline.
  std::uint64_t chunk_bytes = 8ull << 20;
  // Staging buffers allocated once from the pinned pool at create (staging_buffers * chunk_bytes).
  // Reads into the device and write-backs from it each leave a quarter of them (at least one) to
  // the other direction.
  std::uint32_t staging_buffers = 8;
  // NVMe bytes in flight at most (enough to saturate the disk; each direction counted together).
  std::uint64_t max_io_in_flight_bytes = 64ull << 20;
  // Device prefetch: how many device copies loaded from the host tier (counting the one pinned
  // now) are held for the next uses; past them the prefetcher starts only NVMe loads, so slow
  // reads get device space early (docs/store.md, "Policies").
  std::uint32_t host_prefetch_depth = 2;
  // Read ahead (trace policy): when the device has no room yet for the next uses of NVMe-homed
  // blocks, up to this many staging buffers are filled with their pieces in trace order, so that
  // the disk keeps reading while the device window is busy and each load, once decided, only
  // copies them on (docs/store.md, "Policies"). At most staging_cap - 1 (the read direction's
  // share of the staging buffers less one, kept for decided reads); 0 turns it off.
  std::uint32_t read_ahead_buffers = 4;
  IoGrouping io_grouping = IoGrouping::kMixed;  // the bench measures which the disk wants
  std::uint64_t write_run_bytes = 256ull << 20;  // kGrouped: writes issued per run while reads wait
  // Hash every piece written to NVMe (XXH3-64) and check it on every read (docs/store.md,
  // "Integrity"); false reads the disk's bytes back unchecked, without the hashing's CPU and
  // memory traffic (tierzero.nvme_checksums).
  bool checksums = true;
  bool trace_spans = true;  // emit Chrome trace spans when the global Trace is enabled
  bool register_pool_buffers = true;  // register the pool's slabs as io_uring fixed buffers
};

class Store;

// While alive, the pins this thread makes are left out of every store's access trace: neither
// recorded nor matched against it, as NVMe pins are. For a thread whose pins interleave with the
// trace's thread in an order that changes from step to step (the engine's update worker): its
// pins would otherwise make every step leave the trace, which turns off the prefetch walk and
// Belady's eviction for the rest of the step. Such a thread reads ahead with Store::prefetch.
// Scopes nest.
class UntracedPins {
 public:
  UntracedPins();
  ~UntracedPins();
  UntracedPins(const UntracedPins&) = delete;
  UntracedPins& operator=(const UntracedPins&) = delete;
  // Whether the calling thread is inside a scope.
  static bool active();
};

// A pin of one block in one tier. Move-only; while alive the block cannot move or be evicted.
// Destroying (or release()-ing) it unpins. A lease must not outlive its store.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() { release(); }

  // Blocks until the bytes are resident in the tier (for kWrite: until the space is allocated and
  // earlier moves of the block are done). Errors: kCorrupt when a checksum did not match (naming
  // the block and chunk), kIoError from the disk, kOutOfMemory when a physical allocation failed.
  // The time spent here is counted as stall. Idempotent.
  Status wait();
  // Device pins: an event a stream can wait on before using the bytes. Blocks only until the last
  // copy of the load is enqueued (not completed), so a stream can overlap with the rest.
  Result<gpu::Event*> ready_event();
  // The pinned copy: a device pointer for kDevice, a host pointer for kHost. Valid after wait()
  // (or ready_event()) succeeded, until release. Not available for kNvme pins.
  void* data() const;
  std::uint64_t bytes() const { return bytes_; }
  Tier tier() const { return tier_; }
  Access access() const { return access_; }
  BlockId block() const { return block_; }
  bool valid() const { return store_ != nullptr; }

  // Unpins. `writer`: a device stream that used the bytes (read or wrote them); the store records
  // an event on it and orders its own copies and frees of the block after that work. Without it,
  // the caller guarantees its device work on the bytes has completed.
  void release(gpu::Stream* writer = nullptr);
  // Unpins a host-tier write pin whose holder hashed the bytes it leaves: piece_sums[k] is XXH3-64
  // of piece k (Store::hashed_piece_bytes) of the copy as it is now. The copy's write-back to
  // NVMe uses them instead of hashing the bytes again, which the holder did while they were in
  // its cache (the CPU optimizer: cpu::PieceSums). Taken only when no other write lease of the
  // block lived when this one was pinned and none was pinned since; otherwise, and for any other
  // pin, a plain release.
  void release_hashed(std::span<const std::uint64_t> piece_sums);

 private:
  friend class Store;
  Store* store_ = nullptr;
  BlockId block_ = 0;
  Tier tier_ = Tier::kHost;
  Access access_ = Access::kRead;
  std::uint64_t bytes_ = 0;
  std::uint64_t ready_seq_ = 0;  // the block's move count that makes this pin ready
  std::uint64_t first_seq_ = 0;  // the first move this pin started
  std::uint64_t write_pins_ = 0;  // the block's write pin count with this one (Block)
  bool sole_writer_ = false;      // a write pin made when no other write lease of the block lived
  bool waited_ok_ = false;
};

class Store {
 public:
  // Makes the swap space. It runs on the store's mover thread, the one thread that drives the
  // swap space's IoQueue: io_uring rings created with SINGLE_ISSUER accept submissions only from
  // the thread that created them.
  using SwapFactory = std::function<Result<std::unique_ptr<nvme::SwapSpace>>()>;

  // The store uses `device` and `pool` (which must outlive it) and owns the swap space that
  // `make_swap` returns (no factory: no NVMe tier). The pool must hold host_budget_bytes plus
  // staging_buffers * chunk_bytes plus slack for fragmentation; its slabs are registered with the
  // I/O engine when `register_pool_buffers`. Errors: kInvalidArgument for a chunk size that is
  // not a positive multiple of 4 KiB, or zero staging buffers; kOutOfMemory when the staging
  // buffers cannot be allocated; the factory's error.
  static Result<std::unique_ptr<Store>> create(const StoreOptions& options, gpu::Device& device,
                                               PinnedPool& pool, SwapFactory make_swap);
  // Waits for every move, frees every copy and extent. Live leases are a programmer error.
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Registers a block of `bytes` (> 0) whose durable copy lives in `home`; reads as zeros until
  // written. The home copy is allocated now and counts against that tier's budget (NVMe: the swap
  // space). Errors: kOutOfMemory / kNoSpace naming the tier and budget; kInvalidArgument.
  Result<BlockId> create_block(std::uint64_t bytes, Tier home, std::string name);
  // Drops a block and its copies (after its moves finish). Errors: kInvalidArgument for an
  // unknown block or one with live leases.
  Status destroy_block(BlockId id);

  // Pins `id` in `tier` (at or above its home tier). The returned lease is ready once the bytes
  // are there (Lease::wait). Loads and evictions are started now; if the tier cannot make room
  // even after evicting every unpinned copy, fails with kOutOfMemory naming the tier, its budget
  // and what is pinned. kWrite pins skip the load. A block whose last move failed returns that
  // error to kRead/kReadWrite pins until a kWrite pin overwrites it. Write pins conflict with
  // leases of the block in another tier (kInvalidArgument).
  // A pin made on a thread inside an UntracedPins scope is left out of the trace.
  Result<Lease> pin(BlockId id, Tier tier, Access access);
  // Best effort: starts loading `id` into `tier` if that fits in the tier's free bytes or, while
  // the step follows the trace, by evicting unpinned copies the trace never uses again (their
  // dirty bytes go home first). Not recorded in the trace. A copy loaded this way for a block the
  // trace does not use (its pins are untraced) is evicted last until its next pin. Errors only for
  // bad arguments.
  Status prefetch(BlockId id, Tier tier);
  // Keeps `id`'s copy in `tier`, when it is current there, as a copy prefetch loaded for an
  // untraced block is kept: evicted last until the block's next pin. For a caller that knows
  // that copy's next use comes before the other untraced copies' (the eager worker keeps the
  // states the next forward waits for). Nothing for a copy not current there or the home copy.
  // Errors: kInvalidArgument for an unknown block.
  Status keep(BlockId id, Tier tier);
  // Starts writing `id`'s copy in `tier` home now when it holds the block's only current bytes
  // and is not pinned, keeping it there clean: an early write-back, which the disk takes after
  // the moves something waits for, and whose later eviction is a free instead of a write the next
  // load waits behind. For a caller that knows the bytes are final until the copy is evicted (the
  // eager worker's updated states it does not keep): the trace's own early write-backs learn this
  // per block and never see untraced pins. Nothing for a clean, pinned or home copy or a block
  // not homed on NVMe. Errors: kInvalidArgument for an unknown block.
  Status write_back(BlockId id, Tier tier);
  // The piece size of `id`'s NVMe checksums for a holder that hashes what it writes
  // (Lease::release_hashed): the chunk size when the block lives on NVMe and checksums are on,
  // else 0 (its write-backs are not hashed, or it has none). 0 for an unknown block.
  std::uint64_t hashed_piece_bytes(BlockId id) const;
  // Makes every byte of `id` zero without moving any: each copy it has is zeroed where it is (a
  // memset of the host or device copy, an NVMe extent marked unwritten so that it reads as
  // zeros), and every copy is then current, so none is dirty: nothing is written back, and a
  // later load from an NVMe home is a zero fill. For bytes that are dead once read (a gradient
  // accumulator after its update), where zeroing through a write pin would make the block dirty
  // and send its zeros to the disk and back. Not a pin: not recorded in the trace. Like a kWrite
  // pin, it clears a failure of the block's earlier moves. Errors: kInvalidArgument for an
  // unknown block or one with live leases.
  Status zero(BlockId id);
  // Ends a step: the pins recorded since the previous mark become the trace the next step follows
  // (Policy::kTrace), and the trace position is reset. Starts the next step's first prefetches.
  void mark_step();
  // Blocks until no move is queued or in flight (write-backs included).
  Status drain();
  // Writes every dirty copy (the only current bytes of a block, above its home) to the block's
  // home tier, keeping it cached clean, and waits until those writes and every other move are
  // done: afterwards the home tier holds the latest bytes of every block. Blocks pinned for
  // writing are skipped (their bytes are still changing). Errors: the first write that failed,
  // naming the block (the block's read pins report it too).
  Status flush();

  // Counters so far (a consistent snapshot).
  StoreStats stats() const;
  void reset_stats();  // zeroes the counters, the blocks' too (peaks restart at the current use)
  // One block's counters so far (stats.h, BlockStats). kInvalidArgument for an unknown block.
  Result<BlockStats> block_stats(BlockId id) const;
  const StoreOptions& options() const { return options_; }
  // The counters of `ids` added up, under one lock (a consistent snapshot of a set of blocks, such
  // as one kind of the engine's state); an unknown id adds nothing.
  BlockStats block_stats(std::span<const BlockId> ids) const;
  // Bytes each tier holds now by its budget (logical: decided placements).
  std::uint64_t used_bytes(Tier tier) const;
  std::uint64_t budget_bytes(Tier tier) const;
  // True when the current step follows the recorded trace so far.
  bool following_trace() const;
  // Checks the store's internal invariants (logical use equals the present copies, physical use
  // within budget, op order, queued frees and allocations accounted); kInternal naming the
  // first broken one. For tests; O(blocks + queued ops).
  Status check_invariants() const;

 private:
  friend class Lease;
  struct Impl;
  explicit Store(std::unique_ptr<Impl> impl, const StoreOptions& options);
  void unpin(Lease& lease, gpu::Stream* writer, std::span<const std::uint64_t> sums = {});
  Status wait_lease(Lease& lease);
  Result<gpu::Event*> lease_event(Lease& lease);
  void* lease_data(const Lease& lease) const;

  std::unique_ptr<Impl> impl_;
  StoreOptions options_;
};

}  // namespace tz::store
