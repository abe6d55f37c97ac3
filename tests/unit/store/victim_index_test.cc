// The store's victim index (store/victim_index.h) on hand-written keys: evict-first order (larger
// key first, equal keys lower block id first), tiers apart, erase and contains, the early stop of
// a walk, and misuse as programmer errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "store/victim_index.h"

namespace tz::store {
namespace {

std::vector<std::pair<BlockId, std::uint64_t>> walk(const VictimIndex& v, Tier t) {
  std::vector<std::pair<BlockId, std::uint64_t>> out;
  v.visit_evict_first(t, [&](BlockId id, std::uint64_t key) {
    out.emplace_back(id, key);
    return true;
  });
  return out;
}

using Order = std::vector<std::pair<BlockId, std::uint64_t>>;

TEST(VictimIndex, LargerKeyFirstThenLowerId) {
  VictimIndex v;
  v.insert(Tier::kDevice, 7, 10);
  v.insert(Tier::kDevice, 3, 40);
  v.insert(Tier::kDevice, 9, 40);
  v.insert(Tier::kDevice, 1, 5);
  v.insert(Tier::kDevice, 2, 40);
  EXPECT_EQ(walk(v, Tier::kDevice), (Order{{2, 40}, {3, 40}, {9, 40}, {7, 10}, {1, 5}}));
  EXPECT_EQ(v.size(Tier::kDevice), 5u);
}

TEST(VictimIndex, TiersAreApart) {
  VictimIndex v;
  v.insert(Tier::kDevice, 1, 1);
  v.insert(Tier::kHost, 1, 2);
  v.insert(Tier::kHost, 2, 3);
  EXPECT_EQ(walk(v, Tier::kDevice), (Order{{1, 1}}));
  EXPECT_EQ(walk(v, Tier::kHost), (Order{{2, 3}, {1, 2}}));
  EXPECT_TRUE(walk(v, Tier::kNvme).empty());
  EXPECT_TRUE(v.contains(Tier::kHost, 1, 2));
  EXPECT_FALSE(v.contains(Tier::kHost, 1, 1));  // the key is part of the entry
  EXPECT_FALSE(v.contains(Tier::kDevice, 2, 3));
}

TEST(VictimIndex, EraseAndReinsertWithANewKeyMovesTheCopy) {
  VictimIndex v;
  v.insert(Tier::kDevice, 1, 100);
  v.insert(Tier::kDevice, 2, 50);
  v.erase(Tier::kDevice, 1, 100);  // the copy was pinned: its key is taken again at release
  v.insert(Tier::kDevice, 1, 20);
  EXPECT_EQ(walk(v, Tier::kDevice), (Order{{2, 50}, {1, 20}}));
  v.clear();
  EXPECT_EQ(v.size(Tier::kDevice), 0u);
}

TEST(VictimIndex, AWalkStopsWhenTheVisitorSaysSo) {
  VictimIndex v;
  for (BlockId id = 1; id <= 10; ++id) v.insert(Tier::kHost, id, id);
  std::vector<BlockId> seen;
  v.visit_evict_first(Tier::kHost, [&](BlockId id, std::uint64_t key) {
    if (key <= 7) return false;  // as choose_victims stops at the `beyond` floor
    seen.push_back(id);
    return true;
  });
  EXPECT_EQ(seen, (std::vector<BlockId>{10, 9, 8}));
}

TEST(VictimIndex, NeverUsedAgainGoesFirstAndLruKeysEvictTheOldest) {
  // Belady keys: trace positions of the next use, kNever for a copy never used again (or
  // overwritten first). Blocks 4 and 2 are never used again, 1 at position 12, 3 at 30.
  constexpr std::uint64_t kNeverKey = ~std::uint64_t{0};
  VictimIndex v;
  v.insert(Tier::kDevice, 1, 12);
  v.insert(Tier::kDevice, 4, kNeverKey);
  v.insert(Tier::kDevice, 3, 30);
  v.insert(Tier::kDevice, 2, kNeverKey);
  EXPECT_EQ(walk(v, Tier::kDevice), (Order{{2, kNeverKey}, {4, kNeverKey}, {3, 30}, {1, 12}}));
  // LRU keys: kNever - last use tick. Ticks 5 (block 7), 2 (block 8), 9 (block 6): the least
  // recently used (tick 2) goes first.
  VictimIndex lru;
  lru.insert(Tier::kHost, 7, kNeverKey - 5);
  lru.insert(Tier::kHost, 8, kNeverKey - 2);
  lru.insert(Tier::kHost, 6, kNeverKey - 9);
  std::vector<BlockId> order;
  for (const auto& [id, key] : walk(lru, Tier::kHost)) order.push_back(id);
  EXPECT_EQ(order, (std::vector<BlockId>{8, 7, 6}));
}

TEST(VictimIndex, MisuseIsAProgrammerError) {
  VictimIndex v;
  v.insert(Tier::kDevice, 1, 1);
  EXPECT_DEATH(v.insert(Tier::kDevice, 1, 1), "already a candidate");
  EXPECT_DEATH(v.erase(Tier::kDevice, 2, 1), "no candidate");
  EXPECT_DEATH(v.erase(Tier::kDevice, 1, 2), "no candidate");  // the key is part of the entry
  EXPECT_DEATH(v.insert(static_cast<Tier>(7), 1, 1), "no such tier");
}

}  // namespace
}  // namespace tz::store
