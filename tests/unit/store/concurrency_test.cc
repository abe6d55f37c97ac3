// Several caller threads pin, write, read and release blocks of one store at once (store.h: any
// number of caller threads), over all three homes and small budgets so that pins evict each
// other's copies, while a thread ends steps and flushes. Each thread owns some blocks (it checks
// every read against its own last write) and all share read-only blocks filled once with a
// known pattern. Built to run under TSan too (build/store-tsan). TZ_STORE_SEED=<n> replays.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "store/store.h"
#include "store_harness.h"

namespace tz::store {
namespace {

using testing::Harness;
using testing::HarnessOptions;

constexpr std::uint64_t kBlock = 24 << 10;

std::byte pattern(BlockId id, std::size_t i) { return static_cast<std::byte>(id * 131 + i * 7); }

TEST(StoreConcurrency, CallerThreadsPinWriteAndReadTheirBytes) {
  const char* env = std::getenv("TZ_STORE_SEED");
  const std::uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : 7;
  std::printf("store concurrency: seed %llu (replay with TZ_STORE_SEED=%llu)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  Harness h;
  HarnessOptions o;
  o.store.device_budget_bytes = 8 * kBlock;
  o.store.host_budget_bytes = 8 * kBlock;
  o.store.chunk_bytes = 8 << 10;
  o.store.staging_buffers = 4;
  o.store.max_io_in_flight_bytes = 64 << 10;
  h.init(o);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  constexpr int kThreads = 4;
  constexpr int kOwn = 3;
  // Shared read-only blocks, NVMe-homed, written once here.
  std::vector<BlockId> shared;
  for (int i = 0; i < 4; ++i) {
    auto id = h.store->create_block(kBlock, Tier::kNvme, "shared" + std::to_string(i));
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    auto w = h.store->pin(*id, Tier::kHost, Access::kWrite);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    ASSERT_TRUE(w->wait().is_ok());
    auto* p = static_cast<std::byte*>(w->data());
    for (std::size_t k = 0; k < kBlock; ++k) p[k] = pattern(*id, k);
    shared.push_back(*id);
  }
  ASSERT_TRUE(h.store->flush().is_ok());
  std::vector<std::vector<BlockId>> own(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kOwn; ++i) {
      // One own block per home: NVMe (twice) and host.
      const Tier home = i == 2 ? Tier::kHost : Tier::kNvme;
      auto id =
          h.store->create_block(kBlock, home, "t" + std::to_string(t) + "." + std::to_string(i));
      ASSERT_TRUE(id.is_ok()) << id.status().to_string();
      own[t].push_back(*id);
    }
  }
  std::atomic<int> failures{0};
  std::atomic<bool> stop{false};
  auto worker = [&](int t) {
    std::mt19937_64 rng(seed * 1000 + static_cast<std::uint64_t>(t));
    std::vector<std::uint8_t> last(kOwn, 0);  // each own block is filled with one byte value
    for (int iter = 0; iter < 300 && failures.load() == 0; ++iter) {
      const bool use_shared = rng() % 3 == 0;
      const Tier tier = rng() % 2 ? Tier::kDevice : Tier::kHost;
      if (use_shared) {
        const BlockId id = shared[rng() % shared.size()];
        auto l = h.store->pin(id, tier, Access::kRead);
        if (!l.is_ok()) {
          // Only lack of room (every copy pinned by the others) is acceptable.
          if (l.status().code() != ErrorCode::kOutOfMemory) ++failures;
          continue;
        }
        if (!l->wait().is_ok()) {
          ++failures;
          continue;
        }
        const auto* p = static_cast<const std::byte*>(l->data());
        for (std::size_t k = 0; k < kBlock; k += 509) {
          if (p[k] != pattern(id, k)) {
            std::fprintf(stderr, "thread %d: shared block %u byte %zu wrong\n", t, id, k);
            ++failures;
            break;
          }
        }
        continue;
      }
      const int i = static_cast<int>(rng() % kOwn);
      const BlockId id = own[t][static_cast<std::size_t>(i)];
      const bool write = rng() % 2 == 0;
      auto l = h.store->pin(id, tier, write ? Access::kReadWrite : Access::kRead);
      if (!l.is_ok()) {
        if (l.status().code() != ErrorCode::kOutOfMemory) ++failures;
        continue;
      }
      if (!l->wait().is_ok()) {
        ++failures;
        continue;
      }
      auto* p = static_cast<std::byte*>(l->data());
      for (std::size_t k = 0; k < kBlock; k += 509) {
        if (p[k] != static_cast<std::byte>(last[static_cast<std::size_t>(i)])) {
          std::fprintf(stderr, "thread %d: block %u byte %zu is %d, wrote %d\n", t, id, k,
                       static_cast<int>(p[k]), last[static_cast<std::size_t>(i)]);
          ++failures;
          break;
        }
      }
      if (write) {
        const auto v = static_cast<std::uint8_t>(1 + rng() % 250);
        std::memset(p, v, kBlock);
        last[static_cast<std::size_t>(i)] = v;
      }
    }
  };
  std::thread stepper([&] {
    int n = 0;
    while (!stop.load()) {
      if (++n % 4 == 0) {
        if (!h.store->flush().is_ok()) ++failures;
      } else {
        h.store->mark_step();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& th : threads) th.join();
  stop.store(true);
  stepper.join();
  EXPECT_EQ(failures.load(), 0) << "seed " << seed;
  ASSERT_TRUE(h.store->drain().is_ok());
  EXPECT_TRUE(h.store->check_invariants().is_ok()) << h.store->check_invariants().to_string();
  h.finish();
}

}  // namespace
}  // namespace tz::store
