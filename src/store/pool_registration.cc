// Registration of the pinned pool's slabs as the I/O engine's fixed buffers (pool_registration.h).
#include "store/pool_registration.h"

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace tz::store {

std::vector<iovec> fixed_buffer_regions(std::span<const PinnedSlab> slabs) {
  std::vector<iovec> regions;
  for (const PinnedSlab& s : slabs) {
    auto* base = static_cast<std::byte*>(s.data);
    for (std::uint64_t at = 0; at < s.bytes; at += kMaxFixedBuffer) {
      regions.push_back(iovec{base + at, std::min(kMaxFixedBuffer, s.bytes - at)});
    }
  }
  return regions;
}

Status register_pool_with_queue(nvme::IoQueue& queue, const PinnedPool& pool) {
  const std::vector<PinnedSlab> slabs = pool.slabs();
  const std::vector<iovec> regions = fixed_buffer_regions(slabs);
  return queue.register_buffers(regions).with_context(
      "registering the pinned pool's " + std::to_string(slabs.size()) + " slabs as " +
      std::to_string(regions.size()) + " I/O fixed buffers");
}

}  // namespace tz::store
