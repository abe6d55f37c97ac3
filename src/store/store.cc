// The public Store and Lease (store.h): argument checks, the pin/unpin/wait protocol, steps,
// drain and flush, and snapshots of the counters; the decisions they take are residency.cc's and
// policy.cc's, the moves they wait for the mover's (mover.cc). Threading and the deadlock
// argument: store_impl.h.
#include "store/store.h"

#include <algorithm>
#include <future>
#include <string>
#include <utility>

#include "core/assert.h"
#include "core/log.h"
#include "core/thread_name.h"
#include "store/pool_registration.h"
#include "store/store_impl.h"

namespace tz::store {

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
  impl->io_sched = IoScheduler(options.io_grouping, options.max_io_in_flight_bytes,
                               options.write_run_bytes);
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
  }
  // Each direction leaves a quarter of the buffers to the other; reads ahead stay below the read
  // direction's share (staging_accounting.h).
  impl->staging_acct = StagingAccounting(options.staging_buffers, options.read_ahead_buffers);
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
    set_thread_name("tz-mover");
    Status st;
    if (make_swap) {
      auto swap = make_swap();
      if (swap) {
        raw->swap = std::move(swap).value();
      } else {
        st = std::move(swap).take_status();
      }
    }
    if (st.is_ok() && raw->swap && !raw->options.checksums) {
      TZ_LOG_INFO("store: NVMe checksums off (tierzero.nvme_checksums false): pieces read back "
                  "from the swap space are not verified");
    }
    if (st.is_ok() && raw->swap && raw->options.register_pool_buffers) {
      Status reg = register_pool_with_queue(raw->swap->queue(), *raw->pool);
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
  impl_->device_frees.clear();
  impl_->erased_blocks.clear();
  impl_->dev_cache.clear();
  Status st = impl_->device->synchronize();
  if (!st.is_ok()) TZ_LOG_WARN("store: device synchronize at exit: %s", st.to_string().c_str());
  impl_->blocks.clear();
  impl_->staging.clear();
}

Result<BlockId> Store::create_block(std::uint64_t bytes, Tier home, std::string name) {
  if (bytes == 0) return Status::invalid_argument("store: block '" + name + "' has zero bytes");
  Impl& m = *impl_;
  // The block's events, made before the lock is taken (no device call under it) and destroyed
  // after it is let go if the block is not created.
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> ready_event, m.device->create_event());
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> user_event, m.device->create_event());
  std::lock_guard lock(m.mu);
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
  if (home == Tier::kNvme) {
    auto ext = m.swap->allocate(bytes);
    if (!ext) {
      Status st = std::move(ext).take_status().with_context("store: block '" + b.name + "'");
      m.blocks.erase(id);
      return st;
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
  m.refresh_candidate(b);
  b.ready_event = std::move(ready_event);
  b.user_event = std::move(user_event);
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
  m.refresh_candidate(*b);
  m.to_reap.push_back(id);
  m.wake();
  return Status::ok();
}

Result<Lease> Store::pin(BlockId id, Tier tier, Access access) {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  TZ_ASSIGN_OR_RETURN(Block* bp, m.find_for(id, "pin"));
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
  // The pin takes its trace position before placement (victims are chosen by the uses after
  // it); a pin that cannot be placed is undone: it is neither in the trace nor in the counters.
  const TraceIndex::PinMark mark =
      m.begin_pin(TraceEntry{id, tier, access}, tier != Tier::kNvme && !UntracedPins::active());
  Copy& c = b.copies[ti(tier)];
  const bool hit = c.present && (c.valid || access == Access::kWrite);
  const bool prefetch_hit = hit && c.by_prefetch;
  const std::uint64_t first_seq = b.next_seq;  // the first op this pin enqueues
  m.protect = id;
  Status placed = m.make_resident(b, tier);
  m.protect = 0;
  if (!placed.is_ok()) {
    m.undo_pin(mark);
    return placed;
  }
  TierStats& ts = m.stats.tiers[ti(tier)];
  ++(hit ? ts.hits : ts.misses);
  if (prefetch_hit) ++ts.prefetch_hits;
  c.by_prefetch = false;
  if (access != Access::kWrite && !c.valid) {
    auto src = m.load_source(b, tier);
    TZ_ASSERT(src.has_value(), "a block without a current copy");
    TZ_LOG_DEBUG("store: load '%s' %s -> %s on demand", b.name.c_str(), tier_name(*src),
                 tier_name(tier));
    m.push_copy(b, *src, tier, false);
    c.valid = true;
    c.loaded_from = *src;
  }
  bool sole_writer = false;
  if (access != Access::kRead) {
    sole_writer = std::all_of(b.write_leases.begin(), b.write_leases.end(),
                              [](int n) { return n == 0; });
    ++m.walk_epoch;
    for (std::size_t i = 0; i < kTierCount; ++i) b.copies[i].valid = false;
    c.valid = true;
    if (access == Access::kWrite) c.loaded_from = Tier::kNvme;  // nothing was loaded
    m.drop_stale_copies(b, tier);
    if (access == Access::kWrite) m.forget_overwritten_failures(b, first_seq);
    ++b.write_leases[ti(tier)];
    ++b.write_pins;
    b.host_sums.clear();
    if (tier == b.home) b.stats.home_write_bytes += b.bytes;
    // An untraced pin has no record position: the last recorded one is another pin's, whose
    // early write-back a spill of these bytes must not teach.
    b.dirtied_at =
        tier == Tier::kNvme || UntracedPins::active() ? kNoPos : m.trace.last_recorded();
  }
  ++b.leases[ti(tier)];
  ++b.total_leases;
  c.lru_tick = ++m.tick;
  m.refresh_candidate(b);
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
  lease.write_pins_ = b.write_pins;
  lease.sole_writer_ = sole_writer;
  b.marks.insert(Impl::lease_mark(access, first_seq, lease.ready_seq_));
  // An early write-back this pin waits for is no longer one that nobody waits for.
  for (Op& op : b.ops) {
    if (op.seq <= lease.ready_seq_) op.early = false;
  }
  m.prefetch_ahead();
  return lease;
}

namespace {
thread_local int untraced_depth = 0;
}  // namespace

UntracedPins::UntracedPins() { ++untraced_depth; }
UntracedPins::~UntracedPins() { --untraced_depth; }
bool UntracedPins::active() { return untraced_depth > 0; }

Status Store::prefetch(BlockId id, Tier tier) {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  TZ_ASSIGN_OR_RETURN(Block* b, m.find_for(id, "prefetch"));
  if (ti(tier) > ti(b->home)) {
    return Status::invalid_argument(std::string("store: cannot prefetch '") + b->name +
                                    "' below its home tier");
  }
  for (std::size_t i = 0; i < kTierCount; ++i) {
    if (b->write_leases[i] > 0) return Status::ok();  // the writer's copy is the current one
  }
  if (tier == b->home) return Status::ok();
  // Following the trace, copies it never uses again may go (a distance whose floor is kNever - 1
  // admits only kNever keys as victims); otherwise only free bytes.
  std::optional<std::uint64_t> dead_only;
  if (m.belady()) dead_only = kNever - 1 - m.trace.pos();
  (void)m.try_prefetch(*b, tier, dead_only);
  return Status::ok();
}

Status Store::keep(BlockId id, Tier tier) {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  TZ_ASSIGN_OR_RETURN(Block* b, m.find_for(id, "keep"));
  Copy& c = b->copies[ti(tier)];
  if (tier == b->home || !c.present || !c.valid) return Status::ok();
  c.by_prefetch = true;  // kept as a copy prefetch loaded is
  c.lru_tick = ++m.tick;
  m.refresh_candidate(*b);
  return Status::ok();
}

Status Store::write_back(BlockId id, Tier tier) {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  TZ_ASSIGN_OR_RETURN(Block* b, m.find_for(id, "write_back"));
  if (m.start_early_write(*b, tier)) {  // push_op wakes the mover
    TZ_LOG_DEBUG("store: early write-back of '%s' from %s, asked", b->name.c_str(),
                 tier_name(tier));
  }
  return Status::ok();
}

Status Store::zero(BlockId id) {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  TZ_ASSIGN_OR_RETURN(Block* bp, m.find_for(id, "zero"));
  Block& b = *bp;
  if (b.total_leases > 0) {
    return Status::invalid_argument("store: block '" + b.name + "' is pinned and cannot be zeroed");
  }
  // Each copy's zero op runs after the moves queued before it (a write-back in flight ends
  // first, then the extent is marked unwritten); a pin's load waits for the copy's zero op.
  std::uint64_t first_seq = 0;
  for (std::size_t i = 0; i < kTierCount; ++i) {
    Copy& c = b.copies[i];
    if (!c.present) continue;
    Op op;
    op.kind = OpKind::kZero;
    op.dst = static_cast<Tier>(i);
    const std::uint64_t seq = m.push_op(b, std::move(op));
    if (first_seq == 0) first_seq = seq;
    c.valid = true;
    c.loaded_from = Tier::kNvme;  // nothing was loaded
  }
  b.dirtied_at = kNoPos;
  m.forget_overwritten_failures(b, first_seq);
  m.refresh_candidate(b);
  return Status::ok();
}

void Store::mark_step() {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  ++m.stats.steps;
  // Under kTrace the step's record becomes the trace the next step follows; spills learned
  // while following the trace carry over (TraceIndex::end_step).
  const bool adopt = m.options.policy == Policy::kTrace;
  m.trace.end_step(adopt, [&m](BlockId id) {
    const Block* b = m.find(id);
    return b != nullptr && b->home == Tier::kNvme;
  });
  if (adopt) ++m.walk_epoch;
  m.rebuild_candidates();  // keys are positions in the new trace
  m.prefetch_ahead();
}

Status Store::drain() {
  std::unique_lock lock(impl_->mu);
  impl_->wake();
  impl_->cv.wait(lock, [&] { return impl_->idle(); });
  return Status::ok();
}

// An early write-back in flight makes its copy look clean, so flush writes nothing for it; if it
// then fails with the copy intact (settle_early_write) the copy is dirty again, and flush goes
// round once more. The rounds' own writes are not early ones: their failures are reported.
Status Store::flush() {
  std::unique_lock lock(impl_->mu);
  for (;;) {
    const std::uint64_t early_failed = impl_->stats.early_writes_failed;
    Status st = impl_->flush_round(lock);
    if (!st.is_ok() || impl_->stats.early_writes_failed == early_failed) return st;
  }
}

// One round of flush: writes every dirty copy home and waits until the store is idle.
Status Store::Impl::flush_round(std::unique_lock<std::mutex>& lock) {
  Impl& m = *this;
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
      b.marks.insert(writes.back().second);  // keep its failure until flush has looked
      b.copies[ti(b.home)].valid = true;
      b.dirtied_at = kNoPos;  // home by flush, not by eviction: nothing for the policy to learn
      ++m.stats.tiers[ti(t)].write_backs;
    }
  }
  m.wake();
  m.cv.wait(lock, [&] { return m.idle(); });
  Status failed;
  for (const auto& [id, seq] : writes) {
    Block* b = m.find(id);
    if (b == nullptr) continue;  // destroyed by another thread meanwhile: nothing to keep
    b->marks.erase(b->marks.find(seq));
    for (const Failure& f : b->failures) {
      if (failed.is_ok() && f.first_seq <= seq && seq <= f.last_seq) {
        failed = Status(f.status).with_context("store: flush");
      }
    }
  }
  if (!failed.is_ok()) return failed;
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
  for (auto& [id, b] : m.blocks) b.stats = BlockStats{};
}

Result<BlockStats> Store::block_stats(BlockId id) const {
  std::lock_guard lock(impl_->mu);
  const Block* b = impl_->find(id);
  if (b == nullptr) {
    return Status::invalid_argument("store: statistics of unknown block " + std::to_string(id));
  }
  return b->stats;
}

std::uint64_t Store::used_bytes(Tier tier) const {
  std::lock_guard lock(impl_->mu);
  return impl_->logical_used[ti(tier)];
}

std::uint64_t Store::budget_bytes(Tier tier) const {
  std::lock_guard lock(impl_->mu);
  return impl_->budget[ti(tier)];
}

Status Store::check_invariants() const {
  std::lock_guard lock(impl_->mu);
  return impl_->check_invariants();
}

bool Store::following_trace() const {
  std::lock_guard lock(impl_->mu);
  return impl_->trace.following();
}

void Store::unpin(Lease& lease, gpu::Stream* writer, std::span<const std::uint64_t> sums) {
  Impl& m = *impl_;
  // The writer's event is recorded before the release is (no device call under the lock): the
  // lease still holds the copy, so no free of it or copy into it starts meanwhile. When it cannot
  // be recorded the host waits for the writer's work instead (its callbacks never take the lock);
  // if even that fails the bytes are unknown.
  bool recorded = false;
  Status writer_failed;
  if (writer != nullptr) {
    gpu::Event* event;
    {
      std::lock_guard lock(m.mu);
      event = m.blocks.at(lease.block_).user_event.get();
    }
    Status st = event->record(*writer);
    recorded = st.is_ok();
    if (!recorded) {
      TZ_LOG_WARN("store: release of block %u: %s; waiting for the stream", lease.block_,
                  st.to_string().c_str());
      writer_failed = writer->synchronize();
    }
  }
  std::lock_guard lock(m.mu);
  auto it = m.blocks.find(lease.block_);
  TZ_ASSERT(it != m.blocks.end(), "lease of an unknown block");
  Block& b = it->second;
  const std::size_t t = ti(lease.tier_);
  TZ_ASSERT(b.leases[t] > 0 && b.total_leases > 0);
  if (!sums.empty() && lease.tier_ == Tier::kHost && lease.access_ != Access::kRead &&
      m.options.checksums && lease.sole_writer_ && b.write_pins == lease.write_pins_ &&
      sums.size() == b.chunk_count(m.options.chunk_bytes)) {
    b.host_sums.assign(sums.begin(), sums.end());
  }
  --b.leases[t];
  --b.total_leases;
  if (lease.access_ != Access::kRead) {
    --b.write_leases[t];
    ++m.walk_epoch;  // the block is a prefetch candidate again
  }
  b.marks.erase(b.marks.find(Impl::lease_mark(lease.access_, lease.first_seq_, lease.ready_seq_)));
  b.copies[t].lru_tick = ++m.tick;
  m.refresh_candidate(b);
  if (recorded) b.user_event_recorded = true;
  if (!writer_failed.is_ok()) {
    b.error = std::move(writer_failed).with_context("store: block '" + b.name +
                                                    "': its writer's stream failed");
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
  m.cv.wait(lock,
            [&] { return b.done_seq >= lease.ready_seq_ || b.issued_seq >= lease.ready_seq_; });
  m.stats.tiers[ti(lease.tier_)].stall_s += now_s() - t0;
  if (Status st = Impl::lease_failure(b, lease.access_, lease.first_seq_, lease.ready_seq_);
      !st.is_ok()) {
    return st;
  }
  return b.ready_event.get();
}

std::uint64_t Store::hashed_piece_bytes(BlockId id) const {
  std::lock_guard lock(impl_->mu);
  const Block* b = impl_->find(id);
  if (b == nullptr || b->home != Tier::kNvme || !impl_->options.checksums) return 0;
  return impl_->options.chunk_bytes;
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
    write_pins_ = other.write_pins_;
    sole_writer_ = other.sole_writer_;
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

void Lease::release_hashed(std::span<const std::uint64_t> piece_sums) {
  if (store_ == nullptr) return;
  store_->unpin(*this, nullptr, piece_sums);
  store_ = nullptr;
}

}  // namespace tz::store
