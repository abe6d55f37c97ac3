// model/init.h: seeded initial weights. A tensor large enough to be filled on several threads gets
// the same bits as small fills of its parts (each on one thread), from any first element.
#include "model/init.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

namespace tz::model {
namespace {

TEST(FillNormal, ThreadedFillEqualsPiecewiseFill) {
  const std::size_t n = (3u << 20) + 7;  // three 1 Mi-element pieces and a remainder
  for (std::size_t first : {std::size_t{0}, std::size_t{5}}) {
    std::vector<float> whole(n), parts(n);
    fill_normal(whole, 0.02, 1234, 3, 4, first);
    for (std::size_t off = 0; off < n; off += 1001) {
      const std::size_t len = std::min<std::size_t>(1001, n - off);
      fill_normal(std::span<float>(parts).subspan(off, len), 0.02, 1234, 3, 4, first + off);
    }
    ASSERT_EQ(std::memcmp(whole.data(), parts.data(), n * sizeof(float)), 0) << "first " << first;
    double sum = 0, sq = 0;
    for (float v : whole) {
      sum += v;
      sq += static_cast<double>(v) * v;
    }
    const double mean = sum / static_cast<double>(n);
    EXPECT_NEAR(mean, 0.0, 1e-4);
    EXPECT_NEAR(std::sqrt(sq / static_cast<double>(n) - mean * mean), 0.02, 2e-4);
  }
}

}  // namespace
}  // namespace tz::model
