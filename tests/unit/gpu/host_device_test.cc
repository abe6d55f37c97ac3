// HostDevice: the shared Device conformance checks, plus what only the CPU backend can show
// (concurrency between streams, concurrent allocation against the budget, queue bound).
#include "gpu/host_device.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "core/busy_union.h"
#include "device_conformance.h"

namespace tz::gpu {
namespace {

std::unique_ptr<HostDevice> make_device(std::uint64_t budget = 64ull << 20) {
  auto d = HostDevice::create(budget);
  TZ_ASSERT(d.is_ok());
  return std::move(*d);
}

TEST(HostDevice, BudgetIsExactAndNeverExceeded) { testing::check_budget_exact(*make_device(1 << 20)); }
TEST(HostDevice, Copies) { testing::check_copies(*make_device()); }
TEST(HostDevice, Fill) { testing::check_fill(*make_device()); }
TEST(HostDevice, Cast) { testing::check_cast(*make_device()); }
TEST(HostDevice, Scale) { testing::check_scale(*make_device()); }
TEST(HostDevice, SumSquares) { testing::check_sum_squares(*make_device()); }
TEST(HostDevice, SumSquaresInTheFixedOrder) { testing::check_sum_squares_fixed_order(*make_device()); }
TEST(HostDevice, EventOrdering) { testing::check_event_ordering(*make_device()); }
TEST(HostDevice, CallbackOrder) { testing::check_callback_order(*make_device()); }

TEST(HostDevice, KindAndName) {
  auto d = make_device();
  EXPECT_EQ(d->kind(), DeviceKind::kHost);
  EXPECT_TRUE(d->host_accessible());
  EXPECT_EQ(device_kind_name(d->kind()), "host");
}

// Work on two streams may overlap: A's callback waits for B's, which would never happen if the
// backend ran streams one after the other.
TEST(HostDevice, StreamsRunConcurrently) {
  auto d = make_device();
  auto a = d->create_stream("a");
  auto b = d->create_stream("b");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  std::mutex mu;
  std::condition_variable cv;
  bool b_ran = false;
  bool a_saw_b = false;
  ASSERT_TRUE(d->host_callback(**a, [&] {
    std::unique_lock lock(mu);
    a_saw_b = cv.wait_for(lock, std::chrono::seconds(20), [&] { return b_ran; });
  }).is_ok());
  ASSERT_TRUE(d->host_callback(**b, [&] {
    std::lock_guard lock(mu);
    b_ran = true;
    cv.notify_all();
  }).is_ok());
  ASSERT_TRUE(d->synchronize().is_ok());
  EXPECT_TRUE(a_saw_b);
}

// Chains of events across three streams: each stage adds one to a counter only after the stage
// before it; any early run shows up as a wrong value.
TEST(HostDevice, EventChainAcrossStreams) {
  auto d = make_device();
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Event>> events;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(d->create_stream("s" + std::to_string(i)).value());
    events.push_back(d->create_event().value());
  }
  std::vector<int> log;  // only touched in stream order, guarded by the event chain
  constexpr int kRounds = 300;
  for (int r = 0; r < kRounds; ++r) {
    for (int i = 0; i < 3; ++i) {
      Stream& s = *streams[static_cast<std::size_t>(i)];
      const std::size_t prev = static_cast<std::size_t>((i + 2) % 3);
      if (r > 0 || i > 0) {
        ASSERT_TRUE(s.wait(*events[prev]).is_ok());
      }
      ASSERT_TRUE(d->host_callback(s, [&log, r, i] { log.push_back(r * 3 + i); }).is_ok());
      ASSERT_TRUE(events[static_cast<std::size_t>(i)]->record(s).is_ok());
    }
  }
  ASSERT_TRUE(d->synchronize().is_ok());
  ASSERT_EQ(log.size(), static_cast<std::size_t>(kRounds * 3));
  for (int k = 0; k < kRounds * 3; ++k) ASSERT_EQ(log[static_cast<std::size_t>(k)], k);
}

TEST(HostDevice, EventSynchronizeWaitsForRecordedWork) {
  auto d = make_device();
  auto ev = d->create_event();
  ASSERT_TRUE(ev.is_ok());
  std::atomic<int> done{0};
  ASSERT_TRUE(d->host_callback(d->compute_stream(), [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    done.store(1);
  }).is_ok());
  ASSERT_TRUE((*ev)->record(d->compute_stream()).is_ok());
  ASSERT_TRUE((*ev)->synchronize().is_ok());
  EXPECT_EQ(done.load(), 1);
  EXPECT_TRUE(*(*ev)->query());
}

// Many threads allocating at once never take the pool past its budget.
TEST(HostDevice, ConcurrentAllocationsRespectBudget) {
  constexpr std::uint64_t kBudget = 1 << 20;
  auto d = make_device(kBudget);
  std::vector<std::thread> threads;
  std::atomic<std::uint64_t> refused{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(testing::test_seed() + static_cast<std::uint32_t>(t));
      std::vector<DeviceBuffer> mine;
      for (int i = 0; i < 500; ++i) {
        if (!mine.empty() && rng() % 2) {
          mine.pop_back();
        } else {
          auto b = d->allocate(1 + rng() % (kBudget / 4));
          if (b.is_ok()) {
            mine.push_back(std::move(*b));
          } else {
            refused.fetch_add(1);
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const MemoryStats s = d->memory_stats();
  EXPECT_LE(s.peak_bytes, kBudget);
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_EQ(s.live_allocations, 0u);
  EXPECT_EQ(s.refused_allocations, refused.load());
}

// More operations than the queue holds: enqueue blocks instead of growing without bound, and
// everything still runs in order.
TEST(HostDevice, QueueIsBoundedAndOrdered) {
  auto d = make_device();
  std::atomic<bool> gate{false};
  ASSERT_TRUE(d->host_callback(d->compute_stream(), [&] {
    while (!gate.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }).is_ok());
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.store(true);
  });
  std::uint64_t next = 0;
  bool in_order = true;
  const std::uint64_t n = HostStream::kMaxQueued * 2 + 5;
  for (std::uint64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(d->host_callback(d->compute_stream(), [&, i] {
      if (next != i) in_order = false;
      ++next;
    }).is_ok());
  }
  ASSERT_TRUE(d->compute_stream().synchronize().is_ok());
  opener.join();
  EXPECT_TRUE(in_order);
  EXPECT_EQ(next, n);
}

TEST(HostDevice, RegisterHostMemory) {
  auto d = make_device();
  std::vector<char> mem(8192);
  ASSERT_TRUE(d->register_host_memory(mem.data(), 4096).is_ok());
  EXPECT_FALSE(d->register_host_memory(mem.data() + 100, 10).is_ok()) << "overlap accepted";
  ASSERT_TRUE(d->register_host_memory(mem.data() + 4096, 4096).is_ok());
  EXPECT_EQ(d->registered_host_ranges(), 2u);
  ASSERT_TRUE(d->unregister_host_memory(mem.data()).is_ok());
  EXPECT_FALSE(d->unregister_host_memory(mem.data()).is_ok());
  ASSERT_TRUE(d->unregister_host_memory(mem.data() + 4096).is_ok());
}

TEST(HostDevice, ZeroByteAllocationIsEmpty) {
  auto d = make_device();
  auto b = d->allocate(0);
  ASSERT_TRUE(b.is_ok());
  EXPECT_TRUE(b->empty());
  EXPECT_EQ(d->memory_stats().in_use_bytes, 0u);
}

}  // namespace
}  // namespace tz::gpu

// Registration of the pinned pool's slabs (cpu/pinned_pool.h) with a device.
#include "gpu/pinned_registration.h"

namespace tz::gpu {
namespace {

TEST(PinnedRegistration, EverySlabRegisteredAndReleased) {
  auto d = make_device();
  {
    PinnedPoolOptions o;
    o.budget_bytes = 6ull << 20;
    o.slab_bytes = 2ull << 20;
    o.huge_pages = false;
    o.prefault = false;
    o.lock = MemlockPolicy::kOff;
    auto pool = PinnedPool::create(o);
    ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
    ASSERT_TRUE(register_pinned_pool(*d, *pool).is_ok());
    EXPECT_EQ(d->registered_host_ranges(), pool->slabs().size());
    EXPECT_GE(pool->slabs().size(), 3u);
    // A copy from a pinned buffer into device memory and back.
    auto pinned = pool->allocate(1 << 20);
    auto dev = d->allocate(1 << 20);
    ASSERT_TRUE(pinned.is_ok() && dev.is_ok());
    std::memset(pinned->data(), 0x42, 1 << 20);
    ASSERT_TRUE(d->copy_async(dev->data(), pinned->data(), 1 << 20, CopyKind::kHostToDevice,
                              d->h2d_stream()).is_ok());
    ASSERT_TRUE(d->h2d_stream().synchronize().is_ok());
    EXPECT_EQ(dev->as<unsigned char>()[(1 << 20) - 1], 0x42);
    // Registering twice fails (the ranges are already registered) and leaves nothing behind.
    EXPECT_FALSE(register_pinned_pool(*d, *pool).is_ok());
    EXPECT_EQ(d->registered_host_ranges(), pool->slabs().size());
  }
  EXPECT_EQ(d->registered_host_ranges(), 0u) << "slabs still registered after the pool died";
}

}  // namespace
}  // namespace tz::gpu

namespace tz::gpu {
namespace {

// TZ_DEVICE_POISON=1 fills new device memory with 0xa5 (debug builds do it by default).
TEST(HostDevice, PoisonFillsNewMemory) {
  setenv("TZ_DEVICE_POISON", "1", 1);
  auto d = make_device();
  unsetenv("TZ_DEVICE_POISON");
  ASSERT_TRUE(d->poisons_memory());
  auto b = d->allocate(1000);
  ASSERT_TRUE(b.is_ok());
  for (std::size_t i = 0; i < 1000; ++i) ASSERT_EQ(b->as<unsigned char>()[i], 0xa5) << i;
}

// A buffer freed and allocated again at the same size is not faulted in again page by page (the
// engine frees and allocates its gradient buffers every step; glibc hands such sizes back to the
// kernel on free, and each step then took one minor fault per 4 KiB: ~24k per step on a small
// model). Counted with getrusage around the second buffer's first touch.
TEST(HostDevice, ReallocatedBufferIsNotFaultedInAgain) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under ASan HostDevice frees every buffer (no reuse), so that ASan sees reuse";
#endif
  constexpr std::size_t kBytes = 64ull << 20;  // above glibc's largest mmap threshold (32 MiB)
  auto d = make_device(128ull << 20);
  {
    auto b = d->allocate(kBytes);
    ASSERT_TRUE(b.is_ok());
    std::memset(b->data(), 1, kBytes);
  }
  auto b = d->allocate(kBytes);
  ASSERT_TRUE(b.is_ok());
  rusage before{};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &before), 0);
  std::memset(b->data(), 2, kBytes);
  rusage after{};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &after), 0);
  const long faults = after.ru_minflt - before.ru_minflt;
  EXPECT_LT(faults, static_cast<long>(kBytes / 4096 / 16))
      << faults << " minor faults touching a reallocated " << kBytes << "-byte buffer";
}

// A stream blocked in wait() on another stream's event is not busy (the step's bound counts the
// compute stream's busy time as the model's compute): the compute stream waits for an event that
// stream `b` records only after a 200 ms task and reports almost none of those 200 ms, neither
// in busy_seconds() nor in the process's BusyUnion; `b` reports its task, and a 200 ms task on
// the compute stream counts in both.
TEST(HostDevice, WaitingOnAnotherStreamIsNotBusy) {
  using std::chrono_literals::operator""ms;
  auto d = make_device();
  auto b = d->create_stream("b");
  auto ev = d->create_event();
  ASSERT_TRUE(b.is_ok() && ev.is_ok());
  Stream& compute = d->compute_stream();
  BusyUnion& cores = BusyUnion::host_cores();
  const double busy0 = compute.busy_seconds();
  const double cores0 = cores.seconds();
  ASSERT_TRUE(d->host_callback(**b, [] { std::this_thread::sleep_for(200ms); }).is_ok());
  ASSERT_TRUE((*ev)->record(**b).is_ok());
  ASSERT_TRUE(compute.wait(**ev).is_ok());
  std::atomic<bool> after_wait{false};
  ASSERT_TRUE(d->host_callback(compute, [&] { after_wait = true; }).is_ok());
  ASSERT_TRUE(compute.synchronize().is_ok());
  ASSERT_TRUE(after_wait.load());
  EXPECT_GE((*b)->busy_seconds(), 0.199);
  EXPECT_LT(compute.busy_seconds() - busy0, 0.12) << "the compute stream's wait counted as work";
  EXPECT_LT(cores.seconds() - cores0, 0.12) << "the compute stream's wait entered host_cores";

  const double busy1 = compute.busy_seconds();
  const double cores1 = cores.seconds();
  ASSERT_TRUE(d->host_callback(compute, [] { std::this_thread::sleep_for(200ms); }).is_ok());
  ASSERT_TRUE(compute.synchronize().is_ok());
  EXPECT_GE(compute.busy_seconds() - busy1, 0.199);
  EXPECT_GE(cores.seconds() - cores1, 0.199);
}

}  // namespace
}  // namespace tz::gpu
