// A device window of few blocks: a dirty copy leaving the device gives its space to the next load
// once its bytes have left the device buffer, not when its disk write ends; and a load of the
// evicted block waits for that write (it reads the extent). The disk's writes are held by a gate
// (WriteGateEngine) for as long as the test says; a watchdog fails the test instead of hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <thread>

#include "store/store.h"
#include "store_harness.h"

namespace tz::store {
namespace {

using testing::gate_writes;
using testing::Harness;
using testing::HarnessOptions;
using testing::within_deadline;
using testing::WriteGateEngine;

TEST(StoreWindow, DirtyEvictionGivesItsDeviceSpaceBeforeItsDiskWriteEnds) {
  constexpr std::uint64_t kBlock = 64 << 10;
  auto open = std::make_shared<std::atomic<bool>>(true);
  WriteGateEngine* gate = nullptr;
  Harness h;
  HarnessOptions o;
  o.store.policy = Policy::kLru;
  o.store.device_budget_bytes = kBlock;  // one block: B's load needs A's space
  o.store.host_budget_bytes = 0;         // A's eviction writes it to NVMe
  o.store.chunk_bytes = 16 << 10;        // four pieces
  o.store.staging_buffers = 8;
  gate_writes(o, open, &gate);
  h.init(o);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  auto a = h.store->create_block(kBlock, Tier::kNvme, "A");
  auto b = h.store->create_block(kBlock, Tier::kNvme, "B");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  {
    auto w = h.store->pin(*a, Tier::kDevice, Access::kWrite);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    ASSERT_TRUE(w->wait().is_ok());
    std::memset(w->data(), 0x5a, kBlock);  // HostDevice memory is host memory
  }
  ASSERT_TRUE(h.store->drain().is_ok());
  open->store(false);
  within_deadline("loads behind a held disk write", 60, [&] {
    auto lb = h.store->pin(*b, Tier::kDevice, Access::kRead);  // evicts A, dirty
    ASSERT_TRUE(lb.is_ok()) << lb.status().to_string();
    auto waited = std::async(std::launch::async, [&] { return lb->wait(); });
    const bool loaded = waited.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
    // A's four writes are at the disk, held.
    for (int i = 0; i < 2000 && gate->held_total() < 4; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(gate->held_total(), 4u);
    if (!loaded) open->store(true);  // the old behaviour: B's space waited for A's disk write
    EXPECT_TRUE(loaded) << "B's load waited for A's write to reach the disk";
    ASSERT_TRUE(waited.get().is_ok());
    lb->release();
    // A's load reads the extent, so it waits for the writes still held.
    auto la = h.store->pin(*a, Tier::kDevice, Access::kRead);
    ASSERT_TRUE(la.is_ok()) << la.status().to_string();
    auto a_waited = std::async(std::launch::async, [&] { return la->wait(); });
    EXPECT_NE(a_waited.wait_for(std::chrono::milliseconds(300)), std::future_status::ready)
        << "A's load did not wait for its own write-back";
    open->store(true);
    ASSERT_TRUE(a_waited.get().is_ok());
    const auto* p = static_cast<const unsigned char*>(la->data());
    std::uint64_t wrong = 0;
    for (std::uint64_t i = 0; i < kBlock; ++i) wrong += p[i] != 0x5a ? 1 : 0;
    EXPECT_EQ(wrong, 0u) << "A read back other bytes than it wrote";
  });
  EXPECT_EQ(h.store->stats().nvme_write_bytes(), kBlock);
  h.finish();
}

}  // namespace
}  // namespace tz::store
