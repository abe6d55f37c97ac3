// Residency and budgets: which tiers hold a copy of each block, within each tier's logical byte
// budget; demand placement (make_resident), eviction with write-back of dirty copies, admission
// of evicted device copies to the host tier, prefetch placement, and early write-backs. Every
// function here runs in a caller's thread under Impl::mu and only decides: it appends physical
// operations to block chains for the mover.
#include <algorithm>
#include <string>

#include "core/log.h"
#include "core/units.h"
#include "store/store_impl.h"

namespace tz::store {

Block* Store::Impl::find(BlockId id) {
  auto it = blocks.find(id);
  return it == blocks.end() || it->second.destroyed ? nullptr : &it->second;
}

Result<Block*> Store::Impl::find_for(BlockId id, const char* what) {
  Block* b = find(id);
  if (b == nullptr) {
    return Status::invalid_argument(std::string("store: ") + what + " of unknown block " +
                                    std::to_string(id));
  }
  return b;
}

void Store::Impl::wake() {
  std::lock_guard lock(wake_mu);
  ++events;
  mover_cv.notify_one();
}

std::uint64_t Store::Impl::push_op(Block& b, Op op) {
  op.seq = b.next_seq++;
  op.decided = ++decisions;
  if (op.kind == OpKind::kAlloc) alloc_fifo[ti(op.dst)].emplace_back(b.id, op.seq);
  if (op.kind == OpKind::kFree) ++pending_frees[ti(op.dst)];
  // A read ahead fills no copy: pins of the device copy do not wait for it.
  if (op.kind != OpKind::kFree && op.kind != OpKind::kStage) b.fill_seq[ti(op.dst)] = op.seq;
  // A write-back of the host copy takes the sums its writer handed in (the op writes the bytes
  // as they are now: later writers wait for it); an op into the host copy changes the bytes.
  if (op.kind == OpKind::kCopy && op.src == Tier::kHost && op.dst == Tier::kNvme) {
    op.sums = b.host_sums;
  }
  if (op.dst == Tier::kHost && op.kind != OpKind::kStage) b.host_sums.clear();
  b.ops.push_back(std::move(op));
  busy.insert(b.id);
  ++walk_epoch;
  wake();
  return b.next_seq - 1;
}

void Store::Impl::push_alloc(Block& b, Tier t) {
  Op op;
  op.kind = OpKind::kAlloc;
  op.dst = t;
  push_op(b, std::move(op));
}

void Store::Impl::push_free(Block& b, Tier t) {
  Op op;
  op.kind = OpKind::kFree;
  op.dst = t;
  push_op(b, std::move(op));
}

std::uint64_t Store::Impl::push_copy(Block& b, Tier src, Tier dst, bool prefetch) {
  Op op;
  op.kind = OpKind::kCopy;
  op.src = src;
  op.dst = dst;
  op.prefetch = prefetch;
  return push_op(b, std::move(op));
}

// Whether a clean copy of `b` admitted to the host tier now would still be there at its next
// use `nu` pins ahead: not when the blocks needing a host copy before then fill the tier, those
// with a host copy now and those whose only current copy is on the device (they are demoted to
// the host when the device drops them). A copy that would be pushed out unused is a memcpy
// (and an allocation queued behind the block's pending moves) for nothing.
bool Store::Impl::host_keeps(const Block& x, std::uint64_t nu) const {
  std::uint64_t need = x.bytes;
  for (const auto& [id, b] : blocks) {
    if (b.destroyed || id == x.id) continue;
    if (b.home == Tier::kHost) need += b.bytes;  // homed there: never leaves
    if (b.home != Tier::kNvme) continue;
    const bool host = b.copies[ti(Tier::kHost)].present;
    if (!host && !only_valid(b, Tier::kDevice)) continue;
    if (trace.next_use(id, Tier::kHost) < nu) need += b.bytes;
  }
  return need <= budget[ti(Tier::kHost)];
}

// Makes `b` (just evicted from the device, `valid_elsewhere` or not) a host copy if the policy
// admits it. Returns true when a host copy was allocated.
bool Store::Impl::admit_to_host(Block& b) {
  if (b.home != Tier::kNvme) return false;
  std::optional<std::uint64_t> beyond;
  if (belady()) {
    const std::uint64_t nu = trace.next_use(b.id, Tier::kHost);
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
  refresh_candidate(b);
  return true;
}

// The failure that spoiled a lease's bytes, if any. A read needs every move up to its own to
// have worked; a write-only pin only its own allocation.
Status Store::Impl::lease_failure(const Block& b, Access access, std::uint64_t first_seq,
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

// The lowest op seq whose failure lease_failure would report to such a lease: failures ending
// before it cannot spoil it.
std::uint64_t Store::Impl::lease_mark(Access access, std::uint64_t first_seq,
                                      std::uint64_t ready_seq) {
  return access == Access::kWrite ? first_seq : ready_seq;
}

bool Store::Impl::only_valid(const Block& b, Tier t) const {
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
void Store::Impl::write_back_early(Block& b, Tier t) {
  if (!belady() || b.dirtied_at == kNoPos || !trace.spilled(b.dirtied_at)) return;
  if (start_early_write(b, t)) {
    TZ_LOG_DEBUG("store: early write-back of '%s' from %s at trace pos %zu", b.name.c_str(),
                 tier_name(t), trace.pos());
  }
}

bool Store::Impl::start_early_write(Block& b, Tier t) {
  if (b.total_leases > 0 || b.home != Tier::kNvme || t == Tier::kNvme || !b.error.is_ok() ||
      !b.copies[ti(t)].present || !only_valid(b, t)) {
    return false;
  }
  push_copy(b, t, Tier::kNvme, false);
  b.ops.back().early = true;
  b.ops.back().ahead = true;
  b.copies[ti(Tier::kNvme)].valid = true;
  ++stats.tiers[ti(t)].write_backs;
  ++stats.early_write_backs;
  return true;
}

// Drops b's copy in `t` (an upper, unpinned, non-home copy), writing it down first if it holds
// the only current bytes.
void Store::Impl::evict(Block& b, Tier t) {
  TZ_ASSERT(b.copies[ti(t)].present && b.home != t && b.total_leases == 0);
  TierStats& ts = stats.tiers[ti(t)];
  ++ts.evictions;
  TZ_LOG_DEBUG("store: evict '%s' from %s at trace pos %zu%s", b.name.c_str(), tier_name(t),
               trace.pos(), only_valid(b, t) ? " (dirty)" : "");
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
    if (belady()) trace.note_spill(b.dirtied_at);
    b.dirtied_at = kNoPos;
  }
  refresh_candidate(b);
}

// The tier a load into `t` reads from: the valid copy closest to `t`.
std::optional<Tier> Store::Impl::load_source(const Block& b, Tier t) const {
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

std::string Store::Impl::pinned_summary(Tier t) const {
  std::string out;
  std::uint64_t total = 0;
  int n = 0;
  for (const auto& [id, b] : blocks) {
    if (b.destroyed || !b.copies[ti(t)].present) continue;
    if (b.total_leases == 0 && b.home != t) continue;
    total += b.bytes;
    if (n++ < 8) {
      out += (out.empty() ? "" : ", ") +
             ("'" + b.name + "' (" + format_bytes(static_cast<double>(b.bytes)) +
              (b.home == t && b.total_leases == 0 ? ", home" : ", pinned") + ")");
    }
  }
  if (n > 8) out += ", and " + std::to_string(n - 8) + " more";
  return format_bytes(static_cast<double>(total)) +
         " pinned or homed there: " + (out.empty() ? "nothing" : out);
}

// Allocates b's copy in `t`, evicting as needed (demand: any unpinned copy).
Status Store::Impl::make_resident(Block& b, Tier t) {
  if (b.copies[ti(t)].present) return Status::ok();
  auto victims = choose_victims(t, b.bytes, b.id, std::nullopt);
  if (!victims) {
    return Status::out_of_memory(
        std::string("store: cannot place '") + b.name + "' (" +
        format_bytes(static_cast<double>(b.bytes)) + ") in the " + tier_name(t) + " tier: budget " +
        format_bytes(static_cast<double>(budget[ti(t)])) + ", " + pinned_summary(t));
  }
  for (BlockId v : *victims) evict(*find(v), t);
  push_alloc(b, t);
  b.copies[ti(t)].present = true;
  logical_used[ti(t)] += b.bytes;
  refresh_candidate(b);
  return Status::ok();
}

// Starts loading b into t ahead of its use `distance` pins from now; false when the budget
// does not allow it without evicting something needed sooner.
bool Store::Impl::try_prefetch(Block& b, Tier t, std::optional<std::uint64_t> distance,
                               std::uint64_t headroom) {
  if (b.copies[ti(t)].valid) return true;
  if (!b.error.is_ok()) return true;  // nothing to gain; pins report the error
  if (b.copies[ti(t)].present) {
    // A stale copy: reload it in place.
  } else {
    std::optional<std::vector<BlockId>> victims;
    if (distance) {
      victims = choose_victims(t, b.bytes + headroom, b.id, distance);
    } else if (logical_used[ti(t)] + b.bytes + headroom <= budget[ti(t)]) {
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
  TZ_LOG_DEBUG("store: prefetch '%s' %s -> %s at trace pos %zu", b.name.c_str(), tier_name(*src),
               tier_name(t), trace.pos());
  push_copy(b, *src, t, true);
  b.copies[ti(t)].valid = true;
  b.copies[ti(t)].by_prefetch = true;
  b.copies[ti(t)].loaded_from = *src;
  b.copies[ti(t)].lru_tick = ++tick;
  ++stats.tiers[ti(t)].prefetches;
  refresh_candidate(b);
  return true;
}

// A write makes the block's other upper copies stale: free them now rather than hold space.
void Store::Impl::drop_stale_copies(Block& b, Tier written) {
  for (Tier u : {Tier::kDevice, Tier::kHost}) {
    if (u == written || u == b.home || !b.copies[ti(u)].present || b.leases[ti(u)] > 0) continue;
    push_free(b, u);
    b.copies[ti(u)] = Copy{};
    logical_used[ti(u)] -= b.bytes;
  }
  refresh_candidate(b);
}

void Store::Impl::forget_overwritten_failures(Block& b, std::uint64_t first_seq) {
  b.error = Status::ok();
  const std::uint64_t keep_from =
      b.marks.empty() ? first_seq : std::min(first_seq, *b.marks.begin());
  while (!b.failures.empty() && b.failures.front().last_seq < keep_from) b.failures.pop_front();
}

// Tier `t`'s allocation FIFO names queued allocations of live blocks, in decision order.
Status Store::Impl::check_alloc_fifo(Tier t) const {
  const char* tier = tier_name(t);
  std::uint64_t last_decided = 0;
  for (const auto& [bid, seq] : alloc_fifo[ti(t)]) {
    auto it = blocks.find(bid);
    if (it == blocks.end()) return Status::internal("store: allocation FIFO names a gone block");
    bool found = false;
    for (const Op& op : it->second.ops) {
      if (op.seq != seq) continue;
      found = op.kind == OpKind::kAlloc;
      if (op.decided <= last_decided) {
        return Status::internal(std::string("store: allocation FIFO of ") + tier +
                                " out of decision order");
      }
      last_decided = op.decided;
    }
    if (!found) return Status::internal("store: allocation FIFO names no queued allocation");
  }
  return Status::ok();
}

// The invariants every operation keeps (the property test checks them after each one): per
// tier, the present copies' bytes sum to the logical use and, for device and host, the
// physical use stays within the budget; per block, ops are ordered by seq after done_seq and
// issued_seq, allocations wait in their tier's FIFO in decision order, queued frees are counted,
// and failures are ordered and disjoint.
Status Store::Impl::check_invariants() const {
  std::array<std::uint64_t, kTierCount> present{};
  std::array<std::uint64_t, kTierCount> frees{};
  std::array<std::uint64_t, kTierCount> allocs{};
  std::array<std::size_t, kTierCount> candidate_count{};
  for (const auto& [id, b] : blocks) {
    const std::string who = "block '" + b.name + "'";
    for (std::size_t t = 0; t < kTierCount; ++t) {
      if (b.copies[t].present) present[t] += b.bytes;
      if (b.destroyed && b.copies[t].present) {
        return Status::internal(who + ": destroyed with a present copy");
      }
      // The victim index agrees with a fresh computation of eligibility and key.
      const bool eligible = !b.destroyed && b.home != static_cast<Tier>(t) &&
                            b.copies[t].present && b.total_leases == 0;
      if (eligible != b.candidate[t] ||
          (eligible && (b.candidate_key[t] != candidate_key(b, static_cast<Tier>(t)) ||
                        !candidates.contains(static_cast<Tier>(t), id, b.candidate_key[t])))) {
        return Status::internal(who + ": stale eviction candidate in the " +
                                tier_name(static_cast<Tier>(t)) + " tier");
      }
      candidate_count[t] += eligible ? 1 : 0;
    }
    if (b.done_seq >= b.next_seq || b.issued_seq >= b.next_seq) {
      return Status::internal(who + ": done/issued seq past the last op");
    }
    if (b.ops.empty() == (busy.count(id) > 0)) {
      return Status::internal(who + ": the mover's busy set disagrees with its chain");
    }
    std::uint64_t prev = b.done_seq;
    for (const Op& op : b.ops) {
      if (op.seq <= prev) return Status::internal(who + ": op seqs out of order");
      prev = op.seq;
      if (op.kind == OpKind::kFree) ++frees[ti(op.dst)];
      if (op.kind == OpKind::kAlloc && !op.started) ++allocs[ti(op.dst)];
    }
    std::uint64_t last = 0;
    for (const Failure& f : b.failures) {
      if (f.first_seq > f.last_seq || (last != 0 && f.first_seq <= last)) {
        return Status::internal(who + ": failures overlap or are out of order");
      }
      last = f.last_seq;
    }
    if (b.total_leases != b.leases[0] + b.leases[1] + b.leases[2] ||
        static_cast<std::size_t>(b.total_leases) != b.marks.size()) {
      return Status::internal(who + ": lease counts disagree");
    }
  }
  for (std::size_t t = 0; t < kTierCount; ++t) {
    const char* tier = tier_name(static_cast<Tier>(t));
    if (present[t] != logical_used[t]) {
      return Status::internal(std::string("store: present copies in ") + tier + " sum to " +
                              std::to_string(present[t]) + " B, logical use is " +
                              std::to_string(logical_used[t]) + " B");
    }
    if (t != ti(Tier::kNvme) && phys_used[t] > budget[t]) {
      return Status::internal(std::string("store: physical use of ") + tier + " past its budget");
    }
    if (frees[t] != pending_frees[t]) {
      return Status::internal(std::string("store: ") + std::to_string(frees[t]) +
                              " frees queued in " + tier + ", " +
                              std::to_string(pending_frees[t]) + " counted");
    }
    if (allocs[t] != alloc_fifo[t].size()) {
      return Status::internal(std::string("store: ") + std::to_string(allocs[t]) +
                              " allocations waiting in " + tier + ", FIFO holds " +
                              std::to_string(alloc_fifo[t].size()));
    }
    TZ_RETURN_IF_ERROR(check_alloc_fifo(static_cast<Tier>(t)));
  }
  TZ_RETURN_IF_ERROR(check_staging());
  for (std::size_t t = 0; t < kTierCount; ++t) {
    if (candidates.size(static_cast<Tier>(t)) != candidate_count[t]) {
      return Status::internal(std::string("the ") + tier_name(static_cast<Tier>(t)) +
                              " tier's eviction candidates hold entries of no candidate");
    }
  }
  return Status::ok();
}

// The read-ahead pieces the blocks hold and their stage ops read agree with the staging
// accounting: per block within its reservation, in all the reservations and the buffers held
// for reads ahead, and no more buffers held than exist.
Status Store::Impl::check_staging() const {
  std::uint32_t reserved = 0;
  std::uint32_t held_ahead = 0;
  std::size_t free_staging = staging_acct.free_count();
  for (const auto& [id, b] : blocks) {
    const auto held = static_cast<std::uint32_t>(
        std::count_if(b.staged.begin(), b.staged.end(), [](int s) { return s >= 0; }));
    const std::uint32_t block_reserved = staging_acct.reserved(id);
    if (held > block_reserved || (block_reserved == 0 && !b.staged.empty())) {
      return Status::internal("block '" + b.name + "': read-ahead pieces held past its reservation");
    }
    reserved += block_reserved;
    free_staging += held;
    held_ahead += held;
    for (const Op& op : b.ops) {
      if (op.kind == OpKind::kStage) held_ahead += op.outstanding;
    }
  }
  if (reserved != staging_acct.reserved_total() || held_ahead != staging_acct.ahead_held() ||
      staging_acct.ahead_held() > staging_acct.ahead_cap() || free_staging > staging.size() ||
      staging_acct.buffers() != staging.size()) {
    return Status::internal(
        "store: read ahead: " + std::to_string(reserved) + " pieces reserved (" +
        std::to_string(staging_acct.reserved_total()) + " counted), " +
        std::to_string(held_ahead) + " held (" + std::to_string(staging_acct.ahead_held()) +
        " counted, at most " + std::to_string(staging_acct.ahead_cap()) + ")");
  }
  return Status::ok();
}

}  // namespace tz::store
