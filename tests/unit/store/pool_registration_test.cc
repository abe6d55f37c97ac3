// fixed_buffer_regions (store/pool_registration.h): slabs become io_uring fixed buffers of at most
// 1 GiB each, cut in order, covering every byte once. Hand-made slabs: nothing is mapped.
#include "store/pool_registration.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace tz::store {
namespace {

PinnedSlab fake_slab(std::uintptr_t base, std::uint64_t bytes) {
  PinnedSlab s;
  s.data = reinterpret_cast<void*>(base);
  s.bytes = bytes;
  return s;
}

TEST(PoolRegistration, SlabsUpToOneGibAreOneBufferEach) {
  const std::vector<PinnedSlab> slabs{fake_slab(0x100000000, 256ull << 20),
                                      fake_slab(0x200000000, 1ull << 30)};
  const std::vector<iovec> r = fixed_buffer_regions(slabs);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(r[0].iov_base), 0x100000000u);
  EXPECT_EQ(r[0].iov_len, 256ull << 20);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(r[1].iov_base), 0x200000000u);
  EXPECT_EQ(r[1].iov_len, 1ull << 30);
}

TEST(PoolRegistration, LargerSlabsAreCutIntoOneGibPiecesInOrder) {
  // 2.5 GiB: pieces of 1, 1 and 0.5 GiB, each starting where the previous ends.
  const std::uint64_t bytes = (5ull << 30) / 2;
  const std::vector<PinnedSlab> slabs{fake_slab(0x400000000, bytes)};
  const std::vector<iovec> r = fixed_buffer_regions(slabs);
  ASSERT_EQ(r.size(), 3u);
  const std::uint64_t expect_len[] = {1ull << 30, 1ull << 30, 1ull << 29};
  std::uintptr_t at = 0x400000000;
  for (std::size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(r[i].iov_base), at) << i;
    EXPECT_EQ(r[i].iov_len, expect_len[i]) << i;
    EXPECT_LE(r[i].iov_len, kMaxFixedBuffer);
    at += r[i].iov_len;
  }
  EXPECT_EQ(at, 0x400000000 + bytes);
}

}  // namespace
}  // namespace tz::store
