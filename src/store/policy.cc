// The policy: victim choice (Belady's farthest next use while the step follows the trace, LRU
// otherwise) over the victim index, read ahead and the prefetch walk along the trace, and what a
// pin's trace bookkeeping (trace_index.h) means for the rest of the store. Runs under Impl::mu.
#include <algorithm>
#include <unordered_set>

#include "core/log.h"
#include "store/store_impl.h"

namespace tz::store {

// Distance (in pins) from the current trace position to the next use of b's copy in `t`
// (TraceIndex::next_use: a host copy serves pins of every tier; an overwrite first means never).
std::uint64_t Store::Impl::next_use(const Block& b, Tier t) const {
  return trace.next_use(b.id, t);
}

bool Store::Impl::belady() const {
  return options.policy == Policy::kTrace && trace.following();
}

// The eviction key of b's copy in `t` (larger: evict first). Following the trace, the trace
// position of its next use (Belady's farthest first); it is the position plus next_use, which stays
// the same while the trace moves on, because the position can only pass a block's next use by
// pinning that block, and a pinned block is no candidate (its key is taken again at release).
// A copy that Store::prefetch loaded, or Store::keep kept, for a block the trace never uses (its
// pins are untraced) is kept until that pin: its key is 0, nearer than any use ahead, and the same
// however far the trace has moved (the index's keys are checked against a fresh computation).
// Otherwise LRU: least recently used first.
std::uint64_t Store::Impl::candidate_key(const Block& b, Tier t) const {
  if (belady()) {
    const std::uint64_t nu = next_use(b, t);
    if (nu == kNever && b.copies[ti(t)].by_prefetch) return 0;
    return nu == kNever ? kNever : trace.pos() + nu;
  }
  return kNever - b.copies[ti(t)].lru_tick;
}

void Store::Impl::refresh_candidate(Block& b) {
  for (std::size_t i = 0; i < kTierCount; ++i) {
    const Tier t = static_cast<Tier>(i);
    if (b.candidate[i]) candidates.erase(t, b.id, b.candidate_key[i]);
    b.candidate[i] = !b.destroyed && b.home != t && b.copies[i].present && b.total_leases == 0;
    if (!b.candidate[i]) continue;
    b.candidate_key[i] = candidate_key(b, t);
    candidates.insert(t, b.id, b.candidate_key[i]);
  }
}

void Store::Impl::rebuild_candidates() {
  candidates.clear();
  for (auto& [id, b] : blocks) {
    b.candidate = {};
    refresh_candidate(b);
  }
}

// Victims to free `need` bytes in `t` for `for_block`, without evicting pinned copies or home
// copies; when `beyond` is set only copies whose next use is farther than it; `allocated_only`:
// only host copies whose pinned buffer exists (not ones still queued for their allocation).
// Empty optional: impossible. Reads the tier's candidates from the evict-first end, so a pin
// that needs one victim touches O(log n) entries, not every block.
std::optional<std::vector<BlockId>> Store::Impl::choose_victims(
    Tier t, std::uint64_t need, BlockId for_block, std::optional<std::uint64_t> beyond,
    bool allocated_only) {
  if (logical_used[ti(t)] + need <= budget[ti(t)]) return std::vector<BlockId>{};
  const bool bel = belady();
  if (beyond && !bel) return std::nullopt;  // without a trace nothing is known to be farther
  // Under Belady a key is an absolute trace position: "farther than beyond" is a key past this.
  const std::uint64_t floor =
      beyond ? (*beyond >= kNever - trace.pos() ? kNever : trace.pos() + *beyond) : 0;
  std::vector<BlockId> out;
  std::uint64_t freed = 0;
  const std::uint64_t over = logical_used[ti(t)] + need - budget[ti(t)];
  candidates.visit_evict_first(t, [&](BlockId id, std::uint64_t key) {
    if (freed >= over) return false;
    if (beyond && key <= floor) return false;
    if (id == for_block || id == protect) return true;
    const Block& b = blocks.at(id);
    if (allocated_only && !b.host.valid()) return true;
    out.push_back(id);
    freed += b.bytes;
    return true;
  });
  if (freed < over) return std::nullopt;
  return out;
}

// Reads ahead, into staging buffers, the pieces of b (an NVMe-homed block used on the device
// `distance` pins ahead, past what the device window can take now): once its load is decided it
// copies them on instead of waiting for the disk, so the disk keeps reading while the window is
// busy. Uses nearer than this one keep their buffers; idle read-ahead of uses farther away is
// dropped for it (Belady over the read-ahead buffers). Returns false when no buffer is left.
bool Store::Impl::try_stage(Block& b, std::uint64_t distance) {
  const std::uint32_t ahead_cap = staging_acct.ahead_cap();
  if (ahead_cap == 0) return false;
  if (b.home != Tier::kNvme || staging_acct.reserved(b.id) > 0) return true;
  // Only a load that will read the disk: no current upper copy (being loaded or not).
  if (b.copies[ti(Tier::kDevice)].valid || b.copies[ti(Tier::kHost)].valid) return true;
  // Pieces of blocks whose load is decided (their device copy is current, logically) are on
  // their way to the device and free their buffers by themselves: only the others count.
  auto undecided = [&] {
    std::uint32_t n = 0;
    for (const auto& [id, pieces] : staging_acct.reservations()) {
      if (!blocks.at(id).copies[ti(Tier::kDevice)].valid) n += pieces;
    }
    return n;
  };
  std::uint32_t used = undecided();
  while (used >= ahead_cap) {
    Block* victim = nullptr;
    std::uint64_t farthest = distance;
    for (const auto& [id, pieces] : staging_acct.reservations()) {
      Block& x = blocks.at(id);
      // A block with moves queued may have its load among them (it takes the pieces soon).
      if (!x.ops.empty() || x.copies[ti(Tier::kDevice)].valid) continue;
      if (std::none_of(x.staged.begin(), x.staged.end(), [](int s) { return s >= 0; })) continue;
      const std::uint64_t nu = trace.next_use(id, Tier::kDevice);
      if (nu > farthest) {
        victim = &x;
        farthest = nu;
      }
    }
    if (victim == nullptr) return false;
    drop_staged(*victim);
    used = undecided();
  }
  Op op;
  op.kind = OpKind::kStage;
  op.src = Tier::kNvme;
  op.dst = Tier::kDevice;
  op.chunks = std::min(b.chunk_count(options.chunk_bytes), ahead_cap - used);
  staging_acct.reserve(b.id, op.chunks);
  TZ_LOG_DEBUG("store: read ahead %u pieces of '%s' at trace pos %zu", op.chunks, b.name.c_str(),
               trace.pos());
  push_op(b, std::move(op));
  return true;
}

// Prefetches along the trace from the current position as far as the budgets allow.
// Device loads: at most `host_prefetch_depth` device copies loaded from the host tier (a memcpy
// or a DMA, quick to redo), counting the one pinned now, are held for the next uses; past them
// only loads from NVMe are started, each still by Belady's rule (it may only displace copies
// used after it), so that a slow read gets the disk while quick host loads run before its use.
// Past the first device use that finds no room, the next NVMe reads are started into staging
// buffers (try_stage), as far as kStageLookahead pins past that use (of any tier: the walk then
// stays O(1) per pin however many host pins lie between the device uses).
void Store::Impl::prefetch_ahead() {
  if (!belady() || trace.empty()) return;
  // Nothing changed since a full walk found nothing to start: this one would find nothing too
  // (a pin that follows the trace moves the window, but only over copies already valid).
  if (walk_idle_at == walk_epoch) return;
  const std::uint64_t epoch = walk_epoch;
  bool skipped_far = false;  // a host-sourced load left for later: a later walk may start it
  bool dev_stop = false;
  bool host_stop = false;
  std::uint32_t host_sourced = 0;  // device uses in the window whose bytes come from the host
  // Host-sourced device loads the walk left for later (past host_prefetch_depth), and device
  // loads of blocks being written now (after the write): the pins that make them take room then.
  // An NVMe load started past them into room they need would be the farthest copy when they
  // come, evicted for them and started again by the next walk. The device copies used before the
  // first of them (the one pinned now included) free room for them once used, if used next only
  // past that NVMe load's use.
  struct Use {
    std::uint64_t bytes;
    std::uint64_t next_after;  // the copy's next device use after this one (its key then)
  };
  std::vector<Use> skipped;
  std::vector<Use> before_skips;
  std::unordered_set<BlockId> skipped_ids;
  // Room an NVMe load `d` pins ahead must leave (free, or copies used after it) for the skipped
  // loads before it: each whose copy is used again before d stays nearer than d (held), the
  // others take their room in turn (the largest of them, once); less what the copies used
  // before them free.
  const auto skipped_room = [&](std::uint64_t d) {
    std::uint64_t need = 0;
    std::uint64_t turn = 0;
    for (const Use& k : skipped) {
      if (k.next_after < d) {
        need += k.bytes;
      } else {
        turn = std::max(turn, k.bytes);
      }
    }
    need += turn;
    std::uint64_t freed = 0;
    for (const Use& u : before_skips) {
      if (u.next_after >= d) freed += u.bytes;
    }
    return need > freed ? need - freed : 0;
  };
  // A device use the walk skips, or (before the first skip) one whose copy is in place; `from`:
  // the pins ahead past that use (0 for the one pinned now), where its copy's next use is sought.
  const auto skip = [&](const Block& b, std::uint64_t from) {
    skipped_far = true;
    if (skipped_ids.insert(b.id).second) {
      skipped.push_back({b.bytes, trace.next_use(b.id, Tier::kDevice, from)});
    }
  };
  const auto used_before_skips = [&](const Block& b, std::uint64_t from) {
    if (!skipped.empty()) return;
    before_skips.push_back({b.bytes, trace.next_use(b.id, Tier::kDevice, from)});
  };
  const std::size_t len = trace.size();
  if (trace.pos() > 0) {
    const TraceEntry& cur = trace.at(trace.pos() - 1);
    const Block* b = find(cur.block);
    if (cur.tier == Tier::kDevice && b != nullptr) {
      if (b->leases[ti(Tier::kDevice)] > 0 &&
          b->copies[ti(Tier::kDevice)].loaded_from == Tier::kHost) {
        ++host_sourced;
      }
      used_before_skips(*b, 0);
    }
  }
  // Bytes that write-only pins met so far in the window will allocate (blocks not present in
  // their tier): a prefetch past such a pin leaves that much of its tier free, or the pin's
  // demand eviction would take the farthest copy, which is that prefetch (read for nothing).
  std::array<std::uint64_t, kTierCount> reserved{};
  std::unordered_set<BlockId> reserved_for;  // each block's bytes once, however many such pins
  // Nothing more for the device: past the host-sourced depth on a trace without NVMe-homed
  // blocks (every further load would be a host-sourced one left for later). With no host-tier
  // loads in the trace either, the walk ends there instead of visiting the whole trace per pin.
  bool dev_rest = false;
  const bool host_none = !trace.has_host_loads();
  constexpr std::uint32_t kStageLookahead = 64;
  bool stage_stop = staging_acct.ahead_cap() == 0 || !trace.has_nvme_blocks();
  std::uint32_t stage_looked = 0;
  for (std::size_t d = 0;
       d < len && !(((dev_stop && stage_stop) || dev_rest) && (host_stop || host_none)); ++d) {
    if (dev_stop && !stage_stop && ++stage_looked > kStageLookahead) stage_stop = true;
    const TraceEntry& e = trace.ahead(d);
    Block* b = find(e.block);
    if (b == nullptr) continue;
    if (e.access == Access::kWrite) {
      if (b->home != e.tier && !b->copies[ti(e.tier)].present &&
          reserved_for.insert(b->id).second) {
        reserved[ti(e.tier)] += b->bytes;
      }
      continue;
    }
    if (!b->error.is_ok()) continue;
    // Loading bytes that a write-only pin replaces before this use would be wasted.
    if (trace.next_overwrite(b->id) < d) continue;
    if (b->total_leases > 0 && b->copies[ti(e.tier)].valid) continue;
    bool has_writer = false;
    for (std::size_t i = 0; i < kTierCount; ++i) has_writer |= b->write_leases[i] > 0;
    if (has_writer) {
      // Being written elsewhere (the update worker's host pin): its device load comes after
      // the write, into room taken then, like a skipped one.
      if (e.tier == Tier::kDevice && !b->copies[ti(Tier::kDevice)].present) skip(*b, d + 1);
      continue;
    }
    if (e.tier == Tier::kDevice) {
      if (dev_rest || b->home == Tier::kDevice) continue;
      if (dev_stop) {
        if (!stage_stop) stage_stop = !try_stage(*b, d);
        continue;
      }
      const Copy& dev = b->copies[ti(Tier::kDevice)];
      const bool from_host =
          dev.valid ? dev.loaded_from == Tier::kHost : b->copies[ti(Tier::kHost)].valid;
      const bool far = host_sourced >= options.host_prefetch_depth;
      if (from_host) ++host_sourced;
      if (far && !trace.has_nvme_blocks()) {
        dev_rest = true;
        skipped_far = true;  // the loads past here are for later walks
        continue;
      }
      if (dev.valid) {
        used_before_skips(*b, d + 1);
        continue;
      }
      if (far && from_host) {
        skip(*b, d + 1);
        continue;
      }
      const std::uint64_t headroom =
          reserved[ti(Tier::kDevice)] + (from_host ? 0 : skipped_room(d));
      if (!try_prefetch(*b, Tier::kDevice, d, headroom)) {
        dev_stop = true;
        if (!stage_stop) stage_stop = !try_stage(*b, d);  // the first use the window cannot take
      } else {
        used_before_skips(*b, d + 1);
      }
    } else if (e.tier == Tier::kHost && !host_stop && b->home == Tier::kNvme) {
      if (!try_prefetch(*b, Tier::kHost, d, reserved[ti(Tier::kHost)])) host_stop = true;
    }
  }
  if (!dev_stop && !host_stop && !skipped_far && epoch == walk_epoch) walk_idle_at = epoch;
}

TraceIndex::PinMark Store::Impl::begin_pin(const TraceEntry& e, bool noted) {
  const TraceIndex::PinMark mark = trace.begin_pin(e, noted);
  if (trace.left_trace(mark)) {
    rebuild_candidates();  // the keys turn from next uses into recency
    drop_all_staged();     // read for uses that may not come
    ++stats.trace_deviations;
    const Block* got = find(e.block);
    const Block* want = mark.pos < trace.size() ? find(trace.at(mark.pos).block) : nullptr;
    TZ_LOG_DEBUG(
        "store: access order left the recorded trace at pin %zu ('%s' in %s, the trace has "
        "'%s' in %s); LRU until the next step",
        trace.pos(), got != nullptr ? got->name.c_str() : "?", tier_name(e.tier),
        want != nullptr ? want->name.c_str() : "its end",
        mark.pos < trace.size() ? tier_name(trace.at(mark.pos).tier) : "-");
  }
  return mark;
}

// Undoes begin_pin (TraceIndex::undo_pin): the pin leaves the record, the trace position is as
// before it, and a deviation it caused is taken back with the victim keys rebuilt as positions.
void Store::Impl::undo_pin(const TraceIndex::PinMark& mark) {
  if (!trace.undo_pin(mark)) return;
  TZ_ASSERT(stats.trace_deviations > 0, "undo_pin: a deviation that was not counted");
  --stats.trace_deviations;
  rebuild_candidates();
}

}  // namespace tz::store
