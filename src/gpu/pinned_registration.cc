// Slab hook that registers PinnedPool slabs with a Device (gpu/pinned_registration.h).
#include "gpu/pinned_registration.h"

#include <string>

#include "core/log.h"

namespace tz::gpu {

Status register_pinned_pool(Device& device, PinnedPool& pool) {
  PinnedSlabHook hook;
  hook.name = std::string(device_kind_name(device.kind()));
  hook.on_add = [&device](const PinnedSlab& slab) -> Status {
    Status st = device.register_host_memory(slab.data, slab.bytes);
    if (!st.is_ok()) {
      return std::move(st).with_context("registering pinned slab " + std::to_string(slab.index) +
                                        " (" + std::to_string(slab.bytes) + " B) with " +
                                        device.name());
    }
    return Status::ok();
  };
  hook.on_remove = [&device](const PinnedSlab& slab) {
    Status st = device.unregister_host_memory(slab.data);
    if (!st.is_ok()) {
      TZ_LOG_WARN("unregistering pinned slab %zu: %s", slab.index, st.to_string().c_str());
    }
  };
  return pool.add_slab_hook(std::move(hook));
}

}  // namespace tz::gpu
