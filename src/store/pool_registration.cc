// Registration of the pinned pool's slabs as the I/O engine's fixed buffers (pool_registration.h).
#include "store/pool_registration.h"

#include <sys/uio.h>

#include <string>
#include <vector>

namespace tz::store {

Status register_pool_with_queue(nvme::IoQueue& queue, const PinnedPool& pool) {
  std::vector<iovec> regions;
  for (const PinnedSlab& s : pool.slabs()) regions.push_back(iovec{s.data, s.bytes});
  return queue.register_buffers(regions).with_context("registering the pinned pool's " +
                                                      std::to_string(regions.size()) +
                                                      " slabs as I/O fixed buffers");
}

}  // namespace tz::store
