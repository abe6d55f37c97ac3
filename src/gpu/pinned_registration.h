// Connects the pinned host pool (cpu/pinned_pool.h) to a device: every slab, present and
// future, is registered for fast asynchronous copies (cudaHostRegister on CUDA) and unregistered
// before the pool unmaps it.
#pragma once

#include "core/status.h"
#include "cpu/pinned_pool.h"
#include "gpu/device.h"

namespace tz::gpu {

// Registers the slabs of `pool` with `device` through a slab hook. On failure the slabs already
// registered are unregistered and the error (naming the slab) is returned. The device must
// outlive the pool (the hook unregisters from it when the pool is destroyed).
Status register_pinned_pool(Device& device, PinnedPool& pool);

}  // namespace tz::gpu
