// xxHash (Debian's libxxhash), inlined from its header: on the Zen 5 VM of the sixteenth session
// XXH3 ran at 28-32 GB/s inlined against 19 GB/s through the shared library's plain (generic)
// symbol (bench/RESULTS.md); checkpoints and the engine's `params_xxh3` use it. The store's
// swap pieces, which come from memory, go through the library's runtime dispatch instead
// (xxh3_64_dispatch): on the Intel VM of the twenty-fourth session it hashed them at 5.8-7.0 GB/s
// against 3.5-4.2 for the inlined baseline (SSE2) code, and took 0.5-1.8 s of CPU less in each
// gpt2-774m NVMe step. The hashes are the same every way.
#pragma once

#include <cstddef>
#include <cstdint>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tz {

// XXH3-64 of `bytes` at `data` through libxxhash's runtime dispatch (AVX2 / AVX-512 where the CPU
// has them): the same hash as XXH3_64bits.
std::uint64_t xxh3_64_dispatch(const void* data, std::size_t bytes);

}  // namespace tz
