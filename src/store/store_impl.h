// Store::Impl: the state behind the public Store, shared by the files that implement it along
// its seams: residency.cc (copies, budgets, evictions, demand loads), policy.cc (Belady, LRU,
// read ahead, the prefetch walk), mover.cc (the mover thread: physical operations, staging),
// stats.cc (counters) and store.cc (the public API). Included only by them. It keeps the blocks
// and the move state machine; the trace index, the victim index, the I/O scheduler and the
// staging accounting are classes of their own (docs/store.md, "Code map").
//
// Threading: the logical layer (residency, budgets, pins, policy) runs in the caller's thread
// under `mu` and turns decisions into per-block chains of physical operations (allocate, copy,
// zero, free); the mover thread runs the head of every chain, drives the swap space's IoQueue and
// starts copies on the device's streams, whose host callbacks report back.
//
// The contract between the store's lock and the device (kept by every file here, checked by
// StoreDefects.NoDeviceCallWhileTheStoreHoldsItsLock):
//   - No device call is made while `mu` is held: a call can block (an enqueue on a full stream,
//     cudaMalloc's implicit synchronization, a synchronize after a failure) and every caller's
//     pin would wait behind it. The mover decides device work under `mu` as DeviceCalls, issues
//     them after letting go of `mu`, and applies their results when it takes `mu` again; device
//     buffers and events it drops are destroyed outside `mu` too. Callers record their writer's
//     event (Lease::release) and create a block's events outside `mu`.
//   - Device callbacks never take `mu`: they post to the mover's mailbox (wake_mu, held briefly).
//
// Why no deadlock: an operation waits only for operations decided before it (the earlier ops of
// its chain, allocations ahead of it in its tier's FIFO, frees decided before it that free the
// physical space the decision counted on, and the extent writes of an ended write-back). Copies
// need only staging buffers, which copies return by themselves, so everything decided earlier
// finishes. A read ahead (kStage) holds at most ahead_cap buffers, fewer than the read direction
// may take, so decided reads always get one; nothing waits for a read ahead (a move queued behind
// it stops it starting more pieces), and the pieces it leaves go to a load that needs no other
// buffer for them.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "store/io_scheduler.h"
#include "store/store.h"
#include "store/staging_accounting.h"
#include "store/store_internal.h"
#include "store/trace_index.h"
#include "store/victim_index.h"

namespace tz::store {

struct Store::Impl {
  StoreOptions options;
  gpu::Device* device = nullptr;
  PinnedPool* pool = nullptr;
  std::unique_ptr<nvme::SwapSpace> swap;

  mutable std::mutex mu;
  std::condition_variable cv;        // leases and drain wait here
  // The mover's mailbox, apart from `mu` so that device callbacks never take `mu` (a stream's
  // worker runs them; a caller blocked on `mu` must never hold it up). Lock order: mu, then
  // wake_mu; never the reverse.
  mutable std::mutex wake_mu;
  std::condition_variable mover_cv;    // the mover waits here, on wake_mu
  std::uint64_t events = 0;            // guarded by wake_mu: bumped on anything for the mover
  std::vector<DeviceDone> device_done;  // guarded by wake_mu: completions from callbacks
  bool stopping = false;

  std::map<BlockId, Block> blocks;  // ordered: deterministic iteration
  BlockId next_id = 1;
  std::array<std::uint64_t, kTierCount> logical_used{};
  std::array<std::uint64_t, kTierCount> budget{};
  std::array<std::uint64_t, kTierCount> phys_used{};
  std::array<std::uint64_t, kTierCount> pending_frees{};
  std::array<std::deque<std::pair<BlockId, std::uint64_t>>, kTierCount> alloc_fifo;
  std::uint64_t tick = 0;
  // Blocks with a non-empty chain (the mover's work list, so a pass costs the busy blocks, not
  // all of them), and destroyed blocks to erase once their chains drain.
  std::set<BlockId> busy;
  // Per tier, the copies that may be evicted (present, not home, no lease, block not destroyed),
  // by eviction key (candidate_key; victim_index.h). Kept current by refresh_candidate at every
  // change of a block's presence, leases or key, and rebuilt when the policy's keys change
  // meaning (a new trace, a deviation); check_invariants recomputes it.
  VictimIndex candidates;
  std::vector<BlockId> to_reap;
  // Bumped on every change the prefetch walk depends on (a decision pushed, a write pin or its
  // release, an error, a new trace); walk_idle_at: the epoch at which a full walk found nothing
  // to start, so that the next pins skip the walk until something changes.
  std::uint64_t walk_epoch = 1;
  std::uint64_t walk_idle_at = 0;
  std::uint64_t decisions = 0;  // ops pushed so far (Op::decided)
  BlockId protect = 0;          // the block being pinned: never a victim while its pin is placed

  // Device buffers of evicted copies, kept for the next allocation of the same size (counted in
  // phys_used): device memory that is mapped and touched once, not per load (on HostDevice a fresh
  // buffer costs a page fault per 4 KiB on first use).
  std::multimap<std::uint64_t, gpu::DeviceBuffer> dev_cache;
  std::uint64_t dev_cache_bytes = 0;

  // Device work decided in the mover's pass, issued once it lets go of `mu`; device buffers given
  // back and erased blocks (whose events go with them), destroyed outside `mu` (mover only).
  std::vector<DeviceCall> device_calls;
  std::vector<gpu::DeviceBuffer> device_frees;
  std::vector<std::map<BlockId, Block>::node_type> erased_blocks;

  // Staging buffers of the NVMe <-> device pipeline, and the streams its pieces are copied on: not
  // the device's h2d/d2h streams, where a whole-block copy would hold up every piece behind it
  // (and with them the staging buffers the disk needs).
  std::vector<PinnedBuffer> staging;
  std::unique_ptr<gpu::Stream> piece_h2d;
  std::unique_ptr<gpu::Stream> piece_d2h;
  // Which staging buffers are free, held per direction and by reads ahead, and the pieces the
  // policy reserved for reads ahead (staging_accounting.h).
  StagingAccounting staging_acct;

  // I/O scheduling (mover only, under mu): the queued NVMe piece jobs and those in flight.
  IoScheduler io_sched;

  // Policy: the recorded and followed traces, the next-use index, the spills (trace_index.h).
  TraceIndex trace;

  // Statistics.
  StoreStats stats;
  std::array<int, kLinkCount> link_active{};
  std::array<double, kLinkCount> link_busy_since{};

  std::thread mover;

  // ---- store.cc ----
  // One round of Store::flush, under `mu` (`lock`, released while it waits for the mover).
  Status flush_round(std::unique_lock<std::mutex>& lock);

  // ---- residency.cc (residency and budgets: copies, evictions, admission, demand loads) ----
  Block* find(BlockId id);
  // find(), or kInvalidArgument naming the call ("store: <what> of unknown block N").
  Result<Block*> find_for(BlockId id, const char* what);
  void wake();
  std::uint64_t push_op(Block& b, Op op);
  void push_alloc(Block& b, Tier t);
  void push_free(Block& b, Tier t);
  std::uint64_t push_copy(Block& b, Tier src, Tier dst, bool prefetch);
  bool host_keeps(const Block& x, std::uint64_t nu) const;
  bool admit_to_host(Block& b);
  static std::uint64_t lease_mark(Access access, std::uint64_t first_seq, std::uint64_t ready_seq);
  bool only_valid(const Block& b, Tier t) const;
  Status check_invariants() const;
  Status check_alloc_fifo(Tier t) const;
  Status check_staging() const;
  void write_back_early(Block& b, Tier t);
  // Starts writing b's only current bytes in `t` home as an early write-back (write_back_early,
  // Store::write_back), keeping the copy there clean. False when there is nothing to write.
  bool start_early_write(Block& b, Tier t);
  void evict(Block& b, Tier t);
  std::optional<Tier> load_source(const Block& b, Tier t) const;
  std::string pinned_summary(Tier t) const;
  Status make_resident(Block& b, Tier t);
  // headroom: bytes of `t` to keep free besides b's (see prefetch_ahead).
  bool try_prefetch(Block& b, Tier t, std::optional<std::uint64_t> distance,
                    std::uint64_t headroom = 0);
  void drop_stale_copies(Block& b, Tier written);
  // The block's bytes are overwritten from op `first_seq` on (a kWrite pin, Store::zero): its
  // poison goes, and failures before that op matter only to live leases (their marks).
  void forget_overwritten_failures(Block& b, std::uint64_t first_seq);
  static Status lease_failure(const Block& b, Access access, std::uint64_t first_seq,
                              std::uint64_t ready_seq);

  // ---- policy.cc (the trace, Belady and LRU victims, the prefetch walk) ----
  std::uint64_t next_use(const Block& b, Tier t) const;
  bool belady() const;
  std::uint64_t candidate_key(const Block& b, Tier t) const;
  void refresh_candidate(Block& b);
  void rebuild_candidates();
  std::optional<std::vector<BlockId>> choose_victims(Tier t, std::uint64_t need, BlockId for_block,
                                                     std::optional<std::uint64_t> beyond,
                                                     bool allocated_only = false);
  bool make_host_room(Block& b);
  bool free_can_complete(Tier t) const;
  bool try_stage(Block& b, std::uint64_t distance);
  void prefetch_ahead();
  // A pin's trace position, taken before its placement (TraceIndex::begin_pin); when the pin
  // leaves the trace the victim keys turn into recency and reads ahead are dropped. undo_pin
  // rolls it back when placement fails (the deviation is taken back, the keys rebuilt).
  TraceIndex::PinMark begin_pin(const TraceEntry& e, bool noted);
  void undo_pin(const TraceIndex::PinMark& mark);

  // ---- mover.cc (physical operations: allocations, copies, the staging pipeline, I/O scheduling)
  // ----
  void fail_op(Block& b, Op& op, Status st);
  void record_failure(Block& b, std::uint64_t first_seq, const Status& st);
  void count_error(const Status& st);  // in checksum_failures or io_errors
  void settle_early_write(Block& b, std::uint64_t seq, const Status& st);
  void* tier_ptr(Block& b, Tier t);
  void free_physical(Block& b, Tier t);
  DeviceCall& push_device_call(DeviceCall::Kind kind, Block& b, const Op& op, gpu::Stream& stream,
                               std::uint32_t chunk = 0, int staging_index = -1);
  void push_whole(Block& b, Op& op, gpu::Stream& stream, std::function<Status()> work,
                  bool ready);
  std::function<Status()> zero_work(Block& b);
  std::function<Status()> copy_work(void* dst, const void* src, std::uint64_t bytes,
                                    gpu::CopyKind kind, gpu::Stream& stream);
  void issue_device_call(DeviceCall& c);  // without `mu`
  void finish_device_calls(std::vector<DeviceCall>& calls);
  bool start_op(Block& b, Op& op);
  bool start_alloc(Block& b, Op& op);
  bool start_device_alloc(Block& b, Op& op);
  bool start_host_alloc(Block& b, Op& op);
  bool start_free(Block& b, Op& op);
  bool start_stage(Block& b, Op& op);
  bool start_zero(Block& b, Op& op);
  bool start_copy(Block& b, Op& op);
  bool pump_chunks(Block& b, Op& op);
  void copy_piece_to_device(Block& b, Op& op, std::uint32_t chunk, int staging_index);
  void unreserve_staged(Block& b, std::uint32_t pieces);
  void drop_staged(Block& b);
  void drop_all_staged();
  bool finish_stage_if_done(Block& b, Op& op);
  void queue_job(IoJob job);
  void piece_done(Op& op, int staging_index);
  bool finish_copy_if_done(Block& b, Op& op);
  static bool touches_extent(const Op& op);
  void finish_extent_write(Block& b, IoJob& job);
  bool finish_op(Block& b);
  bool advance(Block& b);
  Op* find_op(Block& b, std::uint64_t seq);
  void apply_device_done(const DeviceDone& d);
  Status checksum_mismatch(const Block& b, std::uint32_t chunk) const;
  // A piece's checksum: XXH3-64 of its bytes, or 0 with checksums off (StoreOptions::checksums),
  // so that every sum is 0 then and each comparison of a read with its write holds.
  std::uint64_t piece_sum(const void* data, std::size_t bytes) const;
  void apply_io_done(IoJob& job);
  bool deferrable(const Block& b) const;
  std::vector<IoJob> pick_jobs();
  bool idle() const;
  void reap_destroyed();
  // The mover's pass, in named steps (mover_loop).
  using InFlight = std::unordered_map<nvme::IoOpId, IoJob>;
  bool apply_device_completions(std::uint64_t& seen);
  bool run_chains();
  void issue_device_work(std::vector<DeviceCall>& calls);                          // without `mu`
  std::vector<IoJob> run_io(std::vector<IoJob>& jobs, InFlight& in_flight,
                            nvme::IoQueue* io);                                     // without `mu`
  void wait_for_events(std::uint64_t seen, bool polling);                           // without `mu`
  void mover_loop();

  // ---- stats.cc (statistics) ----
  void update_used(Tier t);
  void count_move(Block& b, Tier src, Tier dst);
  void link_start(Link l);
  void link_end(Link l);
};

}  // namespace tz::store
