// The ways the tree hashes with XXH3-64 give the same hash: the header's inlined code
// (checkpoints, params_xxh3), libxxhash's runtime dispatch (the store's swap pieces) and its
// streamed form (the CPU optimizer's tiles), so a piece hashed by one is checked by another.
#include <gtest/gtest.h>

#include <algorithm>
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

TEST(Xxhash, StreamedInUnevenPartsGivesTheOneShotHash) {
  std::mt19937_64 rng(8);
  std::vector<unsigned char> data((1u << 20) + 3);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  Xxh3Stream st;
  for (std::size_t part :
       {std::size_t{1}, std::size_t{63}, std::size_t{4096}, std::size_t{65536}}) {
    st.reset();
    for (std::size_t off = 0; off < data.size(); off += part) {
      st.update(data.data() + off, std::min(part, data.size() - off));
    }
    EXPECT_EQ(st.digest(), XXH3_64bits(data.data(), data.size())) << "parts of " << part;
  }
  st.reset();
  EXPECT_EQ(st.digest(), XXH3_64bits(data.data(), 0));
}

}  // namespace
}  // namespace tz
