// The store's staging accounting (staging_accounting.h).
#include "store/staging_accounting.h"

#include <algorithm>

#include "core/assert.h"

namespace tz::store {

StagingAccounting::StagingAccounting(std::uint32_t buffers, std::uint32_t read_ahead_buffers)
    : is_free_(buffers, true),
      cap_(buffers - (buffers < 2 ? 0 : std::max(1u, buffers / 4))),
      ahead_cap_(std::min(read_ahead_buffers, cap_ > 0 ? cap_ - 1 : 0)) {
  free_.reserve(buffers);
  for (std::uint32_t i = 0; i < buffers; ++i) free_.push_back(static_cast<int>(i));
  check();
}

void StagingAccounting::check() const {
  TZ_ASSERT(free_.size() + held_[kRead] + held_[kWrite] == is_free_.size(),
            "staging: free and held buffers do not add up to the buffers");
  TZ_ASSERT(held_[kRead] <= cap_ && held_[kWrite] <= cap_, "staging: a direction past its share");
  TZ_ASSERT(ahead_held_ <= ahead_cap_ && ahead_held_ <= held_[kRead],
            "staging: reads ahead past their bound");
}

std::uint32_t StagingAccounting::held(std::size_t dir) const {
  TZ_ASSERT(dir == kRead || dir == kWrite, "staging: no such direction");
  return held_[dir];
}

int StagingAccounting::take(std::size_t dir, bool ahead) {
  check();
  TZ_ASSERT(dir == kRead || dir == kWrite, "staging: no such direction");
  TZ_ASSERT(!ahead || dir == kRead, "staging: a read ahead is a read");
  if (free_.empty() || held_[dir] >= cap_) return -1;
  if (ahead && ahead_held_ >= ahead_cap_) return -1;
  const int s = free_.back();
  free_.pop_back();
  is_free_[static_cast<std::size_t>(s)] = false;
  ++held_[dir];
  if (ahead) ++ahead_held_;
  return s;
}

void StagingAccounting::give_back(int index, std::size_t dir, bool ahead) {
  check();
  TZ_ASSERT(index >= 0 && static_cast<std::size_t>(index) < is_free_.size(),
            "staging: no such buffer");
  TZ_ASSERT(!is_free_[static_cast<std::size_t>(index)], "staging: giving back a free buffer");
  TZ_ASSERT(dir == kRead || dir == kWrite, "staging: no such direction");
  TZ_ASSERT(held_[dir] > 0, "staging: giving back a buffer its direction does not hold");
  TZ_ASSERT(!ahead || (dir == kRead && ahead_held_ > 0),
            "staging: giving back a read ahead that is not held");
  free_.push_back(index);
  is_free_[static_cast<std::size_t>(index)] = true;
  --held_[dir];
  if (ahead) --ahead_held_;
  check();
}

void StagingAccounting::hand_over_ahead() {
  check();
  TZ_ASSERT(ahead_held_ > 0, "staging: handing over a read ahead that is not held");
  --ahead_held_;
}

void StagingAccounting::reserve(BlockId block, std::uint32_t pieces) {
  check();
  TZ_ASSERT(block != 0 && pieces > 0, "staging: an empty reservation");
  const bool added = reservations_.emplace(block, pieces).second;
  TZ_ASSERT(added, "staging: the block holds a reservation already");
  reserved_total_ += pieces;
}

std::uint32_t StagingAccounting::unreserve(BlockId block, std::uint32_t pieces) {
  check();
  auto it = reservations_.find(block);
  if (it == reservations_.end()) {
    TZ_ASSERT(pieces == 0, "staging: taking back pieces of a block that reserved none");
    return 0;
  }
  TZ_ASSERT(it->second >= pieces && reserved_total_ >= pieces,
            "staging: taking back more pieces than the block reserved");
  it->second -= pieces;
  reserved_total_ -= pieces;
  const std::uint32_t left = it->second;
  if (left == 0) reservations_.erase(it);
  return left;
}

std::uint32_t StagingAccounting::reserved(BlockId block) const {
  auto it = reservations_.find(block);
  return it == reservations_.end() ? 0 : it->second;
}

}  // namespace tz::store
