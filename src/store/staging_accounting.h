// The store's staging accounting (DESIGN.md, "The store": the NVMe <-> device pipeline): which
// of the pinned staging buffers are free, how many each direction holds (NVMe -> device reads
// and device -> NVMe writes may each hold at most `cap()`, so that a run of write-backs, whose
// pieces are ready at once, cannot take every buffer while reads wait), how many hold pieces
// read ahead (at most `ahead_cap()`, below the read direction's share, so that the reads of
// decided loads always get a buffer in the end), and the pieces the policy reserved per block for
// reads ahead. Buffers are named by their index; the bytes stay with the store. No threads, no
// device: the mover and the policy call it under the store's lock, and
// tests/unit/store/staging_accounting_test.cc drives it by hand.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "store/store.h"

namespace tz::store {

class StagingAccounting {
 public:
  // The directions a staging buffer is held for.
  static constexpr std::size_t kRead = 0;   // NVMe -> device (and reads ahead)
  static constexpr std::size_t kWrite = 1;  // device -> NVMe

  StagingAccounting() = default;
  // `buffers` staging buffers, all free. Each direction leaves a quarter of them (at least one,
  // when there are two or more) to the other; reads ahead hold at most `read_ahead_buffers`, and
  // at most the read direction's share less one.
  StagingAccounting(std::uint32_t buffers, std::uint32_t read_ahead_buffers);

  // Takes a free buffer for a piece moving in `dir` (a read ahead when `ahead`, which must be a
  // read). Returns its index, or -1 when no buffer is free, `dir` holds its share, or (`ahead`)
  // reads ahead hold theirs. The buffer most recently given back comes first.
  int take(std::size_t dir, bool ahead);
  // Gives back buffer `index`, held for `dir` (counted as a read ahead when `ahead`).
  void give_back(int index, std::size_t dir, bool ahead);
  // A piece read ahead is taken by its block's load: its buffer stays held by the read direction
  // and no longer counts against the read-ahead bound.
  void hand_over_ahead();

  // Reserves `pieces` (> 0) for reads ahead of `block`, which holds no reservation.
  void reserve(BlockId block, std::uint32_t pieces);
  // Takes back `pieces` of `block`'s reservation (at most what it holds). Returns what is left;
  // at 0 the block holds no reservation any more.
  std::uint32_t unreserve(BlockId block, std::uint32_t pieces);
  std::uint32_t reserved(BlockId block) const;
  // The blocks holding a reservation and their pieces, by block id.
  const std::map<BlockId, std::uint32_t>& reservations() const { return reservations_; }

  std::uint32_t buffers() const { return static_cast<std::uint32_t>(is_free_.size()); }
  std::uint32_t cap() const { return cap_; }
  std::uint32_t ahead_cap() const { return ahead_cap_; }
  std::uint32_t free_count() const { return static_cast<std::uint32_t>(free_.size()); }
  std::uint32_t held(std::size_t dir) const;
  std::uint32_t ahead_held() const { return ahead_held_; }
  std::uint32_t reserved_total() const { return reserved_total_; }

 private:
  void check() const;  // the state every entry point starts from (O(1))

  std::vector<int> free_;        // free buffers, the last given back at the end
  std::vector<bool> is_free_;    // per buffer
  std::array<std::uint32_t, 2> held_{};
  std::uint32_t cap_ = 0;
  std::uint32_t ahead_cap_ = 0;
  std::uint32_t ahead_held_ = 0;
  std::map<BlockId, std::uint32_t> reservations_;
  std::uint32_t reserved_total_ = 0;
};

}  // namespace tz::store
