// The store's staging accounting (store/staging_accounting.h) by hand: no threads, no device, no
// buffers. The shares are computed from the rule in the header: with n buffers each direction may
// hold n - max(1, n / 4) (all of them when n is 1), and reads ahead at most
// min(read_ahead_buffers, share - 1).
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "store/staging_accounting.h"

namespace tz::store {
namespace {

constexpr std::size_t kR = StagingAccounting::kRead;
constexpr std::size_t kW = StagingAccounting::kWrite;

TEST(StagingAccounting, SharesFollowTheBufferCount) {
  // n = 1: one buffer, both directions may take it, no read ahead.
  EXPECT_EQ(StagingAccounting(1, 4).cap(), 1u);
  EXPECT_EQ(StagingAccounting(1, 4).ahead_cap(), 0u);
  // n = 2: 2 - 1 = 1 each, read ahead min(4, 0) = 0.
  EXPECT_EQ(StagingAccounting(2, 4).cap(), 1u);
  EXPECT_EQ(StagingAccounting(2, 4).ahead_cap(), 0u);
  // n = 8: 8 - 2 = 6 each, read ahead min(4, 5) = 4.
  EXPECT_EQ(StagingAccounting(8, 4).cap(), 6u);
  EXPECT_EQ(StagingAccounting(8, 4).ahead_cap(), 4u);
  // n = 16 (bench store's demo): 16 - 4 = 12 each, read ahead min(8, 11) = 8.
  EXPECT_EQ(StagingAccounting(16, 8).cap(), 12u);
  EXPECT_EQ(StagingAccounting(16, 8).ahead_cap(), 8u);
  // n = 4 with a large read-ahead wish: 4 - 1 = 3 each, read ahead 3 - 1 = 2.
  EXPECT_EQ(StagingAccounting(4, 100).ahead_cap(), 2u);
}

TEST(StagingAccounting, EachDirectionStopsAtItsShareLeavingTheRestToTheOther) {
  StagingAccounting s(4, 0);  // share 3
  // The last buffer given back comes first: 3, 2, 1.
  EXPECT_EQ(s.take(kW, false), 3);
  EXPECT_EQ(s.take(kW, false), 2);
  EXPECT_EQ(s.take(kW, false), 1);
  EXPECT_EQ(s.take(kW, false), -1);  // writes hold their share; buffer 0 is the reads'
  EXPECT_EQ(s.held(kW), 3u);
  EXPECT_EQ(s.free_count(), 1u);
  EXPECT_EQ(s.take(kR, false), 0);
  EXPECT_EQ(s.take(kR, false), -1);  // none free
  s.give_back(2, kW, false);
  EXPECT_EQ(s.take(kR, false), 2);  // the one just given back
  EXPECT_EQ(s.held(kR), 2u);
  EXPECT_EQ(s.held(kW), 2u);
  EXPECT_EQ(s.free_count(), 0u);
}

TEST(StagingAccounting, ReadsAheadStopAtTheirBoundAndHandOverToTheirLoad) {
  StagingAccounting s(8, 2);  // share 6, read ahead 2
  const int a = s.take(kR, true);
  const int b = s.take(kR, true);
  EXPECT_EQ(a, 7);
  EXPECT_EQ(b, 6);
  EXPECT_EQ(s.take(kR, true), -1);  // two reads ahead held
  EXPECT_EQ(s.take(kR, false), 5);  // a decided read still gets one
  EXPECT_EQ(s.ahead_held(), 2u);
  EXPECT_EQ(s.held(kR), 3u);
  // The load takes piece a: still a read's buffer, no longer a read ahead.
  s.hand_over_ahead();
  EXPECT_EQ(s.ahead_held(), 1u);
  EXPECT_EQ(s.held(kR), 3u);
  EXPECT_EQ(s.take(kR, true), 4);  // room for another read ahead
  // Its copy done, a goes back as a plain read; a dropped read ahead goes back as one.
  s.give_back(a, kR, false);
  s.give_back(b, kR, true);
  EXPECT_EQ(s.ahead_held(), 1u);
  EXPECT_EQ(s.held(kR), 2u);
  EXPECT_EQ(s.free_count(), 6u);
}

TEST(StagingAccounting, ReservationsPerBlock) {
  StagingAccounting s(8, 4);
  s.reserve(9, 3);
  s.reserve(2, 1);
  EXPECT_EQ(s.reserved(9), 3u);
  EXPECT_EQ(s.reserved(5), 0u);
  EXPECT_EQ(s.reserved_total(), 4u);
  EXPECT_EQ(s.reservations(), (std::map<BlockId, std::uint32_t>{{2, 1}, {9, 3}}));
  EXPECT_EQ(s.unreserve(9, 2), 1u);
  EXPECT_EQ(s.unreserve(9, 1), 0u);  // the block holds none now
  EXPECT_EQ(s.reservations(), (std::map<BlockId, std::uint32_t>{{2, 1}}));
  EXPECT_EQ(s.unreserve(9, 0), 0u);  // nothing to take back of a block without one
  EXPECT_EQ(s.reserved_total(), 1u);
  s.reserve(9, 2);  // a new reservation once the old one is gone
  EXPECT_EQ(s.reserved_total(), 3u);
}

TEST(StagingAccounting, MisuseIsAProgrammerError) {
  StagingAccounting s(4, 2);
  const int r = s.take(kR, false);
  EXPECT_DEATH(s.give_back(r, kW, false), "does not hold");
  EXPECT_DEATH(s.give_back(0, kR, false), "free buffer");
  EXPECT_DEATH(s.give_back(9, kR, false), "no such buffer");
  EXPECT_DEATH(s.give_back(r, kR, true), "read ahead that is not held");
  EXPECT_DEATH((void)s.take(kW, true), "a read ahead is a read");
  EXPECT_DEATH(s.hand_over_ahead(), "not held");
  s.reserve(1, 2);
  EXPECT_DEATH(s.reserve(1, 1), "holds a reservation already");
  EXPECT_DEATH((void)s.unreserve(1, 3), "more pieces than the block reserved");
  EXPECT_DEATH((void)s.unreserve(4, 1), "reserved none");
  EXPECT_DEATH(s.reserve(2, 0), "empty reservation");
}

}  // namespace
}  // namespace tz::store
