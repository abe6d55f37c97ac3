// BusyUnion (core/busy_union.h) with real threads and sleeps. The reference is the test's own
// clock read around each enter() and leave(): the union of the intervals lies between the union
// of [after enter, before leave] and the union of [before enter, after leave], whatever the
// machine's load, so the checks hold on a busy machine too (they assert correctness, not speed).
#include "core/busy_union.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace tz {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono_literals::operator""ms;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One user's interval as the test saw it: [enter_before, enter_after] around enter(),
// [leave_before, leave_after] around leave().
struct Interval {
  Clock::time_point enter_before, enter_after, leave_before, leave_after;
};

// enter() and leave() with the clock read on either side.
void timed_enter(BusyUnion& u, Interval& i) {
  i.enter_before = Clock::now();
  u.enter();
  i.enter_after = Clock::now();
}

void timed_leave(BusyUnion& u, Interval& i) {
  i.leave_before = Clock::now();
  u.leave();
  i.leave_after = Clock::now();
}

Interval busy_for(BusyUnion& u, std::chrono::milliseconds d) {
  Interval i;
  timed_enter(u, i);
  std::this_thread::sleep_for(d);
  timed_leave(u, i);
  return i;
}

TEST(BusyUnion, OneUser) {
  BusyUnion u;
  EXPECT_EQ(u.seconds(), 0.0);
  const Interval i = busy_for(u, 100ms);
  EXPECT_GE(u.seconds(), seconds_between(i.enter_after, i.leave_before));
  EXPECT_LE(u.seconds(), seconds_between(i.enter_before, i.leave_after));
  // Idle time after the leave does not count.
  const double s = u.seconds();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(u.seconds(), s);
}

// Two disjoint intervals (100 ms idle between them): the union is their sum.
TEST(BusyUnion, DisjointIntervalsAdd) {
  BusyUnion u;
  const Interval a = busy_for(u, 100ms);
  std::this_thread::sleep_for(100ms);
  const Interval b = busy_for(u, 150ms);
  const double low = seconds_between(a.enter_after, a.leave_before) +
                     seconds_between(b.enter_after, b.leave_before);
  const double high = seconds_between(a.enter_before, a.leave_after) +
                      seconds_between(b.enter_before, b.leave_after);
  EXPECT_GE(u.seconds(), low);
  EXPECT_LE(u.seconds(), high);
  EXPECT_GE(u.seconds(), 0.25);
}

// Two threads whose intervals overlap (B enters while A is busy, A stays busy 200 ms more): the
// union runs from A's enter to the later leave, and is well below the sum of the two intervals.
TEST(BusyUnion, OverlappingThreadsCountOnce) {
  BusyUnion u;
  std::mutex mu;
  std::condition_variable cv;
  bool a_in = false, b_in = false;
  Interval a, b;
  std::thread ta([&] {
    timed_enter(u, a);
    {
      std::unique_lock lock(mu);
      a_in = true;
      cv.notify_all();
      cv.wait(lock, [&] { return b_in; });
    }
    std::this_thread::sleep_for(200ms);
    timed_leave(u, a);
  });
  std::thread tb([&] {
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return a_in; });
    }
    timed_enter(u, b);
    {
      std::lock_guard lock(mu);
      b_in = true;
      cv.notify_all();
    }
    std::this_thread::sleep_for(250ms);
    timed_leave(u, b);
  });
  ta.join();
  tb.join();
  const double low = seconds_between(a.enter_after, std::max(a.leave_before, b.leave_before));
  const double high = seconds_between(a.enter_before, std::max(a.leave_after, b.leave_after));
  EXPECT_GE(u.seconds(), low);
  EXPECT_LE(u.seconds(), high);
  const double sum = seconds_between(a.enter_after, a.leave_before) +
                     seconds_between(b.enter_after, b.leave_before);
  // B entered before A's last 200 ms began, so the intervals share at least those 200 ms; the
  // margin leaves 100 ms for the test's clock readings around the calls.
  EXPECT_LE(u.seconds(), sum - 0.1) << "the overlap was counted twice";
}

// Nested users on one thread, and seconds() read while a user is still busy (a window's delta
// includes the interval still open).
TEST(BusyUnion, NestedUsersAndOpenInterval) {
  BusyUnion u;
  const Clock::time_point before = Clock::now();
  u.enter();
  const Clock::time_point after = Clock::now();
  {
    BusyScope inner(u);
    std::this_thread::sleep_for(50ms);
  }
  std::this_thread::sleep_for(50ms);
  const Clock::time_point read_before = Clock::now();
  const double open = u.seconds();
  const Clock::time_point read_after = Clock::now();
  EXPECT_GE(open, seconds_between(after, read_before));
  EXPECT_LE(open, seconds_between(before, read_after));
  u.leave();
  EXPECT_GE(u.seconds(), open);
}

}  // namespace
}  // namespace tz
