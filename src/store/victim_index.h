// The store's victim index (DESIGN.md, "The store": trace-driven eviction): per tier, the copies
// that may be evicted, ordered by eviction key so that choosing victims reads them from the top
// instead of scanning every block. A larger key is evicted first (under Belady the trace position
// of the next use, farthest first; under LRU the inverse of the last use); equal keys go lower
// block id first. The store keeps it current at every change of a copy's presence, leases or key
// (Store::Impl::refresh_candidate) and check_invariants recomputes it. No threads, no device:
// tests/unit/store/victim_index_test.cc drives it with hand-written keys.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <set>
#include <utility>

#include "store/store.h"
#include "store/stats.h"

namespace tz::store {

class VictimIndex {
 public:
  // Adds `block`'s copy in `tier` with `key`; it must not be there with that key yet.
  void insert(Tier tier, BlockId block, std::uint64_t key);
  // Removes the entry insert() made with the same arguments; it must be there.
  void erase(Tier tier, BlockId block, std::uint64_t key);
  bool contains(Tier tier, BlockId block, std::uint64_t key) const;
  std::size_t size(Tier tier) const;
  void clear();

  // Calls fn(block, key) for `tier`'s entries evict-first until it returns false.
  template <typename Fn>
  void visit_evict_first(Tier tier, Fn&& fn) const {
    const auto& set = sets_[index(tier)];
    for (auto it = set.rbegin(); it != set.rend(); ++it) {
      if (!fn(static_cast<BlockId>(~it->second), it->first)) return;
    }
  }

 private:
  static std::size_t index(Tier tier);
  // Entries are (key, ~id): reverse order is evict-first (larger key, then lower id).
  std::array<std::set<std::pair<std::uint64_t, std::uint64_t>>, kTierCount> sets_;
};

}  // namespace tz::store
