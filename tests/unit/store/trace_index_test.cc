// The store's trace index (store/trace_index.h) on hand-written traces: no threads, no device, no
// blocks. Each expected distance is counted by hand from the trace written next to it (positions
// 0-based; the distance from position p to a use at q >= p is q - p, and to an earlier one,
// wrapping into the next step, len - p + q).
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "store/trace_index.h"

namespace tz::store {
namespace {

TraceEntry dev(BlockId b, Access a = Access::kRead) { return TraceEntry{b, Tier::kDevice, a}; }
TraceEntry host(BlockId b, Access a = Access::kRead) { return TraceEntry{b, Tier::kHost, a}; }

const auto kAllNvme = [](BlockId) { return true; };
const auto kNoneNvme = [](BlockId) { return false; };

// Records `pins` in one step and ends it with the policy kTrace.
void record_step(TraceIndex& t, const std::vector<TraceEntry>& pins,
                 const std::function<bool(BlockId)>& nvme_homed = kAllNvme) {
  for (const TraceEntry& e : pins) (void)t.begin_pin(e, true);
  t.end_step(true, nvme_homed);
}

TEST(TraceIndex, TheRecordBecomesTheTraceFollowedNextStep) {
  TraceIndex t;
  EXPECT_FALSE(t.following());
  EXPECT_TRUE(t.empty());
  //                  0       1       2        3
  record_step(t, {dev(1), dev(2), host(3), dev(1)});
  EXPECT_TRUE(t.following());
  EXPECT_EQ(t.size(), 4u);
  EXPECT_EQ(t.pos(), 0u);
  EXPECT_EQ(t.recorded(), 0u);
  EXPECT_EQ(t.ahead(2), host(3));
  EXPECT_EQ(t.at(3), dev(1));
  // Following the trace moves the position one pin at a time.
  const TraceIndex::PinMark m = t.begin_pin(dev(1), true);
  EXPECT_FALSE(t.left_trace(m));
  EXPECT_EQ(t.pos(), 1u);
  EXPECT_EQ(t.recorded(), 1u);
  EXPECT_EQ(t.last_recorded(), 0u);
  EXPECT_EQ(t.ahead(0), dev(2));
  EXPECT_EQ(t.ahead(3), dev(1));  // wraps into the next repeat
}

TEST(TraceIndex, NextUsePerTierCountsPinsAheadAndWraps) {
  TraceIndex t;
  // 0: dev 1, 1: host 2, 2: dev 2, 3: host 1, 4: dev 3
  record_step(t, {dev(1), host(2), dev(2), host(1), dev(3)});
  // At position 0.
  EXPECT_EQ(t.next_use(1, Tier::kDevice), 0u);
  EXPECT_EQ(t.next_use(2, Tier::kDevice), 2u);
  EXPECT_EQ(t.next_use(2, Tier::kHost), 1u);  // a host copy serves host pins (position 1)
  EXPECT_EQ(t.next_use(3, Tier::kHost), 4u);  // and device pins (position 4)
  EXPECT_EQ(t.next_use(9, Tier::kDevice), kNever);  // never pinned
  (void)t.begin_pin(dev(1), true);
  (void)t.begin_pin(host(2), true);
  // At position 2: block 1's next device use is position 0 of the next repeat: 5 - 2 + 0.
  EXPECT_EQ(t.next_use(1, Tier::kDevice), 3u);
  EXPECT_EQ(t.next_use(1, Tier::kHost), 1u);  // host 1 at position 3
  EXPECT_EQ(t.next_use(2, Tier::kDevice), 0u);
  EXPECT_EQ(t.next_use(2, Tier::kHost), 0u);  // dev 2 at position 2 counts for a host copy
  (void)t.begin_pin(dev(2), true);
  (void)t.begin_pin(host(1), true);
  (void)t.begin_pin(dev(3), true);
  // At the end (position 5): every use is in the next repeat.
  EXPECT_EQ(t.pos(), 5u);
  EXPECT_EQ(t.next_use(1, Tier::kDevice), 0u);
  EXPECT_EQ(t.next_use(2, Tier::kHost), 1u);
  EXPECT_EQ(t.next_use(3, Tier::kDevice), 4u);
}

// next_use(block, tier, from): the first use at least `from` pins ahead, still counted from the
// position (the use after one the prefetch walk skips).
TEST(TraceIndex, NextUseFromAPinAheadCountsFromThePosition) {
  TraceIndex t;
  // 0: dev 1, 1: dev 2, 2: dev 1, 3: host 3, 4: dev 2 write-only, 5: dev 2
  record_step(t, {dev(1), dev(2), dev(1), host(3), dev(2, Access::kWrite), dev(2)});
  (void)t.begin_pin(dev(1), true);
  // At position 1.
  EXPECT_EQ(t.next_use(1, Tier::kDevice, 0), 1u);
  EXPECT_EQ(t.next_use(1, Tier::kDevice, 1), 1u);
  EXPECT_EQ(t.next_use(1, Tier::kDevice, 2), 5u);  // past position 2: 0 of the next repeat
  EXPECT_EQ(t.next_use(2, Tier::kDevice, 0), 0u);
  EXPECT_EQ(t.next_use(2, Tier::kDevice, 1), kNever);  // overwritten (4) before its read (5)
  EXPECT_EQ(t.next_use(2, Tier::kDevice, 3), kNever);  // from position 4, the overwrite
  EXPECT_EQ(t.next_use(2, Tier::kDevice, 4), 4u);      // from position 5, the read
  EXPECT_EQ(t.next_use(2, Tier::kDevice, 5), 6u);  // 1 of the next repeat: 6 - 1 + 1
  EXPECT_EQ(t.next_use(3, Tier::kHost, 2), 2u);
  EXPECT_EQ(t.next_use(3, Tier::kHost, 3), 8u);  // 3 of the next repeat: 6 - 1 + 3
  for (int i = 0; i < 5; ++i) (void)t.begin_pin(t.ahead(0), true);
  // At the end (position 6): `from` counts into the repeat after the next.
  EXPECT_EQ(t.pos(), 6u);
  EXPECT_EQ(t.next_use(1, Tier::kDevice, 3), 6u);
  EXPECT_EQ(t.next_use(1, Tier::kDevice, 7), 8u);  // 2 of the repeat after: 12 + 2 - 6
}

TEST(TraceIndex, AnOverwriteBeforeTheNextReadMeansNeverAgain) {
  TraceIndex t;
  // 0: dev 1, 1: dev 1 write-only, 2: dev 1, 3: dev 2
  record_step(t, {dev(1), dev(1, Access::kWrite), dev(1), dev(2, Access::kReadWrite)});
  (void)t.begin_pin(dev(1), true);
  // At position 1 the next pin of 1 overwrites it: the bytes held now are dead.
  EXPECT_EQ(t.next_overwrite(1), 0u);
  EXPECT_EQ(t.next_use(1, Tier::kDevice), kNever);
  EXPECT_EQ(t.next_use(1, Tier::kHost), kNever);
  // A read-write pin is a use (it needs the bytes), not an overwrite.
  EXPECT_EQ(t.next_overwrite(2), kNever);
  EXPECT_EQ(t.next_use(2, Tier::kDevice), 2u);
  (void)t.begin_pin(dev(1, Access::kWrite), true);
  // At position 2 the read comes first (2), the overwrite next repeat (4 - 2 + 1).
  EXPECT_EQ(t.next_overwrite(1), 3u);
  EXPECT_EQ(t.next_use(1, Tier::kDevice), 0u);
}

TEST(TraceIndex, ADeviationLeavesTheTraceForTheRestOfTheStep) {
  TraceIndex t;
  record_step(t, {dev(1), dev(2), dev(3)});
  (void)t.begin_pin(dev(1), true);
  const TraceIndex::PinMark m = t.begin_pin(dev(3), true);  // the trace says 2
  EXPECT_TRUE(t.left_trace(m));
  EXPECT_FALSE(t.following());
  EXPECT_EQ(t.pos(), 1u);  // the position stays where the trace was left
  // Later pins neither move the position nor count as deviations.
  const TraceIndex::PinMark later = t.begin_pin(dev(2), true);
  EXPECT_FALSE(t.left_trace(later));
  EXPECT_EQ(t.pos(), 1u);
  // The step's record (1, 3, 2) is the next trace, followed from its start.
  t.end_step(true, kAllNvme);
  EXPECT_TRUE(t.following());
  EXPECT_EQ(t.at(0), dev(1));
  EXPECT_EQ(t.at(1), dev(3));
  EXPECT_EQ(t.at(2), dev(2));
}

TEST(TraceIndex, UndoPinRestoresRecordPositionAndFollowing) {
  TraceIndex t;
  record_step(t, {dev(1), dev(2), dev(3)});
  (void)t.begin_pin(dev(1), true);
  // A pin that follows the trace, undone: the position goes back and the record forgets it.
  TraceIndex::PinMark m = t.begin_pin(dev(2), true);
  EXPECT_EQ(t.pos(), 2u);
  EXPECT_FALSE(t.undo_pin(m));
  EXPECT_EQ(t.pos(), 1u);
  EXPECT_EQ(t.recorded(), 1u);
  EXPECT_TRUE(t.following());
  // A pin that left the trace, undone: the step follows the trace again.
  m = t.begin_pin(dev(3), true);
  EXPECT_FALSE(t.following());
  EXPECT_TRUE(t.undo_pin(m));
  EXPECT_TRUE(t.following());
  EXPECT_EQ(t.pos(), 1u);
  EXPECT_EQ(t.recorded(), 1u);
  // The retried pin follows the trace as if the failed ones never happened.
  m = t.begin_pin(dev(2), true);
  EXPECT_FALSE(t.left_trace(m));
  EXPECT_EQ(t.pos(), 2u);
  // A pin that is not recorded (an NVMe pin) changes nothing and undoes to nothing.
  m = t.begin_pin(TraceEntry{3, Tier::kNvme, Access::kRead}, false);
  EXPECT_EQ(t.recorded(), 2u);
  EXPECT_FALSE(t.undo_pin(m));
  EXPECT_EQ(t.recorded(), 2u);
  EXPECT_EQ(t.pos(), 2u);
}

TEST(TraceIndex, UndoingAPinThatIsNotTheLastIsAProgrammerError) {
  TraceIndex t;
  const TraceIndex::PinMark first = t.begin_pin(dev(1), true);
  (void)t.begin_pin(dev(2), true);
  EXPECT_DEATH((void)t.undo_pin(first), "not the last one taken");
  EXPECT_DEATH((void)t.begin_pin(dev(0), true), "no block");
}

TEST(TraceIndex, WithoutAdoptingTheRecordNothingIsFollowed) {
  TraceIndex t;  // policy kLru: the record is dropped at every step's end
  for (BlockId b = 1; b <= 3; ++b) (void)t.begin_pin(dev(b), true);
  t.end_step(false, kAllNvme);
  EXPECT_FALSE(t.following());
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.recorded(), 0u);
  EXPECT_EQ(t.next_use(1, Tier::kDevice), kNever);
}

TEST(TraceIndex, AnEmptyStepIsNotFollowed) {
  TraceIndex t;
  record_step(t, {dev(1)});
  EXPECT_TRUE(t.following());
  t.end_step(true, kAllNvme);  // a step without pins
  EXPECT_FALSE(t.following());
  EXPECT_TRUE(t.empty());
}

TEST(TraceIndex, NvmeBlocksAndHostLoadsAreNotedPerTrace) {
  TraceIndex t;
  record_step(t, {dev(1), host(2)}, kNoneNvme);
  EXPECT_FALSE(t.has_nvme_blocks());
  EXPECT_FALSE(t.has_host_loads());
  const std::set<BlockId> nvme = {1};
  record_step(t, {dev(1), host(2)}, [&](BlockId b) { return nvme.contains(b); });
  EXPECT_TRUE(t.has_nvme_blocks());
  EXPECT_FALSE(t.has_host_loads());  // 2 is read in the host tier but lives there
  record_step(t, {dev(2), host(1)}, [&](BlockId b) { return nvme.contains(b); });
  EXPECT_TRUE(t.has_host_loads());
  // A write-only host pin of an NVMe block loads nothing.
  record_step(t, {host(1, Access::kWrite)}, [&](BlockId b) { return nvme.contains(b); });
  EXPECT_TRUE(t.has_nvme_blocks());
  EXPECT_FALSE(t.has_host_loads());
}

TEST(TraceIndex, SpillsLearnedWhileFollowingCarryToTheNextStepOnly) {
  TraceIndex t;
  // Recording step: a spill noted now says nothing about Belady's evictions.
  (void)t.begin_pin(dev(1, Access::kReadWrite), true);
  t.note_spill(t.last_recorded());
  t.end_step(true, kAllNvme);
  EXPECT_FALSE(t.spilled(0));
  // A step that follows the trace: its spills are the next step's.
  (void)t.begin_pin(dev(1, Access::kReadWrite), true);
  t.note_spill(0);
  EXPECT_FALSE(t.spilled(0));  // not before the step ends
  t.end_step(true, kAllNvme);
  EXPECT_TRUE(t.spilled(0));
  EXPECT_FALSE(t.spilled(1));
  // A step that leaves the trace: nothing carries over.
  (void)t.begin_pin(dev(2), true);
  t.note_spill(0);
  t.end_step(true, kAllNvme);
  EXPECT_FALSE(t.spilled(0));
}

}  // namespace
}  // namespace tz::store
