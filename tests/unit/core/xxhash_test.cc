// The two ways the tree hashes with XXH3-64 give the same hash: the header's inlined code
// (checkpoints, params_xxh3) and libxxhash's runtime dispatch (the store's swap pieces), so a
// piece hashed by one is checked by the other.
#include <gtest/gtest.h>

#include <cstddef>
#include <random>
#include <vector>

#include "core/xxhash.h"

namespace tz {
namespace {

TEST(Xxhash, DispatchGivesTheInlinedHash) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> data((1u << 20) + 3);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  // Lengths across XXH3's code paths: empty, short inputs, the 240-byte edge, long inputs.
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{240},
                        std::size_t{241}, std::size_t{4096}, data.size()}) {
    EXPECT_EQ(xxh3_64_dispatch(data.data(), n), XXH3_64bits(data.data(), n)) << n << " bytes";
  }
}

}  // namespace
}  // namespace tz
