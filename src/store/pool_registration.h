// The one place a pinned pool's slabs become an I/O queue's fixed buffers. It sits in store/,
// above both nvme/ and cpu/, so that those two layers stay ignorant of each other (DESIGN.md,
// layers): the pool hands out slabs, the queue registers memory regions, this joins them.
#pragma once

#include "core/status.h"
#include "cpu/pinned_pool.h"
#include "nvme/io_queue.h"

namespace tz::store {

// Registers every slab of `pool` with the queue's engine as fixed buffers (io_uring; libaio and
// psync accept and ignore them). The pool must outlive every request the queue makes from it.
// Errors: the engine's refusal (for io_uring typically RLIMIT_MEMLOCK), with context saying the
// pinned pool was being registered.
Status register_pool_with_queue(nvme::IoQueue& queue, const PinnedPool& pool);

}  // namespace tz::store
