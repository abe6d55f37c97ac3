// xxHash (Debian's libxxhash), inlined from its header: XXH3 runs at 28-32 GB/s on the Zen 5 VM
// of the sixteenth session, against 19 GB/s through the shared library's generic build
// (bench/RESULTS.md). The store hashes every NVMe piece it writes or reads (16 GB a step at
// gpt2-774m), so every file that hashes includes this instead of <xxhash.h>. The hashes are the
// same either way.
#pragma once

#define XXH_INLINE_ALL
#include <xxhash.h>
