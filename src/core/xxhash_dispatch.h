// XXH3-64 through libxxhash's runtime dispatch (AVX2 / AVX-512 where the CPU has them), one-shot
// and streamed; why and where the tree uses it: core/xxhash.h. No xxHash header here, so that
// both core/xxhash.h (XXH_INLINE_ALL) and xxhash_dispatch.cc (the library) can include it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tz {

// XXH3-64 of `bytes` at `data` through libxxhash's runtime dispatch (AVX2 / AVX-512 where the CPU
// has them): the same hash as XXH3_64bits.
std::uint64_t xxh3_64_dispatch(const void* data, std::size_t bytes);

// XXH3-64 streamed through the same dispatch: digest() is XXH3_64bits of the bytes update()
// fed since the last reset(). For bytes hashed piece by piece while they are in cache (the CPU
// optimizer's tiles: 42-44 GB/s on 64 KiB tiles on the Intel VM against 21 GB/s for the inlined
// SSE2 code). Lives where it is declared (a stack object, no allocation), as XXH3_state_t would.
class Xxh3Stream {
 public:
  Xxh3Stream();
  void reset();
  void update(const void* data, std::size_t bytes);
  std::uint64_t digest() const;

 private:
  // libxxhash's XXH3_state_t (whose type differs under XXH_INLINE_ALL); xxhash_dispatch.cc
  // checks the size and alignment.
  alignas(64) unsigned char state_[576];
};

}  // namespace tz
