// xxHash (Debian's libxxhash), inlined from its header: on the Zen 5 VM of the sixteenth session
// XXH3 ran at 28-32 GB/s inlined against 19 GB/s through the shared library's plain (generic)
// symbol (bench/RESULTS.md); checkpoints and the engine's `params_xxh3` use it. The store's
// swap pieces, which come from memory, go through the library's runtime dispatch instead
// (xxh3_64_dispatch): on the Intel VM of the twenty-fourth session it hashed them at 5.8-7.0 GB/s
// against 3.5-4.2 for the inlined baseline (SSE2) code, and took 0.5-1.8 s of CPU less in each
// gpt2-774m NVMe step; so do the CPU optimizer's tiles, hashed in cache (Xxh3Stream). The
// hashes are the same every way.
#pragma once

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/xxhash_dispatch.h"
