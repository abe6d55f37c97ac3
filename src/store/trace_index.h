// The store's trace index (DESIGN.md, "The store": trace-driven prefetch and eviction): the
// order of pins recorded during a step, the trace the next step follows (the previous step's
// record) with its next-use index, the position in it, whether the step still follows it, and
// the early write-back spills learned per step. It answers "how far ahead is this block's next
// use" (Belady's key, the prefetch walk's horizon) and owns the pin's rollback: a pin takes its
// trace position before placement (victims are chosen by the uses after it) and is undone with
// undo_pin when placement fails. No threads, no device, no blocks: the store calls it under its
// lock and keeps what a deviation means for the rest of it (victim keys, read ahead);
// tests/unit/store/trace_index_test.cc drives it with hand-written traces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "store/store.h"
#include "store/store_internal.h"

namespace tz::store {

class TraceIndex {
 public:
  // A pin's trace bookkeeping as it was before the pin (begin_pin), for undo_pin.
  struct PinMark {
    std::size_t pos = 0;          // the trace position
    bool following = false;       // whether the step followed the trace
    bool noted = false;           // whether the pin went into the record (NVMe pins do not)
    std::size_t record_size = 0;  // the record's length before the pin
  };

  // Takes the position of pin `e` when `noted` (NVMe pins are not recorded): it goes into the
  // record and, while the step follows the trace, either matches the trace's next entry (the
  // position moves on) or leaves the trace for the rest of the step (left_trace(mark) then says
  // so; the store counts the deviation and falls back to LRU).
  PinMark begin_pin(const TraceEntry& e, bool noted);
  // Whether the pin that returned `mark` made the step leave the trace.
  bool left_trace(const PinMark& mark) const { return mark.following && !following_; }
  // Undoes the last begin_pin (the pin could not be placed): the pin leaves the record and the
  // position and following state are as before it. It must be the last pin taken. Returns
  // whether the undone pin had left the trace (the store then takes its deviation back and
  // rebuilds the victim keys, which are trace positions again).
  bool undo_pin(const PinMark& mark);

  // Ends the step. With `adopt_record` (policy kTrace) the record becomes the trace, indexed,
  // and the next step follows it if it is not empty; `nvme_homed(block)` says which blocks live
  // on NVMe (has_nvme_blocks, has_host_loads). Spills learned while the step followed the trace
  // become the next step's (a recording step's LRU evictions say nothing about Belady's). The
  // record and the position start over.
  void end_step(bool adopt_record, const std::function<bool(BlockId)>& nvme_homed);

  bool following() const { return following_; }
  std::size_t pos() const { return pos_; }
  std::size_t size() const { return trace_.size(); }
  bool empty() const { return trace_.empty(); }
  // The trace entry `d` pins ahead of the position (wrapping into the next step's repeat), and
  // the entry at position `i`.
  const TraceEntry& ahead(std::size_t d) const;
  const TraceEntry& at(std::size_t i) const;
  // Length of the record of this step so far.
  std::size_t recorded() const { return record_.size(); }
  // The record position of the last pin recorded (kNoPos when none yet): where a write pin's
  // bytes were written, for the spill bookkeeping.
  std::uint32_t last_recorded() const;

  // Distance in pins from the position to the next use of `block`'s copy in `tier` (kNever when
  // none): a device copy serves device pins; a host copy serves host pins and device pins once
  // the device copy is gone, so it counts pins of every tier. A copy whose block is overwritten
  // (a write-only pin) before its next use holds dead bytes: kNever. With `from`, the next use
  // at or past `from` pins ahead (still counted from the position).
  std::uint64_t next_use(BlockId block, Tier tier, std::uint64_t from = 0) const;
  // Distance to the block's next write-only pin (kNever when none).
  std::uint64_t next_overwrite(BlockId block) const;
  // Whether the trace pins an NVMe-homed block, and reads one in the host tier (set by end_step).
  bool has_nvme_blocks() const { return has_nvme_blocks_; }
  bool has_host_loads() const { return has_host_loads_; }

  // Early write-back: the bytes of the write pin at record position `pos` had to go home
  // (noted while following the trace), and whether in the last step that followed the trace the
  // bytes of the pin at `pos` did.
  void note_spill(std::uint32_t pos);
  bool spilled(std::uint32_t pos) const { return spill_trace_.count(pos) > 0; }

 private:
  using Uses = std::unordered_map<BlockId, std::vector<std::uint32_t>>;
  // Distance from the position to the first entry of `uses` for `block` at least `from` pins
  // ahead of it, wrapping around the trace.
  std::uint64_t next_in(const Uses& uses, BlockId block, std::uint64_t from = 0) const;
  void build(const std::function<bool(BlockId)>& nvme_homed);
  void check() const;  // the state every entry point starts from

  std::vector<TraceEntry> trace_;
  std::vector<TraceEntry> record_;
  std::size_t pos_ = 0;
  bool following_ = false;
  bool has_nvme_blocks_ = false;
  bool has_host_loads_ = false;
  Uses dev_uses_;   // positions of device read pins, ascending
  Uses any_uses_;   // positions of read pins of any tier
  Uses overwrites_; // positions of write-only pins
  // Record positions of write pins whose bytes went home before being overwritten (in the pin's
  // own step or the next), learned during this step, and those of the last step that followed
  // the trace.
  std::unordered_set<std::uint32_t> spill_record_;
  std::unordered_set<std::uint32_t> spill_trace_;
};

}  // namespace tz::store
