// Choosing the collective backend for a process: NCCL for CUDA devices, MPI for CPU processes
// launched by mpirun/srun, LocalComm (one rank) for a single CPU process.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "comm/comm.h"
#include "gpu/device.h"

namespace tz::comm {

enum class CommBackend : std::uint8_t { kAuto, kLocal, kMpi, kNccl };
// Accepts "auto", "local", "mpi", "nccl".
Result<CommBackend> parse_comm_backend(std::string_view text);

// The communicator of this process over all ranks of the job. kAuto: NCCL when `device` is a
// CUDA device and NCCL is built; else MPI when a launcher reports more than one rank (or
// kMpi is asked); else a single-rank LocalComm. kLocal gives a single-rank LocalComm (use
// LocalComm::create_group for several threads). `device` must outlive the communicator.
Result<std::unique_ptr<Comm>> open_comm(gpu::Device& device, CommBackend backend);

}  // namespace tz::comm
