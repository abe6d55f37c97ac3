// XXH3-64 through libxxhash's runtime dispatch (declared in core/xxhash.h). Its own translation
// unit: the dispatch header cannot be used beside core/xxhash.h's XXH_INLINE_ALL.
#include <xxh_x86dispatch.h>

#include <cstddef>
#include <cstdint>

namespace tz {

std::uint64_t xxh3_64_dispatch(const void* data, std::size_t bytes) {
  return XXH3_64bits_dispatch(data, bytes);
}

}  // namespace tz
