// Unit layout: tensor offsets at kTensorAlignElems, shards equal, 4 KiB-aligned in 16-bit and
// fp32, covering every tensor; shard_part against a brute-force walk of the flat buffer.
#include <gtest/gtest.h>

#include "zero/layout.h"

namespace tz::zero {
namespace {

TEST(ZeroLayout, OffsetsPaddingAndShardParts) {
  UnitSpec u;
  u.name = "u";
  u.tensors.push_back({"a", {3, 5}});
  u.tensors.push_back({"b", {200}});
  u.tensors.push_back({"c", {7, 700}});
  for (int world : {1, 2, 3, 4, 8}) {
    const UnitLayout l = plan_unit_layout(u, world);
    EXPECT_EQ(l.offsets[0], 0u);
    EXPECT_EQ(l.offsets[1], 128u);
    EXPECT_EQ(l.offsets[2], 384u);
    EXPECT_EQ(l.numel, 15u + 200u + 4900u);
    EXPECT_EQ(l.padded, l.shard * static_cast<std::size_t>(world));
    EXPECT_EQ(l.shard * 2 % 4096, 0u);
    EXPECT_GE(l.padded, 384u + 4900u);
    // Every element of every tensor is in exactly one rank's part.
    for (std::size_t t = 0; t < u.tensors.size(); ++t) {
      std::size_t covered = 0;
      for (int r = 0; r < world; ++r) {
        auto [b, e] = l.shard_part(u.tensors, t, r);
        ASSERT_LE(b, e);
        for (std::size_t i = b; i < e; ++i) {
          const std::size_t flat = l.offsets[t] + i;
          ASSERT_EQ(flat / l.shard, static_cast<std::size_t>(r));
        }
        covered += e - b;
      }
      EXPECT_EQ(covered, u.tensors[t].numel());
    }
  }
}

}  // namespace
}  // namespace tz::zero
