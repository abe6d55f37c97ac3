// The host allocation at the head of its tier's FIFO must wait only for a free that can run. A
// free queued behind that very allocation (its own block's eviction) never comes, so waiting for
// it hung the store (gpt2-774m, step 3; fixed in 38ce621 by free_can_complete and evicting more).
// The scenario is made deterministic with an engine that holds disk writes until the test opens
// it, so every decision is taken while the mover cannot start the allocation; a watchdog fails
// the test instead of hanging ctest.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "store/store.h"
#include "store_harness.h"

namespace tz::store {
namespace {

using testing::gate_writes;
using testing::Harness;
using testing::HarnessOptions;
using testing::within_deadline;
using testing::WriteGateEngine;

// A pinned pool of one 2 MiB slab (one 64 KiB staging buffer first), a host budget of 1,984 KiB
// and five dirty 384 KiB copies s0..s4 filling it in order. With the disk's writes held:
//  1. pin H (768 KiB) in the host tier: LRU evicts s0 and s2 (dirty: write-back, then free), so
//     H's allocation heads the FIFO and waits for those frees;
//  2. release H unloaded, use s1, s3, s4 again, and pin s0 for writing: LRU evicts H, whose free
//     is queued behind its own allocation, and s0's allocation queues behind H's.
// Opening the gate frees s0 and s2: the budget has room for H but the pool's free pieces (two
// 384 KiB holes that do not touch, and 64 KiB) do not fit it, and the only free pending is H's
// own. Waiting for it never ends (the old code); evicting more (s1, s3) lets H in.
TEST(StoreHostAllocWait, HeadAllocationDoesNotWaitForAFreeQueuedBehindIt) {
  constexpr std::uint64_t kSmall = 384 << 10;
  auto open = std::make_shared<std::atomic<bool>>(true);
  WriteGateEngine* gate = nullptr;
  Harness h;
  HarnessOptions o;
  o.store.policy = Policy::kLru;
  o.store.device_budget_bytes = 1 << 20;
  o.store.chunk_bytes = 64 << 10;
  o.store.staging_buffers = 1;
  o.pool_budget = 2 << 20;
  o.store.host_budget_bytes = *o.pool_budget - o.store.chunk_bytes;
  gate_writes(o, open, &gate);
  h.init(o);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::vector<BlockId> s;
  for (int i = 0; i < 5; ++i) {
    auto id = h.store->create_block(kSmall, Tier::kNvme, "s" + std::to_string(i));
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    s.push_back(*id);
    auto w = h.store->pin(*id, Tier::kHost, Access::kWrite);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    ASSERT_TRUE(w->wait().is_ok());
    std::memset(w->data(), 0x20 + i, kSmall);
  }
  auto hit = [&](BlockId id) {
    auto r = h.store->pin(id, Tier::kHost, Access::kRead);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_TRUE(r->wait().is_ok());
  };
  for (int i : {1, 3, 4}) hit(s[static_cast<std::size_t>(i)]);  // LRU order now: s0, s2
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  auto big = h.store->create_block(2 * kSmall, Tier::kNvme, "H");
  ASSERT_TRUE(big.is_ok());
  ASSERT_TRUE(h.store->drain().is_ok());
  open->store(false);
  within_deadline("the host allocation behind its own free", 60, [&] {
    {
      auto lh = h.store->pin(*big, Tier::kHost, Access::kRead);  // evicts s0 and s2
      ASSERT_TRUE(lh.is_ok()) << lh.status().to_string();
    }  // released before its load: H is a victim like any other
    for (int i : {1, 3, 4}) hit(s[static_cast<std::size_t>(i)]);  // LRU: H first
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    auto w0 = h.store->pin(s[0], Tier::kHost, Access::kWrite);  // evicts H
    ASSERT_TRUE(w0.is_ok()) << w0.status().to_string();
    // The write-backs of s0 and s2 reach the disk (and are held) when the mover gets to them.
    while (gate->held_total() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    open->store(true);
    ASSERT_TRUE(w0->wait().is_ok());
    std::memset(w0->data(), 0x40, kSmall);
    w0->release();
    ASSERT_TRUE(h.store->drain().is_ok());
  });
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_GE(h.store->stats().tier(Tier::kHost).fragmentation_evictions, 1u)
      << "the pool was not fragmented: the scenario did not happen";
  // Every block holds its last write (s0 rewritten, H never written: zeros).
  for (int i = 0; i < 5; ++i) {
    auto r = h.store->pin(s[static_cast<std::size_t>(i)], Tier::kHost, Access::kRead);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_TRUE(r->wait().is_ok());
    const auto* p = static_cast<const unsigned char*>(r->data());
    const unsigned char want = i == 0 ? 0x40 : static_cast<unsigned char>(0x20 + i);
    EXPECT_TRUE(p[0] == want && p[kSmall - 1] == want) << "block s" << i;
  }
  {
    auto r = h.store->pin(*big, Tier::kHost, Access::kRead);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_TRUE(r->wait().is_ok());
    const auto* p = static_cast<const unsigned char*>(r->data());
    EXPECT_TRUE(p[0] == 0 && p[2 * kSmall - 1] == 0) << "H does not read as zeros";
  }
  h.finish();
}

}  // namespace
}  // namespace tz::store
