// The mover: the one thread that runs the heads of the blocks' operation chains (allocations in
// FIFO order per tier, copies, zero fills, frees), the NVMe <-> device staging pipeline, the I/O
// scheduling (in-flight bound, mixed or grouped directions) and the device completions reported
// by stream callbacks. It is the only thread that drives the swap space's IoQueue.
#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "core/trace.h"
#include "core/xxhash_dispatch.h"
#include "store/store_impl.h"

namespace tz::store {

void Store::Impl::fail_op(Block& b, Op& op, Status st) {
  if (op.failed) return;
  op.failed = true;
  op.status = st;
  if (op.ahead) {
    settle_early_write(b, op.seq, st);  // the copy it writes from may still hold the bytes
    return;
  }
  record_failure(b, op.seq, st);
}

// A move of b from op first_seq on failed: the block's bytes are lost until a write pin, every
// op enqueued now is skipped, and the leases that depend on them get `st`. The failures stay
// disjoint and ordered: an ended write-back's disk write (finish_extent_write) can fail after an
// op behind it has failed already, or before one that is still running fails.
void Store::Impl::record_failure(Block& b, std::uint64_t first_seq, const Status& st) {
  b.error = st;
  b.skip_until = b.next_seq - 1;
  ++walk_epoch;
  const std::uint64_t first =
      b.failures.empty() ? first_seq : std::max(first_seq, b.failures.back().last_seq + 1);
  if (first <= b.next_seq - 1) b.failures.push_back(Failure{first, b.next_seq - 1, st});
  count_error(st);
  TZ_LOG_DEBUG("store: %s", st.to_string().c_str());
}

void Store::Impl::count_error(const Status& st) {
  if (st.code() == ErrorCode::kCorrupt) {
    ++stats.checksum_failures;
  } else {
    ++stats.io_errors;
  }
}

// An early write-back (Op::ahead) of op `seq` failed, settled at its first failed piece so that
// the moves decided from then on see where the bytes are. They are lost only if something needs
// them from the extent: a pin of the home copy, or the first op queued after the write that
// touches the extent (a read ahead aside, which only serves a load from the extent) reads it (a
// load that had to come from home), or no such op is queued and no upper copy holds the bytes any
// more (an eviction took the write for the copy's way home). Otherwise nothing is lost and the
// error is only counted: the queued op writes the extent anew, or the extent is stale again and
// the current upper copy dirty, so that its eviction or a flush writes it.
void Store::Impl::settle_early_write(Block& b, std::uint64_t seq, const Status& st) {
  const Op* next = nullptr;
  for (const Op& o : b.ops) {
    if (o.seq > seq && o.kind != OpKind::kStage && touches_extent(o)) {
      next = &o;
      break;
    }
  }
  bool needed = b.leases[ti(Tier::kNvme)] > 0;
  if (next != nullptr) {
    needed |= next->kind == OpKind::kCopy && next->src == Tier::kNvme;
  } else {
    bool upper_current = false;
    for (Tier t : {Tier::kDevice, Tier::kHost}) {
      upper_current |= b.copies[ti(t)].present && b.copies[ti(t)].valid;
    }
    needed |= !upper_current;
  }
  if (needed || !b.error.is_ok()) {
    record_failure(b, seq, st);
    return;
  }
  if (next == nullptr) b.copies[ti(Tier::kNvme)].valid = false;
  ++walk_epoch;
  ++stats.early_writes_failed;
  count_error(st);
  TZ_LOG_DEBUG("store: early write-back of '%s' failed, nothing lost: %s", b.name.c_str(),
               st.to_string().c_str());
}

void* Store::Impl::tier_ptr(Block& b, Tier t) {
  if (t == Tier::kDevice) return b.dev.data();
  if (t == Tier::kHost) return b.host.data();
  return nullptr;
}

void Store::Impl::free_physical(Block& b, Tier t) {
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
    drop_staged(b);
    swap->free(b.extent);
    b.has_extent = false;
    b.nvme_written = false;
  }
  phys_used[ti(t)] -= b.bytes;
  --pending_frees[ti(t)];
  update_used(t);
}

// Whether some free of a copy in `t` can run without an allocation in `t` that has not started
// (the FIFO's head waits for the frees; a free queued behind an allocation, its own chain's or
// one after the head in the FIFO, would never come).
bool Store::Impl::free_can_complete(Tier t) const {
  if (pending_frees[ti(t)] == 0) return false;
  for (BlockId id : busy) {
    const Block& b = blocks.at(id);
    for (const Op& o : b.ops) {
      if (o.kind == OpKind::kAlloc && o.dst == t && !o.started) break;
      if (o.kind == OpKind::kFree && o.dst == t) return true;
    }
  }
  return false;
}

// `b`, at the head of the host FIFO, cannot be allocated and no free that could run is pending:
// the tier is physically full of copies whose frees wait behind later allocations, or no piece of
// the pinned pool fits (blocks of several sizes come and go in one slab). Evict copies worth at
// least b's bytes beyond what the budget needs, in the policy's order, so that their frees make
// room. Only copies already allocated: the free of one still queued for its allocation behind b
// in the FIFO would never come. Returns false when nothing can be evicted (b's load fails).
bool Store::Impl::make_host_room(Block& b) {
  const Tier t = Tier::kHost;
  const std::uint64_t room =
      budget[ti(t)] > logical_used[ti(t)] ? budget[ti(t)] - logical_used[ti(t)] : 0;
  auto victims = choose_victims(t, room + b.bytes, b.id, std::nullopt, /*allocated_only=*/true);
  if (!victims) victims = choose_victims(t, room + 1, b.id, std::nullopt, /*allocated_only=*/true);
  if (!victims || victims->empty()) return false;
  TZ_LOG_DEBUG("store: no room for '%s' in the host tier's pinned pool: evicting %zu copies",
               b.name.c_str(), victims->size());
  for (BlockId v : *victims) evict(*find(v), t);
  ++stats.tiers[ti(t)].fragmentation_evictions;
  return true;
}

// Whether op reads, writes or frees the block's NVMe extent (it waits for writes in flight to
// it that no op holds any more: Block::extent_writes).
bool Store::Impl::touches_extent(const Op& op) {
  switch (op.kind) {
    case OpKind::kCopy: return op.src == Tier::kNvme || op.dst == Tier::kNvme;
    case OpKind::kStage: return true;
    case OpKind::kZero:
    case OpKind::kFree: return op.dst == Tier::kNvme;
    case OpKind::kAlloc: return false;
  }
  return true;
}

// Tries to start op (the head of b's chain). Returns true if it made progress.
bool Store::Impl::start_op(Block& b, Op& op) {
  TZ_ASSERT(!b.ops.empty() && &b.ops.front() == &op, "start_op: not the head of the chain");
  if (b.extent_writes > 0 && !op.started && touches_extent(op)) return false;
  switch (op.kind) {
    case OpKind::kAlloc: return start_alloc(b, op);
    case OpKind::kFree: return start_free(b, op);
    case OpKind::kStage: return start_stage(b, op);
    case OpKind::kZero:
    case OpKind::kCopy: break;
  }
  if (op.seq <= b.skip_until && !op.started) {
    op.started = true;
    op.failed = true;
    op.status = b.error.is_ok() ? Status::internal("skipped") : b.error;
    return finish_op(b);
  }
  if (op.kind == OpKind::kZero) return start_zero(b, op);
  return start_copy(b, op);
}

// An allocation runs at the head of its tier's FIFO (decision order).
bool Store::Impl::start_alloc(Block& b, Op& op) {
  auto& fifo = alloc_fifo[ti(op.dst)];
  TZ_ASSERT(!fifo.empty(), "an allocation op outside its tier's FIFO");
  if (fifo.front() != std::make_pair(b.id, op.seq)) return false;
  if (op.dst == Tier::kDevice) return start_device_alloc(b, op);
  TZ_ASSERT(op.dst == Tier::kHost, "NVMe extents are allocated at create");
  return start_host_alloc(b, op);
}

// A device buffer: one of the same size kept from an evicted copy, else a new one once the
// physical use (cached buffers given back first) leaves room; the allocation itself runs outside
// `mu` (finish_device_calls).
bool Store::Impl::start_device_alloc(Block& b, Op& op) {
  const Tier t = Tier::kDevice;
  auto& fifo = alloc_fifo[ti(t)];
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
    device_frees.push_back(std::move(last->second));  // freed outside `mu`
    dev_cache.erase(last);
    update_used(t);
  }
  if (phys_used[ti(t)] + b.bytes > budget[ti(t)]) return false;
  // Counted now; the buffer comes from the allocation outside `mu` (finish_device_calls).
  fifo.pop_front();
  op.started = true;
  op.device_pending = true;
  phys_used[ti(t)] += b.bytes;
  update_used(t);
  push_device_call(DeviceCall::Kind::kAllocate, b, op, device->h2d_stream()).bytes = b.bytes;
  return true;
}

// A pinned host buffer from the pool, within the host budget's physical use.
bool Store::Impl::start_host_alloc(Block& b, Op& op) {
  const Tier t = Tier::kHost;
  Status st;
  if (phys_used[ti(t)] + b.bytes > budget[ti(t)]) {
    st = Status::out_of_memory("store: the host tier's budget is used by copies not yet "
                               "freed and nothing more can be evicted");
  } else if (auto buf = pool->allocate(b.bytes)) {
    b.host = std::move(buf).value();
  } else {
    st = std::move(buf).take_status().with_context("store: pinned pool");
  }
  // No room (copies evicted, frees pending) or no piece of the pool fits: wait for a free
  // that can run, else evict more and retry after those frees, else fail the load.
  if (!st.is_ok() && (free_can_complete(t) || make_host_room(b))) return false;
  alloc_fifo[ti(t)].pop_front();
  op.started = true;
  if (st.is_ok()) {
    phys_used[ti(t)] += b.bytes;
    update_used(t);
  } else {
    // The copy is unusable: later reads of the block report this.
    fail_op(b, op,
            std::move(st).with_context("store: allocating '" + b.name + "' in the " +
                                       tier_name(t) + " tier"));
    op.failed = false;            // the allocation op itself is over
    phys_used[ti(t)] += b.bytes;  // balanced by the free that follows (logically present)
  }
  return finish_op(b);
}

bool Store::Impl::start_free(Block& b, Op& op) {
  if (op.dst == Tier::kDevice && b.user_event_recorded && !op.started) {
    // Free only after the caller's device work on the copy: order a callback after it.
    op.started = true;
    op.device_pending = true;
    push_device_call(DeviceCall::Kind::kFree, b, op, device->d2h_stream());
    return true;
  }
  if (op.device_pending) return false;
  op.started = true;
  free_physical(b, op.dst);
  return finish_op(b);
}

bool Store::Impl::start_stage(Block& b, Op& op) {
  if (!op.started) {
    op.started = true;
    // Nothing to read ahead: a never-written extent (its load is a zero fill), lost bytes, or
    // a move already queued behind (it reads the block itself, as quickly).
    if (!b.nvme_written || op.seq <= b.skip_until || !b.error.is_ok() || b.ops.size() > 1) {
      unreserve_staged(b, op.chunks);
      op.chunks = 0;
    } else {
      b.staged.resize(b.chunk_count(options.chunk_bytes), -1);
      op.start_us = Trace::global().now_us();
    }
  }
  return pump_chunks(b, op);
}

bool Store::Impl::start_zero(Block& b, Op& op) {
  op.started = true;
  if (op.dst == Tier::kDevice) {
    push_whole(b, op, device->h2d_stream(), zero_work(b), true);
    return true;
  }
  if (op.dst == Tier::kHost) std::memset(b.host.data(), 0, b.bytes);
  if (op.dst == Tier::kNvme) {
    drop_staged(b);
    b.nvme_written = false;
  }
  return finish_op(b);
}

bool Store::Impl::start_copy(Block& b, Op& op) {
  if (!op.started) {
    op.started = true;
    op.start_us = Trace::global().now_us();
    op.start_s = now_s();
    link_start(link_of(op.src, op.dst));
    const bool dev_dst = op.dst == Tier::kDevice;
    if (tier_ptr(b, op.src) == nullptr && op.src != Tier::kNvme) {
      fail_op(b, op,
              Status::internal("store: '" + b.name + "' has no " + tier_name(op.src) +
                               " copy to read"));
      return finish_copy_if_done(b, op);
    }
    if (op.src == Tier::kNvme && !b.nvme_written) {
      // Never written: the block reads as zeros.
      op.zero_fill = true;
      if (dev_dst) {
        push_whole(b, op, device->h2d_stream(), zero_work(b), true);
        return true;
      }
      std::memset(b.host.data(), 0, b.bytes);
      return finish_copy_if_done(b, op);
    }
    if (op.src != Tier::kNvme || op.dst != Tier::kDevice) {
      // A write to the extent makes the pieces read ahead stale; any other copy means the
      // block's next upper copy comes from elsewhere, and they serve nobody now.
      drop_staged(b);
    }
    if (op.src != Tier::kNvme && op.dst != Tier::kNvme) {
      // Host <-> device: one copy on the direction's stream.
      gpu::Stream& s = dev_dst ? device->h2d_stream() : device->d2h_stream();
      push_whole(b, op, s,
                 copy_work(tier_ptr(b, op.dst), tier_ptr(b, op.src), b.bytes,
                           dev_dst ? gpu::CopyKind::kHostToDevice : gpu::CopyKind::kDeviceToHost,
                           s),
                 dev_dst);
      return true;
    }
    op.chunks = b.chunk_count(options.chunk_bytes);
    if (op.dst == Tier::kNvme) b.nvme_written = false;  // until every piece has landed
  }
  return pump_chunks(b, op);
}

// Starts the pieces of an NVMe copy (or of a read ahead) that may start now.
bool Store::Impl::pump_chunks(Block& b, Op& op) {
  bool progress = false;
  const bool stage = op.kind == OpKind::kStage;
  const bool via_staging = stage || op.src == Tier::kDevice || op.dst == Tier::kDevice;
  while (!op.failed && op.next_chunk < op.chunks) {
    const std::uint32_t k = op.next_chunk;
    const std::uint64_t off = static_cast<std::uint64_t>(k) * options.chunk_bytes;
    const std::uint64_t len = b.piece_bytes(k, options.chunk_bytes);
    if (stage && b.ops.size() > 1) {
      // A move was queued behind the read ahead: it reads the rest itself, so that it waits
      // only for the pieces in flight.
      unreserve_staged(b, op.chunks - k);
      op.chunks = k;
      break;
    }
    if (!stage && op.dst == Tier::kDevice && op.src == Tier::kNvme && k < b.staged.size() &&
        b.staged[k] >= 0) {
      // Read ahead: copied on at once (its buffer is already counted as a read's).
      const int s = b.staged[k];
      b.staged[k] = -1;
      staging_acct.hand_over_ahead();
      unreserve_staged(b, 1);
      ++op.next_chunk;
      ++op.outstanding;
      progress = true;
      copy_piece_to_device(b, op, k, s);
      continue;
    }
    int s = -1;
    if (via_staging) {
      const std::size_t dir =
          op.src == Tier::kDevice ? StagingAccounting::kWrite : StagingAccounting::kRead;
      s = staging_acct.take(dir, stage);
      if (s < 0) break;
    }
    ++op.next_chunk;
    ++op.outstanding;
    progress = true;
    if (op.src == Tier::kDevice) {
      // Device -> staging first; the write starts when the copy is done.
      push_device_call(DeviceCall::Kind::kPiece, b, op, *piece_d2h, k, s).work =
          copy_work(staging[static_cast<std::size_t>(s)].data(),
                    static_cast<std::byte*>(b.dev.data()) + off, len, gpu::CopyKind::kDeviceToHost,
                    *piece_d2h);
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
    if (job.dir == nvme::IoOp::kWrite && s < 0 && !op.sums.empty()) {
      // The host copy's writer hashed these bytes (Lease::release_hashed): no hash here.
      TZ_ASSERT(op.sums.size() == op.chunks, "handed-in sums of another piece count");
      job.sum = op.sums[k];
      job.sum_known = true;
    }
    job.transfers = swap->transfers(job.dir, b.extent, off, buf, job.io_bytes);
    queue_job(std::move(job));
  }
  if (stage) progress |= finish_stage_if_done(b, op);
  return progress;
}

// Piece k of an NVMe -> device copy, read into staging buffer s, copied on to the device while
// the mover hashes the buffer (DeviceCall::check_data); the piece finishes when the copy does.
void Store::Impl::copy_piece_to_device(Block& b, Op& op, std::uint32_t chunk, int staging_index) {
  const std::uint64_t off = static_cast<std::uint64_t>(chunk) * options.chunk_bytes;
  const std::uint64_t len = b.piece_bytes(chunk, options.chunk_bytes);
  const std::byte* buf = staging[static_cast<std::size_t>(staging_index)].data();
  DeviceCall& c =
      push_device_call(DeviceCall::Kind::kPiece, b, op, *piece_h2d, chunk, staging_index);
  c.work = copy_work(static_cast<std::byte*>(b.dev.data()) + off, buf, len,
                     gpu::CopyKind::kHostToDevice, *piece_h2d);
  c.check_data = buf;
  c.check_len = len;
  c.check_sum = b.sums[chunk];
  if (++op.copies_enqueued == op.chunks) c.ready = b.ready_event.get();
}

void Store::Impl::unreserve_staged(Block& b, std::uint32_t pieces) {
  if (staging_acct.unreserve(b.id, pieces) == 0) b.staged.clear();
}

// Gives back the staging buffers of b's pieces read ahead and not taken (pieces still being
// read stay with their stage op).
void Store::Impl::drop_staged(Block& b) {
  std::uint32_t dropped = 0;
  for (std::size_t k = 0; k < b.staged.size(); ++k) {
    if (b.staged[k] < 0) continue;
    staging_acct.give_back(b.staged[k], StagingAccounting::kRead, true);
    b.staged[k] = -1;
    ++dropped;
    stats.read_ahead_dropped_bytes +=
        b.piece_bytes(static_cast<std::uint32_t>(k), options.chunk_bytes);
  }
  if (dropped == 0) return;
  TZ_LOG_DEBUG("store: dropping %u pieces of '%s' read ahead", dropped, b.name.c_str());
  unreserve_staged(b, dropped);
}

void Store::Impl::drop_all_staged() {
  std::vector<BlockId> ids;
  for (const auto& [id, pieces] : staging_acct.reservations()) ids.push_back(id);
  for (BlockId id : ids) drop_staged(blocks.at(id));
  wake();
}

bool Store::Impl::finish_stage_if_done(Block& b, Op& op) {
  if (op.outstanding > 0 || op.next_chunk < op.chunks) return false;
  if (op.finished > 0 && options.trace_spans && Trace::global().enabled()) {
    Trace::global().span("store nvme", "read ahead " + b.name, op.start_us,
                         Trace::global().now_us());
  }
  return finish_op(b);
}

void Store::Impl::queue_job(IoJob job) { io_sched.queue(std::move(job)); }

// Marks piece k of an NVMe copy finished (or failed) and frees its staging buffer.
void Store::Impl::piece_done(Op& op, int staging_index) {
  if (staging_index >= 0) {
    staging_acct.give_back(staging_index,
                           op.src == Tier::kDevice ? StagingAccounting::kWrite
                                                   : StagingAccounting::kRead,
                           false);
  }
  TZ_ASSERT(op.outstanding > 0);
  --op.outstanding;
  ++op.finished;
}

bool Store::Impl::finish_copy_if_done(Block& b, Op& op) {
  if (op.src == Tier::kDevice && op.dst == Tier::kNvme && !op.failed && op.chunks > 0 &&
      op.device_reads_done == op.chunks && op.outstanding > 0) {
    // Every piece has left the device buffer: the op ends, so that the ops behind it (a free of
    // the device copy, a copy of it to the host tier) need not wait for the disk. The writes
    // finish as the extent's (finish_extent_write).
    b.extent_writes = op.outstanding;
    b.extent_write_seq = op.seq;
    b.extent_write_start_us = op.start_us;
    b.extent_write_status = Status::ok();
    b.extent_write_early = op.early;
    b.extent_write_ahead = op.ahead;
    return finish_op(b);
  }
  if (op.device_pending || op.outstanding > 0) return false;
  if (!op.failed && op.chunks > 0 && op.finished < op.chunks) return false;
  const Link l = link_of(op.src, op.dst);
  link_end(l);
  if (!op.failed && op.dst == Tier::kNvme) b.nvme_written = true;
  if (!op.failed && !op.zero_fill) {
    count_move(b, op.src, op.dst);
    if (!op.sums.empty()) stats.writer_hashed_bytes += b.bytes;  // with the link's bytes
    if (options.trace_spans && Trace::global().enabled()) {
      const bool nvme_link = op.src == Tier::kNvme || op.dst == Tier::kNvme;
      const char* track = nvme_link                 ? "store nvme"
                          : op.dst == Tier::kDevice ? "store copy h2d"
                                                    : "store copy d2h";
      Trace::global().span(track, std::string(link_name(l)) + " " + b.name, op.start_us,
                           Trace::global().now_us());
    }
  }
  return finish_op(b);
}

bool Store::Impl::finish_op(Block& b) {
  Op& op = b.ops.front();
  b.done_seq = op.seq;
  b.issued_seq = std::max(b.issued_seq, op.seq);
  b.ops.pop_front();
  if (b.ops.empty()) busy.erase(b.id);
  cv.notify_all();
  return true;
}

// Runs the chain of b as far as it can go now.
bool Store::Impl::advance(Block& b) {
  bool progress = false;
  while (!b.ops.empty()) {
    Op& op = b.ops.front();
    const std::size_t before = b.ops.size();
    bool p;
    if (!op.started || op.kind == OpKind::kFree || op.kind == OpKind::kStage) {
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

Op* Store::Impl::find_op(Block& b, std::uint64_t seq) {
  if (b.ops.empty() || b.ops.front().seq != seq) return nullptr;
  return &b.ops.front();
}

void Store::Impl::apply_device_done(const DeviceDone& d) {
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
  const std::uint64_t len = b.piece_bytes(d.chunk, options.chunk_bytes);
  if (op->src == Tier::kDevice && !op->failed) {
    // Device -> staging done: checksum the piece and write it.
    ++op->device_reads_done;
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
    finish_copy_if_done(b, *op);  // the last piece out of the device ends the op
    return;
  }
  // Staging -> device done, or a piece of a failed copy.
  piece_done(*op, d.staging);
  finish_copy_if_done(b, *op);
}

// Through the runtime dispatch, which hashes pieces from memory faster (core/xxhash.h).
std::uint64_t Store::Impl::piece_sum(const void* data, std::size_t bytes) const {
  return options.checksums ? xxh3_64_dispatch(data, bytes) : 0;
}

Status Store::Impl::checksum_mismatch(const Block& b, std::uint32_t chunk) const {
  const std::uint64_t off = static_cast<std::uint64_t>(chunk) * options.chunk_bytes;
  const std::uint64_t len = b.piece_bytes(chunk, options.chunk_bytes);
  return Status::corrupt("store: checksum mismatch in block '" + b.name + "' piece " +
                         std::to_string(chunk) + " (bytes " + std::to_string(off) + ".." +
                         std::to_string(off + len) + ") read from NVMe");
}

void Store::Impl::apply_io_done(IoJob& job) {
  auto it = blocks.find(job.block);
  TZ_ASSERT(it != blocks.end());
  Block& b = it->second;
  io_sched.complete(job);
  Op* op = find_op(b, job.op_seq);
  if (op == nullptr && b.extent_writes > 0 && job.op_seq == b.extent_write_seq) {
    finish_extent_write(b, job);
    return;
  }
  TZ_ASSERT(op != nullptr, "an I/O completion for an op that is not running");
  const std::uint64_t len = b.piece_bytes(job.chunk, options.chunk_bytes);
  if (op->kind == OpKind::kStage) {
    --op->outstanding;
    ++op->finished;
    if (job.status.is_ok()) {
      b.staged[job.chunk] = job.staging;  // held, and hashed when its load copies it on
      stats.read_ahead_bytes += len;
    } else {
      // Nothing is lost: the load reads the piece again and reports what it gets.
      ++stats.io_errors;
      TZ_LOG_DEBUG("store: reading ahead '%s' piece %u: %s", b.name.c_str(), job.chunk,
                   job.status.to_string().c_str());
      staging_acct.give_back(job.staging, StagingAccounting::kRead, true);
      unreserve_staged(b, 1);
    }
    finish_stage_if_done(b, *op);
    return;
  }
  if (!job.status.is_ok()) {
    fail_op(b, *op,
            std::move(job.status)
                .with_context(std::string("store: ") +
                              (job.dir == nvme::IoOp::kRead ? "reading" : "writing") + " block '" +
                              b.name + "' piece " + std::to_string(job.chunk)));
  } else if (job.dir == nvme::IoOp::kWrite) {
    b.sums[job.chunk] = job.sum;
  } else if (!op->failed) {
    if (op->dst == Tier::kDevice) {
      copy_piece_to_device(b, *op, job.chunk, job.staging);
      return;  // the piece finishes when the copy does (or fails: finish_device_calls)
    }
    if (job.sum != b.sums[job.chunk]) fail_op(b, *op, checksum_mismatch(b, job.chunk));
  }
  piece_done(*op, job.staging);
  finish_copy_if_done(b, *op);
}

// A write of a device -> NVMe copy whose op has ended (finish_copy_if_done). The last one does
// what the op's end would have: the extent holds the bytes, or the block records the failure for
// the leases that depend on the write (every op from it on, as fail_op would have). An early
// write-back's failure is settled at its first failed piece instead (settle_early_write).
void Store::Impl::finish_extent_write(Block& b, IoJob& job) {
  staging_acct.give_back(job.staging, StagingAccounting::kWrite, false);
  if (!job.status.is_ok() && b.extent_write_status.is_ok()) {
    b.extent_write_status = std::move(job.status).with_context(
        "store: writing block '" + b.name + "' piece " + std::to_string(job.chunk));
    if (b.extent_write_ahead) settle_early_write(b, b.extent_write_seq, b.extent_write_status);
  } else if (job.status.is_ok()) {
    b.sums[job.chunk] = job.sum;
  }
  if (--b.extent_writes > 0) return;
  const Link l = Link::kDeviceToNvme;
  link_end(l);
  if (b.extent_write_status.is_ok()) {
    b.nvme_written = true;
    count_move(b, Tier::kDevice, Tier::kNvme);
    if (options.trace_spans && Trace::global().enabled()) {
      Trace::global().span("store nvme", std::string(link_name(l)) + " " + b.name,
                           b.extent_write_start_us, Trace::global().now_us());
    }
  } else if (!b.extent_write_ahead) {
    record_failure(b, b.extent_write_seq, b.extent_write_status);
  }
  cv.notify_all();
}

// An early write-back that nothing waits for yet (no op queued behind it, no pin waiting for
// it): its staging buffers and disk slots go to other moves first. Once the block is evicted
// or a pin waits for it, the write takes its turn in decision order.
bool Store::Impl::deferrable(const Block& b) const {
  if (b.extent_writes > 0) {
    // The writes of an ended write-back: deferrable when it was an early one and no op waits
    // for the extent.
    return b.extent_write_early &&
           std::none_of(b.ops.begin(), b.ops.end(), [](const Op& o) { return touches_extent(o); });
  }
  return b.ops.size() == 1 && b.ops.front().early;
}

// Picks the I/O jobs to submit now (io_scheduler.h): within the in-flight bound, and in kGrouped
// mode one direction at a time (reads first; switch when a run is long enough and the other side
// waits).
std::vector<IoJob> Store::Impl::pick_jobs() {
  return io_sched.pick([this](BlockId id) {
    auto it = blocks.find(id);
    return it != blocks.end() && deferrable(it->second);
  });
}

bool Store::Impl::idle() const {
  if (!io_sched.empty()) return false;
  {
    std::lock_guard lock(wake_mu);
    if (!device_done.empty()) return false;
  }
  return busy.empty();
}

// Erases destroyed blocks whose chains have drained.
void Store::Impl::reap_destroyed() {
  std::size_t kept = 0;
  for (BlockId id : to_reap) {
    auto it = blocks.find(id);
    if (it == blocks.end()) continue;
    if (it->second.ops.empty() && it->second.extent_writes == 0) {
      drop_staged(it->second);
      erased_blocks.push_back(blocks.extract(it));  // its events are destroyed outside `mu`
    } else {
      to_reap[kept++] = id;
    }
  }
  to_reap.resize(kept);
}

// Applies the completions device callbacks posted to the mailbox; `seen` is the mailbox's
// event count they were taken at (the mover sleeps until it moves on).
bool Store::Impl::apply_device_completions(std::uint64_t& seen) {
  std::vector<DeviceDone> dd;
  {
    std::lock_guard wl(wake_mu);
    seen = events;
    dd.swap(device_done);
  }
  for (const DeviceDone& d : dd) apply_device_done(d);
  return !dd.empty();
}

// Advances every busy chain. Chains run in the order their heads were decided, so that staging
// buffers and disk slots go to the move decided first (the victim's write-back before a later
// one); reads ahead and early write-backs, which nothing waits for yet, go after the rest.
bool Store::Impl::run_chains() {
  std::vector<Block*> work;
  work.reserve(busy.size());
  for (BlockId id : busy) work.push_back(&blocks.at(id));
  auto rank = [this](const Block* b) {
    return deferrable(*b) ? 2 : b->ops.front().kind == OpKind::kStage ? 1 : 0;
  };
  std::sort(work.begin(), work.end(), [&](const Block* x, const Block* y) {
    const int rx = rank(x);
    const int ry = rank(y);
    if (rx != ry) return rx < ry;
    return x->ops.front().decided < y->ops.front().decided;
  });
  bool progress = false;
  for (Block* b : work) progress |= advance(*b);
  return progress;
}

// Issues the device work decided under `mu` (without it), then hashes the pieces just copied on
// from staging buffers while the copies run.
void Store::Impl::issue_device_work(std::vector<DeviceCall>& calls) {
  for (DeviceCall& c : calls) issue_device_call(c);
  for (DeviceCall& c : calls) {
    if (c.check_data != nullptr) {
      c.check_failed = piece_sum(c.check_data, c.check_len) != c.check_sum;
    }
  }
}

// Submits `jobs` (writes hashed first) and polls the I/O engine (without `mu`). Returns the jobs
// that completed or failed, reads into the host tier hashed (piece_sum).
std::vector<IoJob> Store::Impl::run_io(std::vector<IoJob>& jobs, InFlight& in_flight,
                                       nvme::IoQueue* io) {
  std::vector<IoJob> done;
  for (IoJob& j : jobs) {
    TZ_ASSERT(io != nullptr, "an NVMe job without a swap space");
    if (j.dir == nvme::IoOp::kWrite && !j.sum_known) j.sum = piece_sum(j.data, j.data_len);
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
    if (!st.is_ok()) {
      // The engine itself failed: its requests will not complete. Every job in flight fails
      // with the engine's error, so the leases waiting for them return it.
      TZ_LOG_ERROR("store: I/O engine failed: %s", st.to_string().c_str());
      for (auto& [id, j] : in_flight) {
        j.status = Status(st).with_context("store: I/O engine failed with this request in flight");
        done.push_back(std::move(j));
      }
      in_flight.clear();
    }
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
    // Reads into staging buffers go on to the device and are hashed then (check_data).
    if (j.dir == nvme::IoOp::kRead && j.status.is_ok() && j.staging < 0) {
      j.sum = piece_sum(j.data, j.data_len);
    }
  }
  return done;
}

// Sleeps on the mailbox (without `mu`, so that callers and callbacks can post meanwhile) until
// its event count moves past `seen`; while I/O is in flight, at most 200 us between polls.
void Store::Impl::wait_for_events(std::uint64_t seen, bool polling) {
  std::unique_lock wl(wake_mu);
  if (polling) {
    mover_cv.wait_for(wl, std::chrono::microseconds(200), [&] { return events != seen; });
  } else {
    mover_cv.wait(wl, [&] { return events != seen; });
  }
}

// The mover's pass: completions, chains and I/O picks under `mu`; device calls, frees and I/O
// without it; their results under `mu` again; sleep when nothing moved.
void Store::Impl::mover_loop() {
  InFlight in_flight;
  nvme::IoQueue* io = swap ? &swap->queue() : nullptr;
  std::unique_lock lock(mu);
  for (;;) {
    std::uint64_t seen = 0;
    bool progress = apply_device_completions(seen);
    progress |= run_chains();
    reap_destroyed();
    std::vector<IoJob> jobs = pick_jobs();
    if (stopping && idle() && in_flight.empty()) break;
    std::vector<DeviceCall> calls;
    calls.swap(device_calls);
    std::vector<gpu::DeviceBuffer> frees;
    frees.swap(device_frees);
    std::vector<std::map<BlockId, Block>::node_type> erased;
    erased.swap(erased_blocks);
    lock.unlock();
    frees.clear();  // first: the allocations below may count on their room
    erased.clear();
    issue_device_work(calls);
    std::vector<IoJob> done = run_io(jobs, in_flight, io);
    lock.lock();
    finish_device_calls(calls);
    for (IoJob& j : done) apply_io_done(j);
    progress |= !calls.empty() || !done.empty() || !jobs.empty();
    if (progress) continue;
    lock.unlock();
    wait_for_events(seen, !in_flight.empty());
    lock.lock();
  }
}

}  // namespace tz::store
