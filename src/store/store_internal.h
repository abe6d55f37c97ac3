// The store's internal vocabulary (block state): a block, its copies per tier, its chain of
// physical operations, and what the mover hands around (I/O jobs, device completions). Included
// only by src/store/*.cc.
//
// Invariants of a block (checked by Store::Impl::check_invariants): a present copy holds its
// bytes in the tier's logical use; ops in its chain have increasing seq and seq > done_seq;
// done_seq <= issued_seq < next_seq; a block with no valid copy has lost its bytes (error set).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/assert.h"
#include "core/status.h"
#include "cpu/pinned_pool.h"
#include "gpu/device.h"
#include "nvme/swap_space.h"
#include "store/stats.h"
#include "store/store.h"

namespace tz::store {

constexpr std::uint64_t kAlign = 4096;
constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint32_t kNoPos = std::numeric_limits<std::uint32_t>::max();

inline std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
inline std::size_t ti(Tier t) { return static_cast<std::size_t>(t); }
inline std::size_t li(Link l) { return static_cast<std::size_t>(l); }

inline Link link_of(Tier src, Tier dst) {
  if (src == Tier::kNvme && dst == Tier::kHost) return Link::kNvmeToHost;
  if (src == Tier::kHost && dst == Tier::kNvme) return Link::kHostToNvme;
  if (src == Tier::kNvme && dst == Tier::kDevice) return Link::kNvmeToDevice;
  if (src == Tier::kDevice && dst == Tier::kNvme) return Link::kDeviceToNvme;
  if (src == Tier::kHost && dst == Tier::kDevice) return Link::kHostToDevice;
  TZ_ASSERT(src == Tier::kDevice && dst == Tier::kHost, "copy within one tier");
  return Link::kDeviceToHost;
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// kStage: a read ahead of NVMe pieces into staging buffers, for a device load not decided yet
// (Impl::try_stage); the pieces stay with the block (Block::staged) until its NVMe -> device copy
// takes them, or are dropped.
enum class OpKind : std::uint8_t { kAlloc, kCopy, kZero, kFree, kStage };

struct Op {
  OpKind kind = OpKind::kAlloc;
  std::uint64_t seq = 0;
  std::uint64_t decided = 0;  // store-wide decision order: chains start their heads in this order
  Tier src = Tier::kNvme;
  Tier dst = Tier::kHost;  // the tier allocated, written, zeroed or freed
  bool prefetch = false;
  bool early = false;  // an early write-back: nobody waits for it until an op is queued behind it
  // An early write-back from its start (`early` goes when something waits for it): its failure
  // loses nothing where a current upper copy remains (Impl::settle_early_write).
  bool ahead = false;
  // Mover-side progress.
  bool started = false;
  bool failed = false;
  Status status;
  std::uint32_t chunks = 0;       // pieces of a copy that touches NVMe (kStage: to read ahead)
  std::uint32_t next_chunk = 0;   // next piece to start
  std::uint32_t outstanding = 0;  // pieces started and not finished
  std::uint32_t finished = 0;
  std::uint32_t copies_enqueued = 0;  // NVMe -> device: staging -> device copies enqueued
  std::uint32_t device_reads_done = 0;  // device -> NVMe: pieces copied out of the device buffer
  bool device_pending = false;        // a whole-block device copy or memset in flight
  bool zero_fill = false;             // a load of a never-written NVMe copy: no bytes moved
  // A host -> NVMe copy: the piece sums its bytes' writer handed in (Block::host_sums), written
  // with the pieces instead of hashing them; empty: the mover hashes.
  std::vector<std::uint64_t> sums;
  double start_us = 0;
  double start_s = 0;
};

struct Failure {
  std::uint64_t first_seq = 0;  // the op that failed
  std::uint64_t last_seq = 0;   // every op enqueued when it failed is skipped
  Status status;
};

struct Copy {
  bool present = false;  // holds space in the tier (logically)
  bool valid = false;    // holds the latest bytes (once queued moves finish)
  bool by_prefetch = false;
  // The tier the bytes of this copy were loaded from; kNvme also when they were not loaded (a
  // fresh or overwritten copy).
  Tier loaded_from = Tier::kNvme;
  std::uint64_t lru_tick = 0;
};

struct Block {
  BlockId id = 0;
  std::string name;
  std::uint64_t bytes = 0;
  Tier home = Tier::kNvme;
  std::array<Copy, kTierCount> copies{};
  std::array<int, kTierCount> leases{};
  std::array<int, kTierCount> write_leases{};
  int total_leases = 0;
  bool destroyed = false;
  Status error;  // logical poison: read pins fail until a write pin
  // Physical.
  gpu::DeviceBuffer dev;
  PinnedBuffer host;
  nvme::SwapExtent extent;
  bool has_extent = false;
  bool nvme_written = false;  // the extent holds data (else it reads as zeros)
  std::vector<std::uint64_t> sums;
  // The host copy's piece sums as its writer handed them in (Lease::release_hashed), taken by
  // its next write-back (Op::sums); empty when unknown. Any write pin and any op into the host
  // copy clears them; write_pins counts write pins (any tier), so a release hands its sums in
  // only when no other write pin came since its own (and none lived before it: Lease).
  std::vector<std::uint64_t> host_sums;
  std::uint64_t write_pins = 0;
  std::unique_ptr<gpu::Event> user_event;  // recorded by Lease::release(writer); made at create
  bool user_event_recorded = false;
  std::unique_ptr<gpu::Event> ready_event;  // recorded after the last load into the device
  // Chain.
  std::deque<Op> ops;
  std::uint64_t next_seq = 1;
  std::uint64_t done_seq = 0;    // ops with seq <= done_seq are finished
  std::uint64_t issued_seq = 0;  // ops with seq <= issued_seq have enqueued their last copy
  // Failed moves, oldest first, disjoint seq ranges. A failure stays attached to the block until
  // a kWrite pin overwrites the bytes and no live lease can still be spoiled by it (Block::marks).
  std::deque<Failure> failures;
  // Per live lease, the lowest op seq whose failure would spoil it (lease_mark): failures ending
  // before the smallest mark concern nobody.
  std::multiset<std::uint64_t> marks;
  std::uint64_t skip_until = 0;  // copies with seq <= this are skipped (failed)
  // Per tier, the last op that allocated, loaded or zeroed that tier's copy: a read pin of a
  // current copy waits for it and not for later copies out of the tier (an early write-back).
  std::array<std::uint64_t, kTierCount> fill_seq{};
  // Trace position of the write pin whose bytes are in the upper copies and not yet home.
  std::uint32_t dirtied_at = kNoPos;
  // Per tier, whether this block's copy is an eviction candidate (Impl::candidates) and its key.
  std::array<bool, kTierCount> candidate{};
  std::array<std::uint64_t, kTierCount> candidate_key{};
  // Read ahead (kStage): per piece, the staging buffer holding it as read from the extent (or
  // -1); the pieces reserved for this block (those held, and those its stage op may still read)
  // are counted by Impl::staging_acct. The held pieces are the extent's current bytes: an op
  // writing the extent drops them.
  std::vector<int> staged;
  // A write-back out of the device ends its op once every piece has left the device buffer; its
  // pieces still in staging buffers (or on their way to the disk) are the extent's writes in
  // flight, of the op extent_write_seq. Ops that read, write or free the extent wait for them.
  std::uint32_t extent_writes = 0;
  std::uint64_t extent_write_seq = 0;
  double extent_write_start_us = 0;
  BlockStats stats;  // bytes copied into each tier (Impl::count_move)
  bool extent_write_early = false;  // an early write-back's (deferrable)
  bool extent_write_ahead = false;  // Op::ahead of the write
  Status extent_write_status;

  std::uint32_t chunk_count(std::uint64_t chunk_bytes) const {
    return static_cast<std::uint32_t>((bytes + chunk_bytes - 1) / chunk_bytes);
  }
  // Bytes of piece k (the last one may be short).
  std::uint64_t piece_bytes(std::uint32_t k, std::uint64_t chunk_bytes) const {
    return std::min(chunk_bytes, bytes - static_cast<std::uint64_t>(k) * chunk_bytes);
  }
};

struct IoJob {
  BlockId block = 0;
  std::uint64_t op_seq = 0;
  std::uint32_t chunk = 0;
  nvme::IoOp dir = nvme::IoOp::kRead;
  std::vector<nvme::Transfer> transfers;
  std::uint64_t io_bytes = 0;  // rounded to 4 KiB
  std::uint64_t order = 0;     // arrival, for mixed scheduling
  int staging = -1;
  // The piece's bytes: hashed by the mover outside the lock (before a write is submitted, after
  // a read into the host tier completes, after the copy of a read into a staging buffer is
  // enqueued: DeviceCall::check_data); the sum is stored or checked under the lock.
  const std::byte* data = nullptr;
  std::uint64_t data_len = 0;
  std::uint64_t sum = 0;
  bool sum_known = false;  // a write whose sum the block's writer handed in (Op::sums)
  // Filled by the mover after completion.
  Status status;
};

// A report from a device stream's host callback.
struct DeviceDone {
  BlockId block = 0;
  std::uint64_t op_seq = 0;
  std::uint32_t chunk = 0;
  bool whole = false;  // a whole-block copy or memset (not a pipeline piece)
  int staging = -1;    // the staging buffer a piece used
};

// Device work the mover decided under the store's lock and issues after letting go of it (no
// device call under the lock: store_impl.h). Issued in decision order: the wait for the caller's
// last use, the copy or memset, the ready event, then the completion callback. The results come
// back under the lock (Impl::finish_device_calls).
struct DeviceCall {
  enum class Kind : std::uint8_t {
    kAllocate,  // the buffer of an allocation op's device copy
    kWhole,     // a whole-block copy or memset (a copy or zero op)
    kPiece,     // one piece of an NVMe copy, between a staging buffer and the device
    kFree,      // a device free's callback, ordered after the caller's last use of the copy
  };
  Kind kind = Kind::kWhole;
  BlockId block = 0;
  std::uint64_t op_seq = 0;
  std::uint64_t bytes = 0;        // kAllocate
  gpu::Stream* stream = nullptr;  // synchronized after a failed call (work already enqueued)
  gpu::Event* user = nullptr;     // the caller's last use, waited for first (or null)
  std::function<Status()> work;   // the copy or memset (or empty)
  gpu::Event* ready = nullptr;    // recorded after the work: the block's ready event (or null)
  DeviceDone done;                // what the completion callback reports
  // kPiece from NVMe: the staging buffer's bytes and the sum they must have, hashed after the
  // copy out of it is enqueued so that the two overlap (the op fails before its ready event is
  // handed out when they differ).
  const std::byte* check_data = nullptr;
  std::uint64_t check_len = 0;
  std::uint64_t check_sum = 0;
  // Results, filled outside the lock.
  Status status;
  bool check_failed = false;
  gpu::DeviceBuffer buffer;  // kAllocate
};

struct TraceEntry {
  BlockId block = 0;
  Tier tier = Tier::kHost;
  Access access = Access::kRead;
  bool operator==(const TraceEntry& o) const {
    return block == o.block && tier == o.tier && access == o.access;
  }
};

}  // namespace tz::store
