// store_pin_cost: the cost of one store pin as the number of blocks grows (issue 14, defect 5).
// A device-only trace walk over N host-homed blocks of 4 KiB on HostDevice: step 1 records the
// trace, the timed steps pin (kRead on the device), wait and release every block in the same
// order. With a device fraction of 1 every block fits, so a timed pin finds its block resident;
// below 1 the walk evicts and loads on the way. Not a test (no timing is asserted): run it by
// hand, `store_pin_cost [fraction] [steps] [N...]`, default 1.0 3 500 2000 8000. Prints the
// median over the timed steps of the mean µs per pin.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cpu/pinned_pool.h"
#include "gpu/host_device.h"
#include "store/store.h"

namespace tz::store {
namespace {

constexpr std::uint64_t kBlockBytes = 4096;

Result<double> pin_cost(std::uint32_t n, double fraction, std::uint32_t steps) {
  const std::uint64_t total = kBlockBytes * n;
  StoreOptions so;
  so.device_budget_bytes = std::max<std::uint64_t>(
      kBlockBytes, static_cast<std::uint64_t>(fraction * static_cast<double>(total)));
  so.host_budget_bytes = total + (1 << 20);
  so.chunk_bytes = 1 << 20;
  so.staging_buffers = 1;
  auto device = gpu::HostDevice::create(so.device_budget_bytes);
  if (!device) return device.status();
  PinnedPoolOptions po;
  po.budget_bytes = 2 * so.host_budget_bytes + so.chunk_bytes + (8 << 20);
  po.slab_bytes = 32ull << 20;
  po.huge_pages = false;
  po.prefault = false;
  po.lock = MemlockPolicy::kOff;
  TZ_ASSIGN_OR_RETURN(PinnedPool pool, PinnedPool::create(po));
  std::vector<double> per_step;
  {
    TZ_ASSIGN_OR_RETURN(auto st, Store::create(so, **device, pool, nullptr));
    std::vector<BlockId> ids;
    for (std::uint32_t i = 0; i < n; ++i) {
      TZ_ASSIGN_OR_RETURN(BlockId id,
                          st->create_block(kBlockBytes, Tier::kHost, "b" + std::to_string(i)));
      ids.push_back(id);
    }
    TZ_RETURN_IF_ERROR(st->drain());
    for (std::uint32_t step = 0; step <= steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      for (BlockId id : ids) {
        TZ_ASSIGN_OR_RETURN(Lease lease, st->pin(id, Tier::kDevice, Access::kRead));
        TZ_RETURN_IF_ERROR(lease.wait());
      }
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      st->mark_step();
      if (step > 0) per_step.push_back(s * 1e6 / n);  // step 0 records the trace
    }
    TZ_RETURN_IF_ERROR(st->drain());
  }
  std::sort(per_step.begin(), per_step.end());
  return per_step[per_step.size() / 2];
}

}  // namespace
}  // namespace tz::store

int main(int argc, char** argv) {
  const double fraction = argc > 1 ? std::atof(argv[1]) : 1.0;
  const auto steps = static_cast<std::uint32_t>(argc > 2 ? std::atoi(argv[2]) : 3);
  std::vector<std::uint32_t> counts;
  for (int i = 3; i < argc; ++i) counts.push_back(static_cast<std::uint32_t>(std::atoi(argv[i])));
  if (counts.empty()) counts = {500, 2000, 8000};
  if (fraction <= 0 || fraction > 1 || steps == 0) {
    std::fprintf(stderr, "usage: store_pin_cost [fraction in (0,1]] [steps > 0] [N...]\n");
    return 2;
  }
  for (std::uint32_t n : counts) {
    auto us = tz::store::pin_cost(n, fraction, steps);
    if (!us) {
      std::fprintf(stderr, "store_pin_cost: %s\n", us.status().to_string().c_str());
      return 1;
    }
    std::printf("blocks %6u  block 4096 B  device %.2f of the bytes  %10.2f us per pin\n", n,
                fraction, *us);
  }
  return 0;
}
