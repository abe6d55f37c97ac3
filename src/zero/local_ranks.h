// Ranks as threads of one process (tests, benches, `tierzero train --ranks N` without MPI): not
// part of the engine, which takes any Device and Comm.
#pragma once

#include <cstdint>
#include <functional>

#include "comm/comm.h"
#include "core/status.h"
#include "gpu/device.h"

namespace tz::zero {

// Runs `world_size` ranks as threads of this process, each with its own HostDevice (a pool of
// `device_budget_bytes`; 0 = the default) and a LocalComm of one group, and calls
// `fn(rank, device, comm)` on rank r's thread. Returns the first rank's error, naming the rank.
using RankFn = std::function<Status(int rank, gpu::Device& device, comm::Comm& comm)>;
Status run_local_ranks(int world_size, std::uint64_t device_budget_bytes, const RankFn& fn);

}  // namespace tz::zero
