// run_local_ranks (local_ranks.h): ranks as threads of this process, each with its own HostDevice
// and a LocalComm of one group.
#include "zero/local_ranks.h"

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/local_comm.h"
#include "core/thread_name.h"
#include "gpu/host_device.h"

namespace tz::zero {

Status run_local_ranks(int world_size, std::uint64_t device_budget_bytes, const RankFn& fn) {
  TZ_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<comm::Comm>> comms,
                      comm::LocalComm::create_group(world_size));
  const std::uint64_t budget = device_budget_bytes > 0 ? device_budget_bytes : (4ull << 30);
  std::vector<Status> results(static_cast<std::size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      set_thread_name("tz-rank-" + std::to_string(r));
      auto device = gpu::HostDevice::create(budget);
      Status s = device.is_ok() ? fn(r, **device, *comms[static_cast<std::size_t>(r)])
                                : device.status();
      results[static_cast<std::size_t>(r)] = std::move(s);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world_size; ++r) {
    Status& s = results[static_cast<std::size_t>(r)];
    if (!s.is_ok()) return std::move(s).with_context("rank " + std::to_string(r));
  }
  return Status::ok();
}

}  // namespace tz::zero
