// Store: the logical layer (residency, budgets, pins, policy) runs in the caller's thread under
// one mutex and turns decisions into per-block chains of physical operations (allocate, copy,
// zero, free); the mover thread runs the head of every chain, drives the swap space's IoQueue and
// starts copies on the device's streams, whose host callbacks report back.
//
// Why no deadlock: an operation waits only for operations decided before it (the earlier ops of
// its chain, allocations ahead of it in its tier's FIFO, and frees decided before it that free
// the physical space the decision counted on). Copies need only staging buffers, which copies
// return by themselves, so everything decided earlier finishes.
#include "store/store.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <future>
#include <limits>
#include <optional>
#include <unordered_set>

#include "core/assert.h"
#include "core/log.h"
#include "core/trace.h"
#include "core/units.h"

namespace tz::store {

namespace {

constexpr std::uint64_t kAlign = 4096;
constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint32_t kNoPos = std::numeric_limits<std::uint32_t>::max();

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::size_t ti(Tier t) { return static_cast<std::size_t>(t); }
std::size_t li(Link l) { return static_cast<std::size_t>(l); }

Link link_of(Tier src, Tier dst) {
  if (src == Tier::kNvme && dst == Tier::kHost) return Link::kNvmeToHost;
  if (src == Tier::kHost && dst == Tier::kNvme) return Link::kHostToNvme;
  if (src == Tier::kNvme && dst == Tier::kDevice) return Link::kNvmeToDevice;
  if (src == Tier::kDevice && dst == Tier::kNvme) return Link::kDeviceToNvme;
  if (src == Tier::kHost && dst == Tier::kDevice) return Link::kHostToDevice;
  TZ_ASSERT(src == Tier::kDevice && dst == Tier::kHost, "copy within one tier");
  return Link::kDeviceToHost;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* access_name(Access access) {
  switch (access) {
    case Access::kRead: return "read";
    case Access::kReadWrite: return "read_write";
    case Access::kWrite: return "write";
  }
  return "?";
}

const char* policy_name(Policy policy) { return policy == Policy::kTrace ? "trace" : "lru"; }

Result<Policy> parse_policy(std::string_view name) {
  if (name == "trace") return Policy::kTrace;
  if (name == "lru") return Policy::kLru;
  return Status::invalid_argument("unknown policy '" + std::string(name) +
                                  "' (accepted: trace, lru)");
}

// ---- Internal state ----------------------------------------------------------------------------

namespace {

enum class OpKind : std::uint8_t { kAlloc, kCopy, kZero, kFree };

struct Op {
  OpKind kind = OpKind::kAlloc;
  std::uint64_t seq = 0;
  std::uint64_t decided = 0;  // store-wide decision order: chains start their heads in this order
  Tier src = Tier::kNvme;
  Tier dst = Tier::kHost;  // the tier allocated, written, zeroed or freed
  bool prefetch = false;
  bool early = false;  // an early write-back: nobody waits for it until an op is queued behind it
  // Mover-side progress.
  bool started = false;
  bool failed = false;
  Status status;
  std::uint32_t chunks = 0;       // pieces of a copy that touches NVMe
  std::uint32_t next_chunk = 0;   // next piece to start
  std::uint32_t outstanding = 0;  // pieces started and not finished
  std::uint32_t finished = 0;
  std::uint32_t copies_enqueued = 0;  // NVMe -> device: staging -> device copies enqueued
  bool device_pending = false;  // a whole-block device copy or memset in flight
  bool zero_fill = false;       // a load of a never-written NVMe copy: no bytes moved
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
  std::unique_ptr<gpu::Event> user_event;  // recorded by Lease::release(writer)
  bool user_event_recorded = false;
  std::unique_ptr<gpu::Event> ready_event;  // recorded after the last load into the device
  // Chain.
  std::deque<Op> ops;
  std::uint64_t next_seq = 1;
  std::uint64_t done_seq = 0;    // ops with seq <= done_seq are finished
  std::uint64_t issued_seq = 0;  // ops with seq <= issued_seq have enqueued their last copy
  std::deque<Failure> failures;  // most recent last, bounded
  std::uint64_t skip_until = 0;  // copies with seq <= this are skipped (failed)
  // Per tier, the last op that allocated, loaded or zeroed that tier's copy: a read pin of a
  // current copy waits for it and not for later copies out of the tier (an early write-back).
  std::array<std::uint64_t, kTierCount> fill_seq{};
  // Trace position of the write pin whose bytes are in the upper copies and not yet home.
  std::uint32_t dirtied_at = kNoPos;

  std::uint32_t chunk_count(std::uint64_t chunk_bytes) const {
    return static_cast<std::uint32_t>((bytes + chunk_bytes - 1) / chunk_bytes);
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
  // a read completes); the sum is stored or checked under the lock at completion.
  const std::byte* data = nullptr;
  std::uint64_t data_len = 0;
  std::uint64_t sum = 0;
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

struct TraceEntry {
  BlockId block = 0;
  Tier tier = Tier::kHost;
  Access access = Access::kRead;
  bool operator==(const TraceEntry& o) const {
    return block == o.block && tier == o.tier && access == o.access;
  }
};

}  // namespace

struct Store::Impl {
  StoreOptions options;
  gpu::Device* device = nullptr;
  PinnedPool* pool = nullptr;
  std::unique_ptr<nvme::SwapSpace> swap;

  mutable std::mutex mu;
  std::condition_variable cv;        // leases and drain wait here
  std::condition_variable mover_cv;  // the mover waits here
  std::uint64_t events = 0;          // bumped on anything the mover should look at
  bool stopping = false;

  std::map<BlockId, Block> blocks;  // ordered: deterministic iteration
  BlockId next_id = 1;
  std::array<std::uint64_t, kTierCount> logical_used{};
  std::array<std::uint64_t, kTierCount> budget{};
  std::array<std::uint64_t, kTierCount> phys_used{};
  std::array<std::uint64_t, kTierCount> pending_frees{};
  std::array<std::deque<std::pair<BlockId, std::uint64_t>>, kTierCount> alloc_fifo;
  std::uint64_t tick = 0;
  std::uint64_t decisions = 0;  // ops pushed so far (Op::decided)
  BlockId protect = 0;  // the block being pinned: never a victim while its pin is placed

  // Device buffers of evicted copies, kept for the next allocation of the same size (counted in
  // phys_used): device memory that is mapped and touched once, not per load (on HostDevice a fresh
  // buffer costs a page fault per 4 KiB on first use).
  std::multimap<std::uint64_t, gpu::DeviceBuffer> dev_cache;
  std::uint64_t dev_cache_bytes = 0;

  // Tier statistics follow the physical use; kept device buffers are reported apart.
  void update_used(Tier t) {
    TierStats& ts = stats.tiers[ti(t)];
    ts.used_bytes = phys_used[ti(t)] - (t == Tier::kDevice ? dev_cache_bytes : 0);
    ts.cached_bytes = t == Tier::kDevice ? dev_cache_bytes : 0;
    ts.peak_bytes = std::max(ts.peak_bytes, phys_used[ti(t)]);
  }

  // Staging buffers of the NVMe <-> device pipeline, and the streams its pieces are copied on: not
  // the device's h2d/d2h streams, where a whole-block copy would hold up every piece behind it
  // (and with them the staging buffers the disk needs).
  std::vector<PinnedBuffer> staging;
  std::unique_ptr<gpu::Stream> piece_h2d;
  std::unique_ptr<gpu::Stream> piece_d2h;
  std::vector<int> staging_free;
  // Staging buffers held by NVMe -> device reads [0] and device -> NVMe writes [1]: neither
  // direction may hold more than staging_cap, so that a run of write-backs (whose pieces are
  // ready at once) cannot take every buffer while reads wait, and the disk gets both.
  std::array<std::uint32_t, 2> staging_held{};
  std::uint32_t staging_cap = 0;

  // I/O scheduling (mover only, under mu).
  std::deque<IoJob> read_q;
  std::deque<IoJob> write_q;
  std::uint64_t job_order = 0;
  bool writing = false;            // kGrouped: the direction being issued
  std::uint64_t run_bytes = 0;     // bytes issued in the current direction's run
  std::uint64_t in_flight_bytes = 0;
  std::uint32_t in_flight_reads = 0;
  std::uint32_t in_flight_writes = 0;
  std::vector<DeviceDone> device_done;

  // Policy.
  std::vector<TraceEntry> trace;
  std::vector<TraceEntry> record;
  std::size_t trace_pos = 0;
  bool following = false;
  std::unordered_map<BlockId, std::vector<std::uint32_t>> dev_uses;
  std::unordered_map<BlockId, std::vector<std::uint32_t>> host_uses;
  std::unordered_map<BlockId, std::vector<std::uint32_t>> any_uses;
  std::unordered_map<BlockId, std::vector<std::uint32_t>> overwrites;  // write-only pins
  // Trace positions of write pins whose bytes went home before being overwritten (in the pin's
  // own step or the next), learned during the current step (spill_record) and in the last step
  // that followed the trace (spill_trace).
  std::unordered_set<std::uint32_t> spill_record;
  std::unordered_set<std::uint32_t> spill_trace;

  // Statistics.
  StoreStats stats;
  std::array<int, kLinkCount> link_active{};
  std::array<double, kLinkCount> link_busy_since{};

  std::thread mover;

  // ---- helpers (all require mu) ----------------------------------------------------------------
  Block* find(BlockId id) {
    auto it = blocks.find(id);
    return it == blocks.end() || it->second.destroyed ? nullptr : &it->second;
  }
  void wake() {
    ++events;
    mover_cv.notify_one();
  }
  std::uint64_t push_op(Block& b, Op op) {
    op.seq = b.next_seq++;
    op.decided = ++decisions;
    if (op.kind == OpKind::kAlloc) alloc_fifo[ti(op.dst)].emplace_back(b.id, op.seq);
    if (op.kind == OpKind::kFree) ++pending_frees[ti(op.dst)];
    if (op.kind != OpKind::kFree) b.fill_seq[ti(op.dst)] = op.seq;
    b.ops.push_back(std::move(op));
    wake();
    return b.next_seq - 1;
  }
  void push_alloc(Block& b, Tier t) {
    Op op;
    op.kind = OpKind::kAlloc;
    op.dst = t;
    push_op(b, std::move(op));
  }
  void push_free(Block& b, Tier t) {
    Op op;
    op.kind = OpKind::kFree;
    op.dst = t;
    push_op(b, std::move(op));
  }
  std::uint64_t push_copy(Block& b, Tier src, Tier dst, bool prefetch) {
    Op op;
    op.kind = OpKind::kCopy;
    op.src = src;
    op.dst = dst;
    op.prefetch = prefetch;
    return push_op(b, std::move(op));
  }

  // ---- policy --------------------------------------------------------------------------------
  static std::uint64_t next_in(const std::unordered_map<BlockId, std::vector<std::uint32_t>>& m,
                               BlockId id, std::size_t pos, std::size_t len) {
    auto it = m.find(id);
    if (it == m.end() || it->second.empty()) return kNever;
    const auto& v = it->second;
    auto p = std::lower_bound(v.begin(), v.end(), static_cast<std::uint32_t>(pos));
    if (p != v.end()) return *p - pos;
    return len - pos + v.front();
  }
  // Distance (in pins) from the current trace position to the next use of b's copy in `t`.
  // A copy whose block is overwritten (write-only pin) before it is next read holds dead bytes.
  std::uint64_t next_use(const Block& b, Tier t) const {
    const std::size_t len = trace.size();
    std::uint64_t nu;
    if (t == Tier::kDevice) {
      nu = next_in(dev_uses, b.id, trace_pos, len);
    } else {
      // A host copy serves host pins, and device pins once the device copy is gone. Counting it
      // as unused while the block is also on the device made every device eviction copy the
      // block back up to the host tier (a memcpy, and another block pushed out for it).
      nu = next_in(any_uses, b.id, trace_pos, len);
    }
    return next_in(overwrites, b.id, trace_pos, len) < nu ? kNever : nu;
  }
  bool belady() const { return options.policy == Policy::kTrace && following; }

  // Victims to free `need` bytes in `t` for `for_block`, without evicting pinned copies or home
  // copies; when `beyond` is set only copies whose next use is farther than it. Empty optional:
  // impossible.
  std::optional<std::vector<BlockId>> choose_victims(Tier t, std::uint64_t need,
                                                     BlockId for_block,
                                                     std::optional<std::uint64_t> beyond) {
    if (logical_used[ti(t)] + need <= budget[ti(t)]) return std::vector<BlockId>{};
    struct Cand {
      std::uint64_t key;  // larger: evict first
      BlockId id;
      std::uint64_t bytes;
    };
    std::vector<Cand> cands;
    const bool bel = belady();
    for (auto& [id, b] : blocks) {
      if (b.destroyed || id == for_block || id == protect || b.home == t || b.total_leases > 0) {
        continue;
      }
      if (!b.copies[ti(t)].present) continue;
      std::uint64_t key;
      if (bel) {
        key = next_use(b, t);
        if (beyond && key <= *beyond) continue;
      } else {
        if (beyond) continue;  // without a trace nothing is known to be farther
        key = kNever - b.copies[ti(t)].lru_tick;
      }
      cands.push_back({key, id, b.bytes});
    }
    std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& c) {
      return a.key != c.key ? a.key > c.key : a.id < c.id;
    });
    std::vector<BlockId> out;
    std::uint64_t freed = 0;
    const std::uint64_t over = logical_used[ti(t)] + need - budget[ti(t)];
    for (const Cand& c : cands) {
      if (freed >= over) break;
      out.push_back(c.id);
      freed += c.bytes;
    }
    if (freed < over) return std::nullopt;
    return out;
  }

  // Whether a clean copy of `b` admitted to the host tier now would still be there at its next
  // use `nu` pins ahead: not when the blocks needing a host copy before then fill the tier, those
  // with a host copy now and those whose only current copy is on the device (they are demoted to
  // the host when the device drops them). A copy that would be pushed out unused is a memcpy
  // (and an allocation queued behind the block's pending moves) for nothing.
  bool host_keeps(const Block& x, std::uint64_t nu) const {
    std::uint64_t need = x.bytes;
    const std::size_t len = trace.size();
    for (const auto& [id, b] : blocks) {
      if (b.destroyed || id == x.id) continue;
      if (b.home == Tier::kHost) need += b.bytes;  // homed there: never leaves
      if (b.home != Tier::kNvme) continue;
      const bool host = b.copies[ti(Tier::kHost)].present;
      if (!host && !only_valid(b, Tier::kDevice)) continue;
      std::uint64_t next = next_in(any_uses, id, trace_pos, len);
      if (next_in(overwrites, id, trace_pos, len) < next) next = kNever;
      if (next < nu) need += b.bytes;
    }
    return need <= budget[ti(Tier::kHost)];
  }

  // Makes `b` (just evicted from the device, `valid_elsewhere` or not) a host copy if the policy
  // admits it. Returns true when a host copy was allocated.
  bool admit_to_host(Block& b) {
    if (b.home != Tier::kNvme) return false;
    std::optional<std::uint64_t> beyond;
    if (belady()) {
      std::uint64_t nu = next_in(any_uses, b.id, trace_pos, trace.size());
      if (next_in(overwrites, b.id, trace_pos, trace.size()) < nu) nu = kNever;
      if (nu == kNever) return false;
      beyond = nu;
    }
    if (!belady() && budget[ti(Tier::kHost)] < b.bytes) return false;
    if (belady() && b.copies[ti(Tier::kNvme)].valid && !host_keeps(b, *beyond)) return false;
    std::optional<std::vector<BlockId>> victims;
    if (belady()) {
      victims = choose_victims(Tier::kHost, b.bytes, b.id, beyond);
    } else {
      victims = choose_victims(Tier::kHost, b.bytes, b.id, std::nullopt);
    }
    if (!victims) return false;
    for (BlockId v : *victims) evict(*find(v), Tier::kHost);
    TZ_LOG_DEBUG("store: admit '%s' to host", b.name.c_str());
    push_alloc(b, Tier::kHost);
    b.copies[ti(Tier::kHost)].present = true;
    b.copies[ti(Tier::kHost)].lru_tick = ++tick;
    logical_used[ti(Tier::kHost)] += b.bytes;
    return true;
  }

  // The failure that spoiled a lease's bytes, if any. A read needs every move up to its own to
  // have worked; a write-only pin only its own allocation.
  static Status lease_failure(const Block& b, Access access, std::uint64_t first_seq,
                              std::uint64_t ready_seq) {
    for (const Failure& f : b.failures) {
      if (access == Access::kWrite) {
        if (f.first_seq >= first_seq && f.first_seq <= ready_seq) return f.status;
      } else if (f.first_seq <= ready_seq && ready_seq <= f.last_seq) {
        return f.status;
      }
    }
    return Status::ok();
  }

  bool only_valid(const Block& b, Tier t) const {
    if (!b.copies[ti(t)].valid) return false;
    for (std::size_t i = 0; i < kTierCount; ++i) {
      if (i != ti(t) && b.copies[i].valid) return false;
    }
    return true;
  }

  // Early write-back: when the last lease of a block holding the only current bytes in `t` goes,
  // and in the last step that followed the trace the bytes written by the same pin went home
  // (every upper copy evicted before the block was written again), start writing them to NVMe
  // now, keeping the copy in `t` (now clean). Its later eviction is then a free instead of a
  // write with the next load waiting behind it, and the disk works while the step is busy with
  // copies that do not touch it. It allocates nothing, and on a repeating trace it writes the
  // bytes the evictions would have written, only earlier (when the eviction came in the next
  // step, as for the last layers of a backward pass, the write now overlaps this step's reads).
  void write_back_early(Block& b, Tier t) {
    if (!belady() || b.total_leases > 0 || b.home != Tier::kNvme || t == Tier::kNvme ||
        !b.error.is_ok() || !b.copies[ti(t)].present || !only_valid(b, t) ||
        b.dirtied_at == kNoPos || spill_trace.count(b.dirtied_at) == 0) {
      return;
    }
    TZ_LOG_DEBUG("store: early write-back of '%s' from %s at trace pos %zu", b.name.c_str(),
                 tier_name(t), trace_pos);
    push_copy(b, t, Tier::kNvme, false);
    b.ops.back().early = true;
    b.copies[ti(Tier::kNvme)].valid = true;
    ++stats.tiers[ti(t)].write_backs;
    ++stats.early_write_backs;
  }

  // Drops b's copy in `t` (an upper, unpinned, non-home copy), writing it down first if it holds
  // the only current bytes.
  void evict(Block& b, Tier t) {
    TZ_ASSERT(b.copies[ti(t)].present && b.home != t && b.total_leases == 0);
    TierStats& ts = stats.tiers[ti(t)];
    ++ts.evictions;
    TZ_LOG_DEBUG("store: evict '%s' from %s at trace pos %zu%s", b.name.c_str(), tier_name(t),
                 trace_pos, only_valid(b, t) ? " (dirty)" : "");
    const bool dirty = only_valid(b, t) && b.error.is_ok();
    if (t == Tier::kDevice) {
      Copy& host = b.copies[ti(Tier::kHost)];
      if (dirty || (!host.valid && b.error.is_ok())) {
        if (host.present || admit_to_host(b)) {
          push_copy(b, Tier::kDevice, Tier::kHost, false);
          host.valid = true;
          if (dirty) ++ts.write_backs;
        } else if (dirty) {
          push_copy(b, Tier::kDevice, b.home, false);
          b.copies[ti(b.home)].valid = true;
          ++ts.write_backs;
        }
      }
    } else if (dirty) {
      TZ_ASSERT(t == Tier::kHost && b.home == Tier::kNvme);
      push_copy(b, Tier::kHost, Tier::kNvme, false);
      b.copies[ti(Tier::kNvme)].valid = true;
      ++ts.write_backs;
    }
    push_free(b, t);
    b.copies[ti(t)] = Copy{};
    logical_used[ti(t)] -= b.bytes;
    if (b.dirtied_at != kNoPos && !b.copies[ti(Tier::kDevice)].valid &&
        !b.copies[ti(Tier::kHost)].valid) {
      // The bytes of that write pin had to go home: next time write them back at unpin.
      if (belady()) spill_record.insert(b.dirtied_at);
      b.dirtied_at = kNoPos;
    }
  }

  // The tier a load into `t` reads from: the valid copy closest to `t`.
  std::optional<Tier> load_source(const Block& b, Tier t) const {
    static constexpr std::array<Tier, 3> kOrderDevice = {Tier::kHost, Tier::kNvme, Tier::kDevice};
    static constexpr std::array<Tier, 3> kOrderHost = {Tier::kDevice, Tier::kNvme, Tier::kHost};
    static constexpr std::array<Tier, 3> kOrderNvme = {Tier::kHost, Tier::kDevice, Tier::kNvme};
    const auto& order = t == Tier::kDevice ? kOrderDevice
                        : t == Tier::kHost ? kOrderHost
                                           : kOrderNvme;
    for (Tier s : order) {
      if (s != t && b.copies[ti(s)].valid) return s;
    }
    return std::nullopt;
  }

  std::string pinned_summary(Tier t) const {
    std::string out;
    std::uint64_t total = 0;
    int n = 0;
    for (const auto& [id, b] : blocks) {
      if (b.destroyed || !b.copies[ti(t)].present) continue;
      if (b.total_leases == 0 && b.home != t) continue;
      total += b.bytes;
      if (n++ < 8) {
        out += (out.empty() ? "" : ", ") + ("'" + b.name + "' (" +
               format_bytes(static_cast<double>(b.bytes)) +
               (b.home == t && b.total_leases == 0 ? ", home" : ", pinned") + ")");
      }
    }
    if (n > 8) out += ", and " + std::to_string(n - 8) + " more";
    return format_bytes(static_cast<double>(total)) + " pinned or homed there: " +
           (out.empty() ? "nothing" : out);
  }

  // Allocates b's copy in `t`, evicting as needed (demand: any unpinned copy).
  Status make_resident(Block& b, Tier t) {
    if (b.copies[ti(t)].present) return Status::ok();
    auto victims = choose_victims(t, b.bytes, b.id, std::nullopt);
    if (!victims) {
      return Status::out_of_memory(
          std::string("store: cannot place '") + b.name + "' (" +
          format_bytes(static_cast<double>(b.bytes)) + ") in the " + tier_name(t) +
          " tier: budget " + format_bytes(static_cast<double>(budget[ti(t)])) + ", " +
          pinned_summary(t));
    }
    for (BlockId v : *victims) evict(*find(v), t);
    push_alloc(b, t);
    b.copies[ti(t)].present = true;
    logical_used[ti(t)] += b.bytes;
    return Status::ok();
  }

  // Starts loading b into t ahead of its use `distance` pins from now; false when the budget
  // does not allow it without evicting something needed sooner.
  bool try_prefetch(Block& b, Tier t, std::optional<std::uint64_t> distance) {
    if (b.copies[ti(t)].valid) return true;
    if (!b.error.is_ok()) return true;  // nothing to gain; pins report the error
    if (b.copies[ti(t)].present) {
      // A stale copy: reload it in place.
    } else {
      std::optional<std::vector<BlockId>> victims;
      if (distance) {
        victims = choose_victims(t, b.bytes, b.id, distance);
      } else if (logical_used[ti(t)] + b.bytes <= budget[ti(t)]) {
        victims = std::vector<BlockId>{};
      }
      if (!victims) return false;
      for (BlockId v : *victims) evict(*find(v), t);
      push_alloc(b, t);
      b.copies[ti(t)].present = true;
      logical_used[ti(t)] += b.bytes;
    }
    auto src = load_source(b, t);
    TZ_ASSERT(src.has_value(), "a block without a current copy");
    TZ_LOG_DEBUG("store: prefetch '%s' %s -> %s at trace pos %zu", b.name.c_str(),
                 tier_name(*src), tier_name(t), trace_pos);
    push_copy(b, *src, t, true);
    b.copies[ti(t)].valid = true;
    b.copies[ti(t)].by_prefetch = true;
    b.copies[ti(t)].loaded_from = *src;
    b.copies[ti(t)].lru_tick = ++tick;
    ++stats.tiers[ti(t)].prefetches;
    return true;
  }

  // A write makes the block's other upper copies stale: free them now rather than hold space.
  void drop_stale_copies(Block& b, Tier written) {
    for (Tier u : {Tier::kDevice, Tier::kHost}) {
      if (u == written || u == b.home || !b.copies[ti(u)].present || b.leases[ti(u)] > 0) continue;
      push_free(b, u);
      b.copies[ti(u)] = Copy{};
      logical_used[ti(u)] -= b.bytes;
    }
  }

  // Prefetches along the trace from the current position as far as the budgets allow.
  // Device loads: at most `host_prefetch_depth` device copies loaded from the host tier (a memcpy
  // or a DMA, quick to redo), counting the one pinned now, are held for the next uses; past them
  // only loads from NVMe are started, each still by Belady's rule (it may only displace copies
  // used after it), so that a slow read gets the disk while quick host loads run before its use.
  void prefetch_ahead() {
    if (!belady() || trace.empty()) return;
    bool dev_stop = false;
    bool host_stop = false;
    std::uint32_t host_sourced = 0;  // device uses in the window whose bytes come from the host
    const std::size_t len = trace.size();
    if (trace_pos > 0) {
      const TraceEntry& cur = trace[trace_pos - 1];
      const Block* b = find(cur.block);
      if (cur.tier == Tier::kDevice && b != nullptr && b->leases[ti(Tier::kDevice)] > 0 &&
          b->copies[ti(Tier::kDevice)].loaded_from == Tier::kHost) {
        ++host_sourced;
      }
    }
    for (std::size_t d = 0; d < len && !(dev_stop && host_stop); ++d) {
      const TraceEntry& e = trace[(trace_pos + d) % len];
      Block* b = find(e.block);
      if (b == nullptr || e.access == Access::kWrite || !b->error.is_ok()) continue;
      // Loading bytes that a write-only pin replaces before this use would be wasted.
      if (next_in(overwrites, b->id, trace_pos, len) < d) continue;
      if (b->total_leases > 0 && b->copies[ti(e.tier)].valid) continue;
      bool has_writer = false;
      for (std::size_t i = 0; i < kTierCount; ++i) has_writer |= b->write_leases[i] > 0;
      if (has_writer) continue;
      if (e.tier == Tier::kDevice) {
        if (dev_stop || b->home == Tier::kDevice) continue;
        const Copy& dev = b->copies[ti(Tier::kDevice)];
        const bool from_host =
            dev.valid ? dev.loaded_from == Tier::kHost : b->copies[ti(Tier::kHost)].valid;
        const bool far = host_sourced >= options.host_prefetch_depth;
        if (from_host) ++host_sourced;
        if (dev.valid || (far && from_host)) continue;
        if (!try_prefetch(*b, Tier::kDevice, d)) dev_stop = true;
      } else if (e.tier == Tier::kHost && !host_stop && b->home == Tier::kNvme) {
        if (!try_prefetch(*b, Tier::kHost, d)) host_stop = true;
      }
    }
  }

  void note_pin(const TraceEntry& e) {
    record.push_back(e);
    if (!following) return;
    if (trace_pos < trace.size() && trace[trace_pos] == e) {
      ++trace_pos;
      return;
    }
    following = false;
    ++stats.trace_deviations;
    TZ_LOG_DEBUG("store: access order left the recorded trace at pin %zu; LRU until the next "
                 "step", trace_pos);
  }

  void build_index() {
    dev_uses.clear();
    host_uses.clear();
    overwrites.clear();
    any_uses.clear();
    for (std::size_t i = 0; i < trace.size(); ++i) {
      const TraceEntry& e = trace[i];
      const auto pos = static_cast<std::uint32_t>(i);
      // A write-only pin needs space, not the bytes: it is no reason to keep a copy.
      if (e.access == Access::kWrite) {
        overwrites[e.block].push_back(pos);
        continue;
      }
      if (e.tier == Tier::kDevice) dev_uses[e.block].push_back(pos);
      if (e.tier == Tier::kHost) host_uses[e.block].push_back(pos);
      any_uses[e.block].push_back(pos);
    }
  }

  // ---- statistics ----------------------------------------------------------------------------
  void link_start(Link l) {
    if (link_active[li(l)]++ == 0) link_busy_since[li(l)] = now_s();
  }
  void link_end(Link l) {
    TZ_ASSERT(link_active[li(l)] > 0);
    if (--link_active[li(l)] == 0) {
      stats.links[li(l)].busy_s += now_s() - link_busy_since[li(l)];
    }
  }

  // ---- mover: physical operations (all under mu) ----------------------------------------------
  void fail_op(Block& b, Op& op, Status st) {
    if (op.failed) return;
    op.failed = true;
    op.status = st;
    b.error = st;
    b.skip_until = b.next_seq - 1;
    b.failures.push_back(Failure{op.seq, b.next_seq - 1, st});
    if (b.failures.size() > 16) b.failures.pop_front();
    if (st.code() == ErrorCode::kCorrupt) {
      ++stats.checksum_failures;
    } else {
      ++stats.io_errors;
    }
    TZ_LOG_DEBUG("store: %s", st.to_string().c_str());
  }

  void* tier_ptr(Block& b, Tier t) {
    if (t == Tier::kDevice) return b.dev.data();
    if (t == Tier::kHost) return b.host.data();
    return nullptr;
  }

  void free_physical(Block& b, Tier t) {
    if (t == Tier::kDevice) {
      if (!b.dev.empty()) {
        dev_cache.emplace(b.bytes, std::move(b.dev));  // still counted in phys_used
        dev_cache_bytes += b.bytes;
        --pending_frees[ti(t)];
        update_used(t);
        return;
      }
    } else if (t == Tier::kHost) {
      b.host.reset();
    } else if (b.has_extent) {
      swap->free(b.extent);
      b.has_extent = false;
      b.nvme_written = false;
    }
    phys_used[ti(t)] -= b.bytes;
    --pending_frees[ti(t)];
    update_used(t);
  }

  // Marks the end of a load into the device for Lease::ready_event. The mover cannot hand a
  // failure to anyone here, and a failed event record means the device is unusable.
  void record_ready(Block& b, gpu::Stream& stream) {
    Status st = b.ready_event->record(stream);
    TZ_ASSERT(st.is_ok(), st.to_string().c_str());
  }

  // Orders work on `stream` after the caller's last use of the block's device copy.
  void after_user(Block& b, gpu::Stream& stream) {
    if (b.user_event_recorded) {
      Status st = stream.wait(*b.user_event);
      TZ_ASSERT(st.is_ok(), st.to_string().c_str());
    }
  }

  void enqueue_callback(gpu::Stream& stream, Block& b, const Op& op, std::uint32_t chunk,
                        bool whole, int staging_index = -1) {
    DeviceDone done{b.id, op.seq, chunk, whole, staging_index};
    Status st = device->host_callback(stream, [this, done] {
      std::lock_guard lock(mu);
      device_done.push_back(done);
      wake();
    });
    TZ_ASSERT(st.is_ok(), st.to_string().c_str());
  }

  Status device_copy(void* dst, const void* src, std::uint64_t bytes, gpu::CopyKind kind,
                     gpu::Stream& stream) {
    return device->copy_async(dst, src, static_cast<std::size_t>(bytes), kind, stream);
  }

  // Tries to start op (the head of b's chain). Returns true if it made progress.
  bool start_op(Block& b, Op& op) {
    if (op.kind == OpKind::kAlloc) {
      auto& fifo = alloc_fifo[ti(op.dst)];
      TZ_ASSERT(!fifo.empty());
      if (fifo.front() != std::make_pair(b.id, op.seq)) return false;
      const Tier t = op.dst;
      if (t != Tier::kDevice && phys_used[ti(t)] + b.bytes > budget[ti(t)]) {
        return false;  // wait for frees
      }
      Status st;
      if (t == Tier::kDevice) {
        auto hit = dev_cache.find(b.bytes);
        if (hit != dev_cache.end()) {
          b.dev = std::move(hit->second);
          dev_cache.erase(hit);
          dev_cache_bytes -= b.bytes;
          update_used(t);
          fifo.pop_front();
          op.started = true;
          return finish_op(b);  // its bytes were never given back
        }
        while (phys_used[ti(t)] + b.bytes > budget[ti(t)] && !dev_cache.empty()) {
          auto last = std::prev(dev_cache.end());
          phys_used[ti(t)] -= last->first;
          dev_cache_bytes -= last->first;
          dev_cache.erase(last);  // frees the buffer
          update_used(t);
        }
        if (phys_used[ti(t)] + b.bytes > budget[ti(t)]) return false;
        auto buf = device->allocate(static_cast<std::size_t>(b.bytes));
        if (buf) {
          b.dev = std::move(buf).value();
        } else {
          st = std::move(buf).take_status();
        }
      } else if (t == Tier::kHost) {
        auto buf = pool->allocate(b.bytes);
        if (buf) {
          b.host = std::move(buf).value();
        } else {
          if (pending_frees[ti(t)] > 0) return false;  // fragmentation: wait for frees
          st = std::move(buf).take_status().with_context("store: pinned pool");
        }
      } else {
        TZ_ASSERT(false, "NVMe extents are allocated at create");
      }
      fifo.pop_front();
      op.started = true;
      if (st.is_ok()) {
        phys_used[ti(t)] += b.bytes;
        update_used(t);
      } else {
        // The copy is unusable: later reads of the block report this.
        fail_op(b, op, std::move(st).with_context("store: allocating '" + b.name + "' in the " +
                                                  tier_name(t) + " tier"));
        op.failed = false;  // the allocation op itself is over
        phys_used[ti(t)] += b.bytes;  // balanced by the free that follows (logically present)
      }
      return finish_op(b);
    }
    if (op.kind == OpKind::kFree) {
      if (op.dst == Tier::kDevice && b.user_event_recorded && !op.started) {
        // Free only after the caller's device work on the copy: order a callback after it.
        op.started = true;
        op.device_pending = true;
        after_user(b, device->d2h_stream());
        enqueue_callback(device->d2h_stream(), b, op, 0, true);
        return true;
      }
      if (op.device_pending) return false;
      op.started = true;
      free_physical(b, op.dst);
      return finish_op(b);
    }
    if (op.seq <= b.skip_until && !op.started) {
      op.started = true;
      op.failed = true;
      op.status = b.error.is_ok() ? Status::internal("skipped") : b.error;
      return finish_op(b);
    }
    if (op.kind == OpKind::kZero) {
      op.started = true;
      if (op.dst == Tier::kDevice) {
        after_user(b, device->h2d_stream());
        Status st = device->memset_async(b.dev.data(), 0, b.bytes, device->h2d_stream());
        TZ_ASSERT(st.is_ok(), st.to_string().c_str());
        record_ready(b, device->h2d_stream());
        op.device_pending = true;
        enqueue_callback(device->h2d_stream(), b, op, 0, true);
        return true;
      }
      if (op.dst == Tier::kHost) std::memset(b.host.data(), 0, b.bytes);
      if (op.dst == Tier::kNvme) b.nvme_written = false;
      return finish_op(b);
    }
    return start_copy(b, op);
  }

  bool start_copy(Block& b, Op& op) {
    if (!op.started) {
      op.started = true;
      op.start_us = Trace::global().now_us();
      op.start_s = now_s();
      link_start(link_of(op.src, op.dst));
      const bool dev_dst = op.dst == Tier::kDevice;
      if (tier_ptr(b, op.src) == nullptr && op.src != Tier::kNvme) {
        fail_op(b, op, Status::internal("store: '" + b.name + "' has no " +
                                        tier_name(op.src) + " copy to read"));
        return finish_copy_if_done(b, op);
      }
      if (op.src == Tier::kNvme && !b.nvme_written) {
        // Never written: the block reads as zeros.
        op.zero_fill = true;
        if (dev_dst) {
          after_user(b, device->h2d_stream());
          Status st = device->memset_async(b.dev.data(), 0, b.bytes, device->h2d_stream());
          TZ_ASSERT(st.is_ok(), st.to_string().c_str());
          record_ready(b, device->h2d_stream());
          b.issued_seq = op.seq;
          op.device_pending = true;
          enqueue_callback(device->h2d_stream(), b, op, 0, true);
          return true;
        }
        std::memset(b.host.data(), 0, b.bytes);
        return finish_copy_if_done(b, op);
      }
      if (op.src != Tier::kNvme && op.dst != Tier::kNvme) {
        // Host <-> device: one copy on the direction's stream.
        gpu::Stream& s = dev_dst ? device->h2d_stream() : device->d2h_stream();
        after_user(b, s);
        Status st = device_copy(tier_ptr(b, op.dst), tier_ptr(b, op.src), b.bytes,
                                dev_dst ? gpu::CopyKind::kHostToDevice
                                        : gpu::CopyKind::kDeviceToHost,
                                s);
        if (!st.is_ok()) {
          fail_op(b, op, std::move(st).with_context("store: copying '" + b.name + "'"));
          return finish_copy_if_done(b, op);
        }
        if (dev_dst) {
          record_ready(b, s);
          b.issued_seq = op.seq;
        }
        op.device_pending = true;
        enqueue_callback(s, b, op, 0, true);
        return true;
      }
      op.chunks = b.chunk_count(options.chunk_bytes);
      if (op.dst == Tier::kNvme) b.nvme_written = false;  // until every piece has landed
    }
    return pump_chunks(b, op);
  }

  // Starts the pieces of an NVMe copy that may start now.
  bool pump_chunks(Block& b, Op& op) {
    bool progress = false;
    const bool via_staging = op.src == Tier::kDevice || op.dst == Tier::kDevice;
    while (!op.failed && op.next_chunk < op.chunks) {
      const std::uint32_t k = op.next_chunk;
      const std::uint64_t off = static_cast<std::uint64_t>(k) * options.chunk_bytes;
      const std::uint64_t len = std::min(options.chunk_bytes, b.bytes - off);
      int s = -1;
      if (via_staging) {
        const std::size_t dir = op.src == Tier::kDevice ? 1 : 0;
        if (staging_free.empty() || staging_held[dir] >= staging_cap) break;
        s = staging_free.back();
        staging_free.pop_back();
        ++staging_held[dir];
      }
      ++op.next_chunk;
      ++op.outstanding;
      progress = true;
      if (op.src == Tier::kDevice) {
        // Device -> staging first; the write starts when the copy is done.
        after_user(b, *piece_d2h);
        Status st = device_copy(staging[static_cast<std::size_t>(s)].data(),
                                static_cast<std::byte*>(b.dev.data()) + off, len,
                                gpu::CopyKind::kDeviceToHost, *piece_d2h);
        TZ_ASSERT(st.is_ok(), st.to_string().c_str());
        enqueue_callback(*piece_d2h, b, op, k, false, s);
        continue;
      }
      IoJob job;
      job.block = b.id;
      job.op_seq = op.seq;
      job.chunk = k;
      job.staging = s;
      std::byte* buf = s >= 0 ? staging[static_cast<std::size_t>(s)].data()
                              : static_cast<std::byte*>(b.host.data()) + off;
      job.io_bytes = round_up(len, kAlign);
      job.data = buf;
      job.data_len = len;
      job.dir = op.dst == Tier::kNvme ? nvme::IoOp::kWrite : nvme::IoOp::kRead;
      job.transfers = swap->transfers(job.dir, b.extent, off, buf, job.io_bytes);
      queue_job(std::move(job));
    }
    return progress;
  }

  void queue_job(IoJob job) {
    job.order = job_order++;
    if (job.dir == nvme::IoOp::kRead) {
      read_q.push_back(std::move(job));
    } else {
      write_q.push_back(std::move(job));
    }
  }

  // Marks piece k of an NVMe copy finished (or failed) and frees its staging buffer.
  void piece_done(Op& op, int staging_index) {
    if (staging_index >= 0) {
      staging_free.push_back(staging_index);
      --staging_held[op.src == Tier::kDevice ? 1 : 0];
    }
    TZ_ASSERT(op.outstanding > 0);
    --op.outstanding;
    ++op.finished;
  }

  bool finish_copy_if_done(Block& b, Op& op) {
    if (op.device_pending || op.outstanding > 0) return false;
    if (!op.failed && op.chunks > 0 && op.finished < op.chunks) return false;
    const Link l = link_of(op.src, op.dst);
    link_end(l);
    if (!op.failed && op.dst == Tier::kNvme) b.nvme_written = true;
    if (!op.failed && !op.zero_fill) {
      stats.links[li(l)].bytes += b.bytes;
      ++stats.links[li(l)].moves;
      stats.tiers[ti(op.src)].bytes_out += b.bytes;
      stats.tiers[ti(op.dst)].bytes_in += b.bytes;
      if (options.trace_spans && Trace::global().enabled()) {
        const bool nvme_link = op.src == Tier::kNvme || op.dst == Tier::kNvme;
        const char* track = nvme_link ? "store nvme"
                            : op.dst == Tier::kDevice ? "store copy h2d"
                                                      : "store copy d2h";
        Trace::global().span(track, std::string(link_name(l)) + " " + b.name, op.start_us,
                             Trace::global().now_us());
      }
    }
    return finish_op(b);
  }

  bool finish_op(Block& b) {
    Op& op = b.ops.front();
    b.done_seq = op.seq;
    b.issued_seq = std::max(b.issued_seq, op.seq);
    b.ops.pop_front();
    cv.notify_all();
    return true;
  }

  // Runs the chain of b as far as it can go now.
  bool advance(Block& b) {
    bool progress = false;
    while (!b.ops.empty()) {
      Op& op = b.ops.front();
      const std::size_t before = b.ops.size();
      bool p;
      if (!op.started || op.kind == OpKind::kFree) {
        p = start_op(b, op);
      } else if (op.kind == OpKind::kCopy && op.chunks > 0) {
        p = pump_chunks(b, op);
        p |= finish_copy_if_done(b, op) ? true : false;
      } else {
        p = false;
      }
      progress |= p;
      if (b.ops.size() == before) break;  // head still running
    }
    return progress;
  }

  Op* find_op(Block& b, std::uint64_t seq) {
    if (b.ops.empty() || b.ops.front().seq != seq) return nullptr;
    return &b.ops.front();
  }

  void apply_device_done(const DeviceDone& d) {
    auto it = blocks.find(d.block);
    TZ_ASSERT(it != blocks.end());
    Block& b = it->second;
    Op* op = find_op(b, d.op_seq);
    TZ_ASSERT(op != nullptr, "a device completion for an op that is not running");
    if (d.whole) {
      op->device_pending = false;
      if (op->kind == OpKind::kFree) {
        free_physical(b, op->dst);
        finish_op(b);
      } else if (op->kind == OpKind::kZero) {
        finish_op(b);
      } else {
        finish_copy_if_done(b, *op);
      }
      return;
    }
    const std::uint64_t off = static_cast<std::uint64_t>(d.chunk) * options.chunk_bytes;
    const std::uint64_t len = std::min(options.chunk_bytes, b.bytes - off);
    if (op->src == Tier::kDevice && !op->failed) {
      // Device -> staging done: checksum the piece and write it.
      std::byte* buf = staging[static_cast<std::size_t>(d.staging)].data();
      IoJob job;
      job.data = buf;
      job.data_len = len;
      job.block = b.id;
      job.op_seq = op->seq;
      job.chunk = d.chunk;
      job.staging = d.staging;
      job.dir = nvme::IoOp::kWrite;
      job.io_bytes = round_up(len, kAlign);
      job.transfers = swap->transfers(job.dir, b.extent, off, buf, job.io_bytes);
      queue_job(std::move(job));
      return;
    }
    // Staging -> device done, or a piece of a failed copy.
    piece_done(*op, d.staging);
    finish_copy_if_done(b, *op);
  }

  void apply_io_done(IoJob& job) {
    auto it = blocks.find(job.block);
    TZ_ASSERT(it != blocks.end());
    Block& b = it->second;
    Op* op = find_op(b, job.op_seq);
    TZ_ASSERT(op != nullptr, "an I/O completion for an op that is not running");
    in_flight_bytes -= job.io_bytes;
    if (job.dir == nvme::IoOp::kRead) {
      --in_flight_reads;
    } else {
      --in_flight_writes;
    }
    const std::uint64_t off = static_cast<std::uint64_t>(job.chunk) * options.chunk_bytes;
    const std::uint64_t len = std::min(options.chunk_bytes, b.bytes - off);
    if (!job.status.is_ok()) {
      fail_op(b, *op, std::move(job.status).with_context(
                          std::string("store: ") + (job.dir == nvme::IoOp::kRead ? "reading" : "writing") +
                          " block '" + b.name + "' piece " + std::to_string(job.chunk)));
    } else if (job.dir == nvme::IoOp::kWrite) {
      b.sums[job.chunk] = job.sum;
    } else if (!op->failed) {
      const std::byte* buf = job.data;
      if (job.sum != b.sums[job.chunk]) {
        fail_op(b, *op,
                Status::corrupt("store: checksum mismatch in block '" + b.name + "' piece " +
                                std::to_string(job.chunk) + " (bytes " + std::to_string(off) +
                                ".." + std::to_string(off + len) + ") read from NVMe"));
      } else if (op->dst == Tier::kDevice) {
        gpu::Stream& s = *piece_h2d;
        after_user(b, s);
        Status st = device_copy(static_cast<std::byte*>(b.dev.data()) + off, buf, len,
                                gpu::CopyKind::kHostToDevice, s);
        TZ_ASSERT(st.is_ok(), st.to_string().c_str());
        if (++op->copies_enqueued == op->chunks) {
          record_ready(b, s);
          b.issued_seq = op->seq;
        }
        enqueue_callback(s, b, *op, job.chunk, false, job.staging);
        return;  // the piece finishes when the copy does
      }
    }
    piece_done(*op, job.staging);
    finish_copy_if_done(b, *op);
  }

  // An early write-back that nothing waits for yet (no op queued behind it, no pin waiting for
  // it): its staging buffers and disk slots go to other moves first. Once the block is evicted
  // or a pin waits for it, the write takes its turn in decision order.
  bool deferrable(const Block& b) const { return b.ops.size() == 1 && b.ops.front().early; }

  // Picks the I/O jobs to submit now: within the in-flight bound, and in kGrouped mode one
  // direction at a time (reads first; switch when a run is long enough and the other side waits).
  std::vector<IoJob> pick_jobs() {
    std::vector<IoJob> out;
    const std::uint64_t limit = options.max_io_in_flight_bytes;
    // Writes somebody waits for (a victim's, whose space a load needs) before deferrable ones.
    std::stable_partition(write_q.begin(), write_q.end(), [&](const IoJob& j) {
      auto it = blocks.find(j.block);
      return it == blocks.end() || !deferrable(it->second);
    });
    auto fits = [&](const IoJob& j) {
      return in_flight_bytes == 0 || in_flight_bytes + j.io_bytes <= limit;
    };
    auto take = [&](std::deque<IoJob>& q) {
      IoJob j = std::move(q.front());
      q.pop_front();
      in_flight_bytes += j.io_bytes;
      run_bytes += j.io_bytes;
      if (j.dir == nvme::IoOp::kRead) {
        ++in_flight_reads;
      } else {
        ++in_flight_writes;
      }
      out.push_back(std::move(j));
    };
    if (options.io_grouping == IoGrouping::kMixed) {
      for (;;) {
        std::deque<IoJob>* q = nullptr;
        if (!read_q.empty() && (write_q.empty() || read_q.front().order < write_q.front().order)) {
          q = &read_q;
        } else if (!write_q.empty()) {
          q = &write_q;
        }
        if (q == nullptr || !fits(q->front())) break;
        take(*q);
      }
      return out;
    }
    for (;;) {
      std::deque<IoJob>& cur = writing ? write_q : read_q;
      std::deque<IoJob>& other = writing ? read_q : write_q;
      const std::uint32_t cur_in_flight = writing ? in_flight_writes : in_flight_reads;
      const std::uint32_t other_in_flight = writing ? in_flight_reads : in_flight_writes;
      const bool run_over = run_bytes >= options.write_run_bytes;
      if (!cur.empty() && !(run_over && !other.empty())) {
        if (other_in_flight > 0 || !fits(cur.front())) break;  // drain the other side first
        take(cur);
        continue;
      }
      if (other.empty()) break;
      // Switch direction once the current one has drained.
      if (cur_in_flight > 0) break;
      writing = !writing;
      run_bytes = 0;
    }
    return out;
  }

  bool idle() const {
    if (!read_q.empty() || !write_q.empty() || in_flight_bytes > 0 || !device_done.empty()) {
      return false;
    }
    for (const auto& [id, b] : blocks) {
      if (!b.ops.empty()) return false;
    }
    return true;
  }

  // Erases destroyed blocks whose chains have drained.
  void reap_destroyed() {
    for (auto it = blocks.begin(); it != blocks.end();) {
      if (it->second.destroyed && it->second.ops.empty()) {
        it = blocks.erase(it);
      } else {
        ++it;
      }
    }
  }

  void mover_loop() {
    std::unordered_map<nvme::IoOpId, IoJob> in_flight;
    nvme::IoQueue* io = swap ? &swap->queue() : nullptr;
    std::unique_lock lock(mu);
    for (;;) {
      const std::uint64_t seen = events;
      bool progress = false;
      // Completions reported by device callbacks.
      std::vector<DeviceDone> dd;
      dd.swap(device_done);
      for (const DeviceDone& d : dd) apply_device_done(d);
      progress |= !dd.empty();
      // Chains run in the order their heads were decided, so that staging buffers and disk
      // slots go to the move decided first (the victim's write-back before a later one).
      std::vector<Block*> busy;
      for (auto& [id, b] : blocks) {
        if (!b.ops.empty()) busy.push_back(&b);
      }
      std::sort(busy.begin(), busy.end(), [this](const Block* x, const Block* y) {
        const bool dx = deferrable(*x);
        const bool dy = deferrable(*y);
        if (dx != dy) return dy;
        return x->ops.front().decided < y->ops.front().decided;
      });
      for (Block* b : busy) progress |= advance(*b);
      reap_destroyed();
      std::vector<IoJob> jobs = pick_jobs();
      if (stopping && idle() && in_flight.empty()) break;
      lock.unlock();
      std::vector<IoJob> done;
      for (IoJob& j : jobs) {
        if (j.dir == nvme::IoOp::kWrite) j.sum = XXH3_64bits(j.data, j.data_len);
        auto id = io->start(j.transfers);
        if (!id) {
          j.status = std::move(id).take_status();
          done.push_back(std::move(j));
        } else {
          in_flight.emplace(*id, std::move(j));
        }
      }
      if (io != nullptr && !in_flight.empty()) {
        Status st = io->poll();
        if (!st.is_ok()) TZ_LOG_ERROR("store: I/O engine failed: %s", st.to_string().c_str());
        for (auto it = in_flight.begin(); it != in_flight.end();) {
          if (io->done(it->first)) {
            it->second.status = io->wait(it->first);
            done.push_back(std::move(it->second));
            it = in_flight.erase(it);
          } else {
            ++it;
          }
        }
      }
      for (IoJob& j : done) {
        if (j.dir == nvme::IoOp::kRead && j.status.is_ok()) j.sum = XXH3_64bits(j.data, j.data_len);
      }
      lock.lock();
      for (IoJob& j : done) apply_io_done(j);
      progress |= !done.empty() || !jobs.empty();
      if (progress || events != seen) continue;
      if (!in_flight.empty()) {
        mover_cv.wait_for(lock, std::chrono::microseconds(200));
      } else {
        mover_cv.wait(lock, [&] { return events != seen; });
      }
    }
  }
};

// ---- Store -------------------------------------------------------------------------------------

Store::Store(std::unique_ptr<Impl> impl, const StoreOptions& options)
    : impl_(std::move(impl)), options_(options) {}

Result<std::unique_ptr<Store>> Store::create(const StoreOptions& options, gpu::Device& device,
                                             PinnedPool& pool, SwapFactory make_swap) {
  if (options.chunk_bytes == 0 || options.chunk_bytes % kAlign != 0) {
    return Status::invalid_argument("store: chunk size must be a positive multiple of 4 KiB, not " +
                                    std::to_string(options.chunk_bytes));
  }
  if (options.staging_buffers == 0) {
    return Status::invalid_argument("store: at least one staging buffer is needed");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->device = &device;
  impl->pool = &pool;
  impl->budget[ti(Tier::kDevice)] = options.device_budget_bytes;
  impl->budget[ti(Tier::kHost)] = options.host_budget_bytes;
  for (std::uint32_t i = 0; i < options.staging_buffers; ++i) {
    auto buf = pool.allocate(options.chunk_bytes);
    if (!buf) {
      return std::move(buf).take_status().with_context("store: staging buffer " +
                                                       std::to_string(i));
    }
    impl->staging.push_back(std::move(buf).value());
    impl->staging_free.push_back(static_cast<int>(i));
  }
  // Each direction leaves a quarter of the buffers (at least one, when there are two or more) to
  // the other.
  impl->staging_cap = options.staging_buffers -
                      (options.staging_buffers < 2 ? 0 : std::max(1u, options.staging_buffers / 4));
  for (auto [stream, name] : {std::pair{&impl->piece_h2d, "store pieces h2d"},
                              std::pair{&impl->piece_d2h, "store pieces d2h"}}) {
    auto created = device.create_stream(name);
    if (!created) return std::move(created).take_status().with_context("store: stream");
    *stream = std::move(created).value();
  }
  std::unique_ptr<Store> store(new Store(std::move(impl), options));
  Impl* raw = store->impl_.get();
  // The mover makes the swap space (so it owns the ring), then reports and starts its loop.
  std::promise<Status> started;
  std::future<Status> started_f = started.get_future();
  raw->mover = std::thread([raw, &started, make_swap = std::move(make_swap)] {
    Status st;
    if (make_swap) {
      auto swap = make_swap();
      if (swap) {
        raw->swap = std::move(swap).value();
      } else {
        st = std::move(swap).take_status();
      }
    }
    if (st.is_ok() && raw->swap && raw->options.register_pool_buffers) {
      std::vector<iovec> regions;
      for (const PinnedSlab& s : raw->pool->slabs()) regions.push_back(iovec{s.data, s.bytes});
      Status reg = raw->swap->queue().register_buffers(regions);
      if (!reg.is_ok()) {
        TZ_LOG_INFO("store: pinned buffers not registered with the I/O engine: %s",
                    reg.to_string().c_str());
      }
    }
    {
      std::lock_guard lock(raw->mu);
      raw->budget[ti(Tier::kNvme)] = raw->swap ? raw->swap->capacity_bytes() : 0;
      for (std::size_t i = 0; i < kTierCount; ++i) {
        raw->stats.tiers[i].budget_bytes = raw->budget[i];
      }
      if (!st.is_ok()) raw->stopping = true;
    }
    started.set_value(st);
    if (st.is_ok()) raw->mover_loop();
    raw->swap.reset();  // closes the ring on the thread that owns it
  });
  Status st = started_f.get();
  if (!st.is_ok()) return st;  // the destructor joins the finished mover
  return store;
}

Store::~Store() {
  {
    std::unique_lock lock(impl_->mu);
    for (auto& [id, b] : impl_->blocks) {
      TZ_ASSERT(b.total_leases == 0, "store destroyed while a lease is alive");
      if (b.destroyed) continue;
      b.destroyed = true;
      for (std::size_t i = 0; i < kTierCount; ++i) {
        if (b.copies[i].present) impl_->push_free(b, static_cast<Tier>(i));
      }
    }
    impl_->stopping = true;
    impl_->wake();
  }
  impl_->mover.join();
  impl_->dev_cache.clear();
  Status st = impl_->device->synchronize();
  if (!st.is_ok()) TZ_LOG_WARN("store: device synchronize at exit: %s", st.to_string().c_str());
  impl_->blocks.clear();
  impl_->staging.clear();
}

Result<BlockId> Store::create_block(std::uint64_t bytes, Tier home, std::string name) {
  if (bytes == 0) return Status::invalid_argument("store: block '" + name + "' has zero bytes");
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  if (home == Tier::kNvme && !m.swap) {
    return Status::invalid_argument("store: block '" + name +
                                    "' lives on NVMe but the store has no swap space");
  }
  const BlockId id = m.next_id++;
  Block& b = m.blocks[id];
  b.id = id;
  b.name = std::move(name);
  b.bytes = bytes;
  b.home = home;
  auto ev = m.device->create_event();
  if (!ev) {
    m.blocks.erase(id);
    return std::move(ev).take_status();
  }
  b.ready_event = std::move(ev).value();
  if (home == Tier::kNvme) {
    auto ext = m.swap->allocate(bytes);
    if (!ext) {
      m.blocks.erase(id);
      return std::move(ext).take_status().with_context("store: block '" + b.name + "'");
    }
    b.extent = *ext;
    b.has_extent = true;
    b.sums.assign(b.chunk_count(m.options.chunk_bytes), 0);
    m.logical_used[ti(Tier::kNvme)] += bytes;
    m.phys_used[ti(Tier::kNvme)] += bytes;
    TierStats& ts = m.stats.tiers[ti(Tier::kNvme)];
    ts.used_bytes = m.phys_used[ti(Tier::kNvme)];
    ts.peak_bytes = std::max(ts.peak_bytes, ts.used_bytes);
  } else {
    Status st = m.make_resident(b, home);
    if (!st.is_ok()) {
      m.blocks.erase(id);
      return st;
    }
    Op zero;
    zero.kind = OpKind::kZero;
    zero.dst = home;
    m.push_op(b, std::move(zero));
  }
  Copy& c = b.copies[ti(home)];
  c.present = true;
  c.valid = true;
  return id;
}

Status Store::destroy_block(BlockId id) {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  Block* b = m.find(id);
  if (b == nullptr) return Status::invalid_argument("store: no block " + std::to_string(id));
  if (b->total_leases > 0) {
    return Status::invalid_argument("store: block '" + b->name + "' is still pinned");
  }
  for (std::size_t i = 0; i < kTierCount; ++i) {
    if (!b->copies[i].present) continue;
    m.push_free(*b, static_cast<Tier>(i));
    m.logical_used[i] -= b->bytes;
    b->copies[i] = Copy{};
  }
  b->destroyed = true;
  m.wake();
  return Status::ok();
}

Result<Lease> Store::pin(BlockId id, Tier tier, Access access) {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  Block* bp = m.find(id);
  if (bp == nullptr) return Status::invalid_argument("store: pin of unknown block " + std::to_string(id));
  Block& b = *bp;
  if (ti(tier) > ti(b.home)) {
    return Status::invalid_argument(std::string("store: block '") + b.name + "' lives in the " +
                                    tier_name(b.home) + " tier and cannot be pinned below it in " +
                                    tier_name(tier));
  }
  if (tier == Tier::kNvme && access != Access::kRead) {
    return Status::invalid_argument("store: NVMe pins are read-only (block '" + b.name + "')");
  }
  for (std::size_t i = 0; i < kTierCount; ++i) {
    if (i == ti(tier) || b.leases[i] == 0) continue;
    if (access != Access::kRead || b.write_leases[i] > 0) {
      return Status::invalid_argument(std::string("store: block '") + b.name + "' is pinned in " +
                                      tier_name(static_cast<Tier>(i)) +
                                      "; a write pin elsewhere would conflict");
    }
  }
  if (!b.error.is_ok() && access != Access::kWrite) {
    return Status(b.error).with_context("store: block '" + b.name + "' lost its bytes");
  }
  if (tier != Tier::kNvme) m.note_pin(TraceEntry{id, tier, access});
  Copy& c = b.copies[ti(tier)];
  TierStats& ts = m.stats.tiers[ti(tier)];
  if (c.present && (c.valid || access == Access::kWrite)) {
    ++ts.hits;
    if (c.by_prefetch) ++ts.prefetch_hits;
  } else {
    ++ts.misses;
  }
  c.by_prefetch = false;
  const std::uint64_t first_seq = b.next_seq;  // the first op this pin enqueues
  m.protect = id;
  Status placed = m.make_resident(b, tier);
  m.protect = 0;
  TZ_RETURN_IF_ERROR(std::move(placed));
  if (access != Access::kWrite && !c.valid) {
    auto src = m.load_source(b, tier);
    TZ_ASSERT(src.has_value(), "a block without a current copy");
    TZ_LOG_DEBUG("store: load '%s' %s -> %s on demand", b.name.c_str(), tier_name(*src),
                 tier_name(tier));
    m.push_copy(b, *src, tier, false);
    c.valid = true;
    c.loaded_from = *src;
  }
  if (access != Access::kRead) {
    for (std::size_t i = 0; i < kTierCount; ++i) b.copies[i].valid = false;
    c.valid = true;
    if (access == Access::kWrite) c.loaded_from = Tier::kNvme;  // nothing was loaded
    m.drop_stale_copies(b, tier);
    if (access == Access::kWrite) b.error = Status::ok();
    ++b.write_leases[ti(tier)];
    b.dirtied_at = tier == Tier::kNvme || m.record.empty()
                       ? kNoPos
                       : static_cast<std::uint32_t>(m.record.size() - 1);
  }
  ++b.leases[ti(tier)];
  ++b.total_leases;
  c.lru_tick = ++m.tick;
  Lease lease;
  lease.store_ = this;
  lease.block_ = id;
  lease.tier_ = tier;
  lease.access_ = access;
  lease.bytes_ = b.bytes;
  // A read of a current copy needs only the op that filled it; a copy out of the tier still in
  // flight (an early write-back) only reads it too. Writers wait for every earlier move.
  lease.ready_seq_ = access == Access::kRead ? b.fill_seq[ti(tier)] : b.next_seq - 1;
  lease.first_seq_ = first_seq;
  // An early write-back this pin waits for is no longer one that nobody waits for.
  for (Op& op : b.ops) {
    if (op.seq <= lease.ready_seq_) op.early = false;
  }
  m.prefetch_ahead();
  return lease;
}

Status Store::prefetch(BlockId id, Tier tier) {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  Block* b = m.find(id);
  if (b == nullptr) return Status::invalid_argument("store: prefetch of unknown block " + std::to_string(id));
  if (ti(tier) > ti(b->home)) {
    return Status::invalid_argument(std::string("store: cannot prefetch '") + b->name +
                                    "' below its home tier");
  }
  for (std::size_t i = 0; i < kTierCount; ++i) {
    if (b->write_leases[i] > 0) return Status::ok();  // the writer's copy is the current one
  }
  if (tier == b->home) return Status::ok();
  (void)m.try_prefetch(*b, tier, std::nullopt);
  return Status::ok();
}

void Store::mark_step() {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  ++m.stats.steps;
  const bool followed = m.following;  // the whole step followed the trace
  if (m.options.policy == Policy::kTrace) {
    m.trace = std::move(m.record);
    m.build_index();
    m.following = !m.trace.empty();
  }
  // Spills learned while following the trace are valid for the next step; a recording step's
  // (LRU) evictions say nothing about Belady's.
  m.spill_trace = followed ? std::move(m.spill_record) : std::unordered_set<std::uint32_t>{};
  m.spill_record.clear();
  m.record.clear();
  m.trace_pos = 0;
  m.prefetch_ahead();
}

Status Store::drain() {
  std::unique_lock lock(impl_->mu);
  impl_->wake();
  impl_->cv.wait(lock, [&] { return impl_->idle(); });
  return Status::ok();
}

Status Store::flush() {
  std::unique_lock lock(impl_->mu);
  Impl& m = *impl_;
  std::vector<std::pair<BlockId, std::uint64_t>> writes;  // block, op
  Status lost;  // the first block whose bytes were already lost
  for (auto& [id, b] : m.blocks) {
    if (b.destroyed) continue;
    if (!b.error.is_ok()) {
      if (lost.is_ok()) lost = Status(b.error).with_context("store: flush: block '" + b.name + "'");
      continue;
    }
    bool writing = false;
    for (int n : b.write_leases) writing |= n > 0;
    if (writing) continue;
    for (Tier t : {Tier::kDevice, Tier::kHost}) {
      if (ti(t) >= ti(b.home) || !b.copies[ti(t)].present || !m.only_valid(b, t)) continue;
      writes.emplace_back(id, m.push_copy(b, t, b.home, false));
      b.copies[ti(b.home)].valid = true;
      b.dirtied_at = kNoPos;  // home by flush, not by eviction: nothing for the policy to learn
      ++m.stats.tiers[ti(t)].write_backs;
    }
  }
  m.wake();
  m.cv.wait(lock, [&] { return m.idle(); });
  for (const auto& [id, seq] : writes) {
    const Block* b = m.find(id);
    if (b == nullptr) continue;  // destroyed by another thread meanwhile: nothing to keep
    for (const Failure& f : b->failures) {
      if (f.first_seq <= seq && seq <= f.last_seq) {
        return Status(f.status).with_context("store: flush");
      }
    }
  }
  return lost;
}

StoreStats Store::stats() const {
  std::lock_guard lock(impl_->mu);
  StoreStats s = impl_->stats;
  // Links busy right now count up to this moment.
  const double t = now_s();
  for (std::size_t i = 0; i < kLinkCount; ++i) {
    if (impl_->link_active[i] > 0) s.links[i].busy_s += t - impl_->link_busy_since[i];
  }
  return s;
}

void Store::reset_stats() {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  StoreStats fresh;
  for (std::size_t i = 0; i < kTierCount; ++i) {
    fresh.tiers[i].budget_bytes = m.budget[i];
    fresh.tiers[i].peak_bytes = m.phys_used[i];
  }
  fresh.steps = m.stats.steps;
  m.stats = fresh;
  for (std::size_t i = 0; i < kTierCount; ++i) m.update_used(static_cast<Tier>(i));
  const double t = now_s();
  for (std::size_t i = 0; i < kLinkCount; ++i) m.link_busy_since[i] = t;
}

std::uint64_t Store::used_bytes(Tier tier) const {
  std::lock_guard lock(impl_->mu);
  return impl_->logical_used[ti(tier)];
}

std::uint64_t Store::budget_bytes(Tier tier) const {
  std::lock_guard lock(impl_->mu);
  return impl_->budget[ti(tier)];
}

bool Store::following_trace() const {
  std::lock_guard lock(impl_->mu);
  return impl_->following;
}

void Store::unpin(Lease& lease, gpu::Stream* writer) {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  auto it = m.blocks.find(lease.block_);
  TZ_ASSERT(it != m.blocks.end(), "lease of an unknown block");
  Block& b = it->second;
  const std::size_t t = ti(lease.tier_);
  TZ_ASSERT(b.leases[t] > 0 && b.total_leases > 0);
  --b.leases[t];
  --b.total_leases;
  if (lease.access_ != Access::kRead) --b.write_leases[t];
  b.copies[t].lru_tick = ++m.tick;
  if (writer != nullptr) {
    if (!b.user_event) {
      auto ev = m.device->create_event();
      TZ_ASSERT(ev.is_ok(), ev.status().to_string().c_str());
      b.user_event = std::move(ev).value();
    }
    Status st = b.user_event->record(*writer);
    TZ_ASSERT(st.is_ok(), st.to_string().c_str());
    b.user_event_recorded = true;
  }
  m.write_back_early(b, lease.tier_);
}

Status Store::wait_lease(Lease& lease) {
  if (lease.waited_ok_) return Status::ok();
  const double t0 = now_s();
  std::unique_lock lock(impl_->mu);
  Impl& m = *impl_;
  Block& b = m.blocks.at(lease.block_);
  m.cv.wait(lock, [&] { return b.done_seq >= lease.ready_seq_; });
  const double waited = now_s() - t0;
  m.stats.tiers[ti(lease.tier_)].stall_s += waited;
  if (Status st = Impl::lease_failure(b, lease.access_, lease.first_seq_, lease.ready_seq_);
      !st.is_ok()) {
    return st;
  }
  lease.waited_ok_ = true;
  return Status::ok();
}

Result<gpu::Event*> Store::lease_event(Lease& lease) {
  const double t0 = now_s();
  std::unique_lock lock(impl_->mu);
  Impl& m = *impl_;
  Block& b = m.blocks.at(lease.block_);
  m.cv.wait(lock, [&] {
    return b.done_seq >= lease.ready_seq_ || b.issued_seq >= lease.ready_seq_;
  });
  m.stats.tiers[ti(lease.tier_)].stall_s += now_s() - t0;
  if (Status st = Impl::lease_failure(b, lease.access_, lease.first_seq_, lease.ready_seq_);
      !st.is_ok()) {
    return st;
  }
  return b.ready_event.get();
}

void* Store::lease_data(const Lease& lease) const {
  std::lock_guard lock(impl_->mu);
  Block& b = impl_->blocks.at(lease.block_);
  return impl_->tier_ptr(b, lease.tier_);
}

// ---- Lease -------------------------------------------------------------------------------------

Lease::Lease(Lease&& other) noexcept { *this = std::move(other); }

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    store_ = std::exchange(other.store_, nullptr);
    block_ = other.block_;
    tier_ = other.tier_;
    access_ = other.access_;
    bytes_ = other.bytes_;
    ready_seq_ = other.ready_seq_;
    first_seq_ = other.first_seq_;
    waited_ok_ = other.waited_ok_;
  }
  return *this;
}

Status Lease::wait() {
  TZ_ASSERT(store_ != nullptr, "wait on an empty lease");
  return store_->wait_lease(*this);
}

Result<gpu::Event*> Lease::ready_event() {
  TZ_ASSERT(store_ != nullptr, "ready_event on an empty lease");
  TZ_ASSERT(tier_ == Tier::kDevice, "ready_event is for device pins");
  return store_->lease_event(*this);
}

void* Lease::data() const {
  TZ_ASSERT(store_ != nullptr, "data of an empty lease");
  TZ_ASSERT(tier_ != Tier::kNvme, "NVMe pins have no pointer");
  return store_->lease_data(*this);
}

void Lease::release(gpu::Stream* writer) {
  if (store_ == nullptr) return;
  store_->unpin(*this, writer);
  store_ = nullptr;
}

}  // namespace tz::store
