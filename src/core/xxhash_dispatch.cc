// core/xxhash_dispatch.h through the library. Its own translation unit: the dispatch header
// cannot be used beside core/xxhash.h's XXH_INLINE_ALL.
#include "core/xxhash_dispatch.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxh_x86dispatch.h>

namespace tz {

std::uint64_t xxh3_64_dispatch(const void* data, std::size_t bytes) {
  return XXH3_64bits_dispatch(data, bytes);
}

namespace {
XXH3_state_t* state_of(unsigned char* p) { return reinterpret_cast<XXH3_state_t*>(p); }
const XXH3_state_t* state_of(const unsigned char* p) {
  return reinterpret_cast<const XXH3_state_t*>(p);
}
}  // namespace

Xxh3Stream::Xxh3Stream() {
  static_assert(
      sizeof(state_) >= sizeof(XXH3_state_t) && alignof(Xxh3Stream) >= alignof(XXH3_state_t),
      "Xxh3Stream's storage does not hold this libxxhash's XXH3_state_t");
  XXH3_INITSTATE(state_of(state_));
  reset();
}
void Xxh3Stream::reset() { XXH3_64bits_reset(state_of(state_)); }
void Xxh3Stream::update(const void* data, std::size_t bytes) {
  XXH3_64bits_update_dispatch(state_of(state_), data, bytes);
}
std::uint64_t Xxh3Stream::digest() const { return XXH3_64bits_digest(state_of(state_)); }

}  // namespace tz
