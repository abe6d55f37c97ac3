// The store's I/O scheduler (store/io_scheduler.h) on hand-written queues: no threads, no disk.
// Each test writes out which jobs a pick must return, in which order, from the rules in the
// header (arrival order in kMixed; reads first and one direction at a time in kGrouped; the
// in-flight byte bound; waited-for writes before deferrable ones).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "store/io_scheduler.h"

namespace tz::store {
namespace {

constexpr std::uint64_t k4K = 4096;

IoJob job(BlockId block, nvme::IoOp dir, std::uint64_t bytes = k4K) {
  IoJob j;
  j.block = block;
  j.dir = dir;
  j.io_bytes = bytes;
  return j;
}
IoJob read(BlockId block, std::uint64_t bytes = k4K) { return job(block, nvme::IoOp::kRead, bytes); }
IoJob write(BlockId block, std::uint64_t bytes = k4K) {
  return job(block, nvme::IoOp::kWrite, bytes);
}

// "r1 w2": the picked jobs as direction and block.
std::string names(const std::vector<IoJob>& jobs) {
  std::string s;
  for (const IoJob& j : jobs) {
    if (!s.empty()) s += ' ';
    s += (j.dir == nvme::IoOp::kRead ? "r" : "w") + std::to_string(j.block);
  }
  return s;
}

const auto kNothingDeferrable = [](BlockId) { return false; };

TEST(IoScheduler, MixedTakesArrivalOrderWithinTheBound) {
  IoScheduler io(IoGrouping::kMixed, 2 * k4K, 1ull << 30);
  io.queue(read(1));
  io.queue(write(2));
  io.queue(read(3));
  std::vector<IoJob> first = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(first), "r1 w2");  // r3 would make 12 KiB in flight
  EXPECT_EQ(io.in_flight_bytes(), 2 * k4K);
  EXPECT_EQ(io.in_flight_reads(), 1u);
  EXPECT_EQ(io.in_flight_writes(), 1u);
  EXPECT_EQ(names(io.pick(kNothingDeferrable)), "");
  io.complete(first[0]);
  EXPECT_EQ(names(io.pick(kNothingDeferrable)), "r3");
  EXPECT_FALSE(io.empty());
}

TEST(IoScheduler, AJobLargerThanTheBoundStillRunsOnAnIdleDisk) {
  IoScheduler io(IoGrouping::kMixed, k4K, 1ull << 30);
  io.queue(read(1, 16 * k4K));
  io.queue(read(2));
  std::vector<IoJob> got = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(got), "r1");
  io.complete(got[0]);
  got = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(got), "r2");
  io.complete(got[0]);
  EXPECT_TRUE(io.empty());
}

TEST(IoScheduler, GroupedReadsFirstThenWritesOnceReadsDrain) {
  IoScheduler io(IoGrouping::kGrouped, 1ull << 20, 1ull << 30);
  io.queue(write(1));
  io.queue(read(2));
  io.queue(read(3));
  std::vector<IoJob> reads = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(reads), "r2 r3");
  EXPECT_FALSE(io.writing());
  EXPECT_EQ(names(io.pick(kNothingDeferrable)), "");  // the reads are still in flight
  io.complete(reads[0]);
  EXPECT_EQ(names(io.pick(kNothingDeferrable)), "");
  io.complete(reads[1]);
  std::vector<IoJob> writes = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(writes), "w1");
  EXPECT_TRUE(io.writing());
  // A read arriving while writes are in flight waits for them.
  io.queue(read(4));
  EXPECT_EQ(names(io.pick(kNothingDeferrable)), "");
  io.complete(writes[0]);
  EXPECT_EQ(names(io.pick(kNothingDeferrable)), "r4");
}

TEST(IoScheduler, GroupedSwitchesAfterARunWhenTheOtherSideWaits) {
  // Runs of 8 KiB: two reads, then the waiting write, then the last read.
  IoScheduler io(IoGrouping::kGrouped, 1ull << 20, 2 * k4K);
  io.queue(read(1));
  io.queue(read(2));
  io.queue(read(3));
  io.queue(write(4));
  std::vector<IoJob> got = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(got), "r1 r2");
  for (const IoJob& j : got) io.complete(j);
  got = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(got), "w4");
  for (const IoJob& j : got) io.complete(j);
  got = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(got), "r3");
  for (const IoJob& j : got) io.complete(j);
  EXPECT_TRUE(io.empty());
}

TEST(IoScheduler, GroupedKeepsARunGoingWhileTheOtherSideIsEmpty) {
  IoScheduler io(IoGrouping::kGrouped, 1ull << 20, k4K);
  for (BlockId b = 1; b <= 4; ++b) io.queue(read(b));
  EXPECT_EQ(names(io.pick(kNothingDeferrable)), "r1 r2 r3 r4");
}

TEST(IoScheduler, WaitedForWritesGoBeforeDeferrableOnes) {
  IoScheduler io(IoGrouping::kMixed, 1ull << 20, 1ull << 30);
  io.queue(write(1));  // early write-back nothing waits for
  io.queue(write(2));
  io.queue(write(3));  // early too
  io.queue(write(4));
  const std::set<BlockId> early = {1, 3};
  EXPECT_EQ(names(io.pick([&](BlockId b) { return early.contains(b); })), "w2 w4 w1 w3");
}

TEST(IoScheduler, MixedInterleavesReadsWithWaitedForWritesAheadOfDeferrableOnes) {
  // Arrival: w1 (early, 0), r2 (1), w3 (2), r4 (3). Waited-for writes move ahead of deferrable
  // ones among the writes (w3 w1); the two queues' heads then go by arrival: r2 (1) before
  // w3 (2), w1 (0) before r4 (3).
  IoScheduler io(IoGrouping::kMixed, 1ull << 20, 1ull << 30);
  io.queue(write(1));
  io.queue(read(2));
  io.queue(write(3));
  io.queue(read(4));
  EXPECT_EQ(names(io.pick([](BlockId b) { return b == 1; })), "r2 w3 w1 r4");
  EXPECT_EQ(io.in_flight_reads(), 2u);
  EXPECT_EQ(io.in_flight_writes(), 2u);
  EXPECT_EQ(io.queued_reads() + io.queued_writes(), 0u);
}

TEST(IoScheduler, TheBoundCountsBothDirectionsAndCompletionsRefillIt) {
  // 12 KiB in flight at most: r1 (8 KiB) and w2 (4 KiB); r3 waits for one of them, w4 too.
  IoScheduler io(IoGrouping::kMixed, 3 * k4K, 1ull << 30);
  io.queue(read(1, 2 * k4K));
  io.queue(write(2));
  io.queue(read(3));
  io.queue(write(4));
  std::vector<IoJob> got = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(got), "r1 w2");
  EXPECT_EQ(io.in_flight_bytes(), 3 * k4K);
  io.complete(got[1]);  // w2 done: 4 KiB free, r3 fits
  std::vector<IoJob> next = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(next), "r3");
  io.complete(got[0]);  // r1 done: 8 KiB free, w4 fits
  EXPECT_EQ(names(io.pick(kNothingDeferrable)), "w4");
  EXPECT_EQ(io.in_flight_bytes(), 2 * k4K);
}

TEST(IoScheduler, GroupedWritesFirstWhenOnlyWritesWaitThenBackToReads) {
  // Nothing to read: the writes run; a read arriving meanwhile waits until the run is over
  // (8 KiB) and the writes in flight drain, then reads go.
  IoScheduler io(IoGrouping::kGrouped, 1ull << 20, 2 * k4K);
  io.queue(write(1));
  io.queue(write(2));
  io.queue(write(3));
  std::vector<IoJob> got = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(got), "w1 w2 w3");  // no read waits: the run goes on
  EXPECT_TRUE(io.writing());
  io.queue(write(4));
  io.queue(read(5));
  EXPECT_EQ(names(io.pick(kNothingDeferrable)), "");  // run over, reads wait for the drain
  for (const IoJob& j : got) io.complete(j);
  got = io.pick(kNothingDeferrable);
  EXPECT_EQ(names(got), "r5");
  EXPECT_FALSE(io.writing());
  io.complete(got[0]);
  EXPECT_EQ(names(io.pick(kNothingDeferrable)), "w4");
}

TEST(IoScheduler, MalformedJobsAreProgrammerErrors) {
  IoScheduler io(IoGrouping::kMixed, 1ull << 20, 1ull << 30);
  EXPECT_DEATH(io.queue(read(0)), "no block");
  EXPECT_DEATH(io.queue(read(1, 0)), "multiple of 4 KiB");
  EXPECT_DEATH(io.queue(read(1, 100)), "multiple of 4 KiB");
}

TEST(IoScheduler, CompletingWhatIsNotInFlightIsAProgrammerError) {
  IoScheduler io(IoGrouping::kMixed, 1ull << 20, 1ull << 30);
  EXPECT_DEATH(io.complete(read(1)), "in flight");
}

}  // namespace
}  // namespace tz::store
