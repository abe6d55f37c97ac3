// NcclComm: collectives between GPUs with NCCL, one GPU per process. The NCCL unique id is
// created by rank 0 and broadcast over MPI, so jobs are launched with mpirun or srun (with MPI
// support); without MPI only a single-rank communicator can be made. Built when TZ_NCCL is on.
#pragma once

#include <memory>

#include "comm/comm.h"
#include "gpu/device.h"

namespace tz::comm {

class NcclComm {
 public:
  // A communicator over every process of the job, bound to `device` (a CudaDevice, which must
  // outlive it). Byte counters follow ring_bytes(), as NCCL does not report bytes moved.
  // Errors: kUnavailable (built without NCCL, or several ranks without MPI), kInvalidArgument
  // (not a CUDA device), kCommError (a failed NCCL or MPI call).
  static Result<std::unique_ptr<Comm>> create(gpu::Device& device);
};

bool nccl_built();

}  // namespace tz::comm
