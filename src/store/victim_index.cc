// The store's victim index (victim_index.h).
#include "store/victim_index.h"

#include "core/assert.h"

namespace tz::store {

std::size_t VictimIndex::index(Tier tier) {
  const auto i = static_cast<std::size_t>(tier);
  TZ_ASSERT(i < kTierCount, "no such tier");
  return i;
}

void VictimIndex::insert(Tier tier, BlockId block, std::uint64_t key) {
  const bool added = sets_[index(tier)].insert({key, ~std::uint64_t{block}}).second;
  TZ_ASSERT(added, "victim index: the copy is already a candidate with that key");
}

void VictimIndex::erase(Tier tier, BlockId block, std::uint64_t key) {
  const std::size_t removed = sets_[index(tier)].erase({key, ~std::uint64_t{block}});
  TZ_ASSERT(removed == 1, "victim index: erasing a copy that is no candidate with that key");
}

bool VictimIndex::contains(Tier tier, BlockId block, std::uint64_t key) const {
  return sets_[index(tier)].count({key, ~std::uint64_t{block}}) == 1;
}

std::size_t VictimIndex::size(Tier tier) const { return sets_[index(tier)].size(); }

void VictimIndex::clear() {
  for (auto& s : sets_) s.clear();
}

}  // namespace tz::store
