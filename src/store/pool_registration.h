// The one place a pinned pool's slabs become an I/O queue's fixed buffers. It sits in store/,
// above both nvme/ and cpu/, so that those two layers stay ignorant of each other (DESIGN.md,
// layers): the pool hands out slabs, the queue registers memory regions, this joins them.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "cpu/pinned_pool.h"
#include "nvme/io_queue.h"

namespace tz::store {

// The fixed-buffer regions of `slabs`: each slab cut into consecutive pieces of at most
// kMaxFixedBuffer bytes (io_uring's limit per registered buffer), so a slab sized for a block over
// 1 GiB registers too. A request inside one piece uses it; one that straddles two goes through the
// engine's plain read/write path (nvme/uring_engine.cc finds no buffer holding it whole).
inline constexpr std::uint64_t kMaxFixedBuffer = 1ull << 30;
std::vector<iovec> fixed_buffer_regions(std::span<const PinnedSlab> slabs);

// Registers every slab of `pool` with the queue's engine as fixed buffers (io_uring; libaio and
// psync accept and ignore them), in fixed_buffer_regions' pieces. The pool must outlive every
// request the queue makes from it. Errors: the engine's refusal (for io_uring typically
// RLIMIT_MEMLOCK), with context saying the pinned pool was being registered.
Status register_pool_with_queue(nvme::IoQueue& queue, const PinnedPool& pool);

}  // namespace tz::store
