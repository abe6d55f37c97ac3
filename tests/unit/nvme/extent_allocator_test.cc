// ExtentAllocator under a seeded random alloc/free workload, checked after every step against an
// independent interval map: no overlap, exact accounting, free list bounded by live extents + 1,
// and all space back as one extent at the end.
#include "nvme/extent_allocator.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <vector>

namespace tz::nvme {
namespace {

void check_invariants(const ExtentAllocator& a, const std::map<std::uint64_t, std::uint64_t>& live) {
  std::uint64_t used = 0;
  std::uint64_t end = 0;
  for (const auto& [off, len] : live) {
    ASSERT_GE(off, end) << "live extents overlap at " << off;
    ASSERT_EQ(off % 4096, 0u);
    ASSERT_EQ(len % 4096, 0u);
    end = off + len;
    used += len;
  }
  ASSERT_LE(end, a.capacity_bytes());
  ASSERT_EQ(a.used_bytes(), used);
  // Free extents do not overlap live ones, and together they tile the space.
  std::uint64_t free_sum = 0;
  for (const Extent& f : a.free_extents()) {
    auto it = live.upper_bound(f.offset);
    if (it != live.begin()) {
      ASSERT_LE(std::prev(it)->first + std::prev(it)->second, f.offset);
    }
    if (it != live.end()) {
      ASSERT_LE(f.offset + f.bytes, it->first);
    }
    free_sum += f.bytes;
  }
  ASSERT_EQ(free_sum + used, a.capacity_bytes());
  // Coalescing: two free extents are never adjacent, so there are at most live + 1 of them.
  ASSERT_LE(a.free_extent_count(), live.size() + 1);
}

TEST(ExtentAllocator, RandomWorkloadNeverOverlapsAndReturnsAllSpace) {
  for (std::uint64_t seed : {1ull, 7ull, 20261129ull}) {
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    std::mt19937_64 rng(seed);
    ExtentAllocator a(256ull << 20);
    std::map<std::uint64_t, std::uint64_t> live;
    std::vector<Extent> handles;
    for (int step = 0; step < 20000; ++step) {
      const bool do_free = !handles.empty() && (rng() % 100 < 45 || a.free_bytes() < (8u << 20));
      if (do_free) {
        const std::size_t i = rng() % handles.size();
        a.free(handles[i]);
        live.erase(handles[i].offset);
        handles[i] = handles.back();
        handles.pop_back();
      } else {
        // Mixed sizes: many small, some large, unaligned requests.
        const std::uint64_t bytes = rng() % 10 == 0 ? 1 + rng() % (16u << 20) : 1 + rng() % (256u << 10);
        auto e = a.allocate(bytes);
        if (!e) {
          ASSERT_LT(a.largest_free_bytes(), bytes) << "refused although a free extent fits";
          continue;
        }
        ASSERT_GE(e->bytes, bytes);
        ASSERT_LT(e->bytes - bytes, 4096u);
        live.emplace(e->offset, e->bytes);
        handles.push_back(*e);
      }
      if (step % 97 == 0) {
        ASSERT_NO_FATAL_FAILURE(check_invariants(a, live)) << "step " << step;
      }
    }
    ASSERT_NO_FATAL_FAILURE(check_invariants(a, live));
    for (const Extent& e : handles) a.free(e);
    EXPECT_EQ(a.free_bytes(), a.capacity_bytes());
    ASSERT_EQ(a.free_extent_count(), 1u);
    EXPECT_EQ(a.free_extents()[0], (Extent{0, a.capacity_bytes()}));
  }
}

TEST(ExtentAllocator, BestFitPrefersTheSmallestHole) {
  ExtentAllocator a(1 << 20);
  auto x = a.allocate(64 << 10);
  auto y = a.allocate(16 << 10);
  auto z = a.allocate(32 << 10);
  auto w = a.allocate(4 << 10);
  ASSERT_TRUE(x && y && z && w);
  a.free(*x);  // 64 KiB hole at 0
  a.free(*z);  // 32 KiB hole
  auto fit = a.allocate(20 << 10);
  ASSERT_TRUE(fit);
  EXPECT_EQ(fit->offset, z->offset);
}

TEST(ExtentAllocator, FullSpaceIsRefusedThenReusable) {
  ExtentAllocator a(64 << 10);
  auto all = a.allocate(64 << 10);
  ASSERT_TRUE(all);
  EXPECT_FALSE(a.allocate(1));
  a.free(*all);
  EXPECT_TRUE(a.allocate(64 << 10));
}

}  // namespace
}  // namespace tz::nvme
