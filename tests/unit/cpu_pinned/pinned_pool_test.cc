// PinnedPool: alignment, budget and peak accounting, reuse after free (coalescing), slab hooks,
// and concurrent use, checked against plain bookkeeping kept by the test.
#include "cpu/pinned_pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace tz {
namespace {

PinnedPoolOptions small_options(std::uint64_t budget, std::uint64_t slab) {
  PinnedPoolOptions o;
  o.budget_bytes = budget;
  o.slab_bytes = slab;
  return o;
}

// The process's AnonHugePages from /proc/self/smaps_rollup (the kernel's own sum), in bytes.
std::uint64_t rollup_thp_bytes() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string key;
  std::uint64_t kb = 0;
  while (in >> key) {
    if (key == "AnonHugePages:" && (in >> kb)) return kb * 1024;
  }
  return 0;
}

TEST(PinnedPool, ReportsWhichSlabsHaveHugePages) {
  PinnedPoolOptions small = small_options(8 << 20, 4 << 20);
  small.huge_pages = false;
  auto flat = PinnedPool::create(small);
  ASSERT_TRUE(flat.is_ok()) << flat.status().to_string();
  EXPECT_EQ(flat->stats().huge_bytes, 0u) << "a pool asked for 4 KiB pages must not get THP";
  for (const PinnedSlab& s : flat->slabs()) EXPECT_EQ(s.huge_bytes, 0u);

  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
    GTEST_SKIP() << "kernel without transparent huge pages";
  }
  const std::uint64_t before = rollup_thp_bytes();
  auto huge = PinnedPool::create(small_options(8 << 20, 4 << 20));
  ASSERT_TRUE(huge.is_ok()) << huge.status().to_string();
  const PinnedPoolStats st = huge->stats();
  std::uint64_t sum = 0;
  for (const PinnedSlab& s : huge->slabs()) {
    EXPECT_EQ(s.huge_bytes % (2u << 20), 0u);
    EXPECT_LE(s.huge_bytes, s.bytes);
    sum += s.huge_bytes;
  }
  EXPECT_EQ(st.huge_bytes, sum);
  // Reserved huge pages do not show in AnonHugePages; transparent ones must.
  bool hugetlb = false;
  for (const PinnedSlab& s : huge->slabs()) hugetlb = hugetlb || s.hugetlb;
  if (!hugetlb) {
    EXPECT_GE(rollup_thp_bytes() - before, st.huge_bytes);
  }
  // MADV_COLLAPSE (Linux 6.1+) gives huge pages whatever the THP mode; older kernels may not.
  EXPECT_EQ(st.huge_bytes, st.mapped_bytes)
      << "THP mode: " << [] {
           std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
           std::string l;
           std::getline(in, l);
           return l;
         }();
}

// Counts the pages of [data, data + bytes) that are not resident.
std::size_t pages_not_resident(const void* data, std::uint64_t bytes) {
  std::vector<unsigned char> resident(bytes / 4096);
  EXPECT_EQ(mincore(const_cast<void*>(data), bytes, resident.data()), 0) << std::strerror(errno);
  std::size_t missing = 0;
  for (unsigned char r : resident) missing += (r & 1u) == 0;
  return missing;
}

// Pre-faulting on 4 KiB pages (through a long-term pin where the kernel allows it, else
// MADV_POPULATE_WRITE) leaves every page resident and zeroed; mincore is the independent check.
TEST(PinnedPool, FourKiBPageSlabsArePrefaulted) {
  PinnedPoolOptions o = small_options(6 << 20, 4 << 20);
  o.huge_pages = false;
  auto pool = PinnedPool::create(o);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  for (const PinnedSlab& s : pool->slabs()) {
    EXPECT_EQ(pages_not_resident(s.data, s.bytes), 0u)
        << "slab " << s.index << " has pages not faulted in";
    const auto* bytes = static_cast<const unsigned char*>(s.data);
    for (std::uint64_t off = 0; off < s.bytes; off += 4096) ASSERT_EQ(bytes[off], 0u) << off;
  }
}

// A slab of several 64 MiB pieces is faulted in piece by piece on oneTBB's threads: every page, the
// last piece's (shorter than the others) included, is resident and zero.
TEST(PinnedPool, PrefaultInPiecesLeavesNoPageOut) {
  PinnedPoolOptions o = small_options(258ull << 20, 258ull << 20);
  o.lock = MemlockPolicy::kOff;
  auto pool = PinnedPool::create(o);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  ASSERT_EQ(pool->slabs().size(), 1u);
  const PinnedSlab s = pool->slabs()[0];  // slabs() returns a copy
  EXPECT_EQ(pages_not_resident(s.data, s.bytes), 0u);
  const auto* bytes = static_cast<const unsigned char*>(s.data);
  for (std::uint64_t off = 0; off < s.bytes; off += 4096) ASSERT_EQ(bytes[off], 0u) << off;
}

// Without prefault the pages wait for their first use (the engine's pools: the process's RSS
// follows what it uses); with mlock asked for, every page is resident after create().
TEST(PinnedPool, WithoutPrefaultOnlyALockFaultsPagesIn) {
  PinnedPoolOptions lazy = small_options(130ull << 20, 130ull << 20);
  lazy.prefault = false;
  lazy.lock = MemlockPolicy::kOff;
  auto a = PinnedPool::create(lazy);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  const PinnedSlab sa = a->slabs()[0];
  EXPECT_EQ(pages_not_resident(sa.data, sa.bytes), sa.bytes / 4096);

  PinnedPoolOptions locked = lazy;
  locked.lock = MemlockPolicy::kBestEffort;
  auto b = PinnedPool::create(locked);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  const PinnedSlab sb = b->slabs()[0];
  EXPECT_EQ(pages_not_resident(sb.data, sb.bytes), 0u);
}

TEST(PinnedPool, BuffersAreAlignedWritableAndInsideSlabs) {
  auto pool = PinnedPool::create(small_options(8 << 20, 4 << 20));
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  EXPECT_EQ(pool->slabs().size(), 2u);
  std::vector<PinnedBuffer> bufs;
  for (std::uint64_t size : {1ull, 4095ull, 4096ull, 4097ull, 100000ull, 1ull << 20}) {
    auto b = pool->allocate(size);
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b->data()) % 4096, 0u);
    EXPECT_EQ(b->size(), size);
    EXPECT_TRUE(pool->contains(b->data(), size));
    std::memset(b->data(), 0x5a, size);
    bufs.push_back(std::move(b).value());
  }
  // No two buffers overlap.
  for (std::size_t i = 0; i < bufs.size(); ++i)
    for (std::size_t j = i + 1; j < bufs.size(); ++j) {
      const auto a0 = reinterpret_cast<std::uintptr_t>(bufs[i].data());
      const auto b0 = reinterpret_cast<std::uintptr_t>(bufs[j].data());
      EXPECT_TRUE(a0 + bufs[i].size() <= b0 || b0 + bufs[j].size() <= a0);
    }
}

TEST(PinnedPool, BudgetIsEnforcedAndPeakRecorded) {
  auto pool = PinnedPool::create(small_options(1 << 20, 2 << 20));
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  auto a = pool->allocate(600 << 10);
  ASSERT_TRUE(a.is_ok());
  auto b = pool->allocate(600 << 10);  // 1200 KiB > 1 MiB budget although the slab has room
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(b.status().message().find("budget"), std::string::npos) << b.status().message();
  auto c = pool->allocate(400 << 10);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(pool->stats().in_use_bytes, (600u << 10) + (400u << 10));
  a->reset();
  EXPECT_EQ(pool->stats().in_use_bytes, 400u << 10);
  EXPECT_EQ(pool->stats().peak_bytes, 1000u << 10);
  EXPECT_EQ(pool->stats().failed_allocations, 1u);
  EXPECT_EQ(pool->stats().live_buffers, 1u);
}

TEST(PinnedPool, FreedPiecesCoalesceIntoAWholeSlab) {
  const std::uint64_t slab = 2 << 20;
  auto pool = PinnedPool::create(small_options(slab, slab));
  ASSERT_TRUE(pool.is_ok());
  const unsigned seed = 20261129;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<PinnedBuffer> live;
  for (int round = 0; round < 200; ++round) {
    if (!live.empty() && (rng() % 2 == 0)) {
      live.erase(live.begin() + static_cast<long>(rng() % live.size()));
    } else {
      auto b = pool->allocate(4096 * (1 + rng() % 64));
      if (b.is_ok()) live.push_back(std::move(b).value());
    }
  }
  live.clear();
  EXPECT_EQ(pool->stats().in_use_bytes, 0u);
  auto whole = pool->allocate(slab);
  EXPECT_TRUE(whole.is_ok()) << whole.status().to_string();
}

TEST(PinnedPool, HooksSeeEverySlabAndRemovalBeforeUnmap) {
  std::vector<std::pair<void*, std::uint64_t>> added, removed;
  {
    auto pool = PinnedPool::create(small_options(6 << 20, 2 << 20));
    ASSERT_TRUE(pool.is_ok());
    PinnedSlabHook hook;
    hook.name = "test";
    hook.on_add = [&](const PinnedSlab& s) {
      added.emplace_back(s.data, s.bytes);
      return Status::ok();
    };
    hook.on_remove = [&](const PinnedSlab& s) { removed.emplace_back(s.data, s.bytes); };
    ASSERT_TRUE(pool->add_slab_hook(std::move(hook)).is_ok());
    ASSERT_EQ(added.size(), 3u);
    for (const PinnedSlab& s : pool->slabs()) {
      EXPECT_EQ(s.data, added[s.index].first);
      EXPECT_EQ(s.bytes, 2u << 20);
    }
    EXPECT_TRUE(removed.empty());
  }
  EXPECT_EQ(removed, added);
}

TEST(PinnedPool, FailingHookUndoesWhatItAdded) {
  auto pool = PinnedPool::create(small_options(6 << 20, 2 << 20));
  ASSERT_TRUE(pool.is_ok());
  int adds = 0, removes = 0;
  PinnedSlabHook hook;
  hook.name = "flaky";
  hook.on_add = [&](const PinnedSlab& s) {
    ++adds;
    return s.index == 2 ? Status::unavailable("no") : Status::ok();
  };
  hook.on_remove = [&](const PinnedSlab&) { ++removes; };
  Status st = pool->add_slab_hook(std::move(hook));
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("flaky"), std::string::npos);
  EXPECT_EQ(adds, 3);
  EXPECT_EQ(removes, 2);
}

TEST(PinnedPool, ConcurrentAllocationsNeverOverlap) {
  auto pool = PinnedPool::create(small_options(16 << 20, 4 << 20));
  ASSERT_TRUE(pool.is_ok());
  std::mutex mu;
  std::map<std::uintptr_t, std::uint64_t> seen_live;
  bool overlap = false;
  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<PinnedBuffer> mine;
    for (int i = 0; i < 2000; ++i) {
      if (!mine.empty() && rng() % 2) {
        std::lock_guard<std::mutex> lock(mu);
        seen_live.erase(reinterpret_cast<std::uintptr_t>(mine.back().data()));
        mine.pop_back();  // freed while holding mu, so the map never sees a reused address early
        continue;
      }
      auto b = pool->allocate(4096 * (1 + rng() % 16));
      if (!b.is_ok()) continue;
      std::lock_guard<std::mutex> lock(mu);
      const auto p = reinterpret_cast<std::uintptr_t>(b->data());
      auto next = seen_live.lower_bound(p);
      if (next != seen_live.end() && next->first < p + b->size()) overlap = true;
      if (next != seen_live.begin() && std::prev(next)->first + std::prev(next)->second > p)
        overlap = true;
      seen_live[p] = b->size();
      mine.push_back(std::move(b).value());
    }
    std::lock_guard<std::mutex> lock(mu);
    for (auto& b : mine) seen_live.erase(reinterpret_cast<std::uintptr_t>(b.data()));
    mine.clear();
  };
  std::thread t1(worker, 1), t2(worker, 2), t3(worker, 3);
  t1.join();
  t2.join();
  t3.join();
  EXPECT_FALSE(overlap);
  EXPECT_EQ(pool->stats().in_use_bytes, 0u);
}

TEST(PinnedPool, RejectsBadOptions) {
  EXPECT_EQ(PinnedPool::create(small_options(0, 2 << 20)).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(PinnedPool::create(small_options(1 << 20, 128ull << 30)).status().code(),
            ErrorCode::kInvalidArgument);
}

TEST(PinnedPool, MovedPoolKeepsBuffersValid) {
  auto pool = PinnedPool::create(small_options(2 << 20, 2 << 20));
  ASSERT_TRUE(pool.is_ok());
  PinnedPool moved = std::move(pool).value();
  auto b = moved.allocate(8192);
  ASSERT_TRUE(b.is_ok());
  PinnedPool again = std::move(moved);
  b->reset();
  EXPECT_EQ(again.stats().in_use_bytes, 0u);
}

}  // namespace
}  // namespace tz
