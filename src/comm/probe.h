// What `tierzero info` reports about the collective backends. Never fails; calls nothing that
// needs MPI_Init or a GPU.
#pragma once

#include <nlohmann/json.hpp>

namespace tz::comm {

// {"nccl_built": bool, "nccl_version": int (22809 = 2.28.9, 0 if not built),
//  "mpi_built": bool, "mpi_library_version": "Open MPI v4.1.4, ..." ("" if not built),
//  "launcher": "openmpi"|"pmi"|"slurm"|"torchrun"|"none", "rank", "world_size", "local_rank"}.
nlohmann::json probe_comm();

}  // namespace tz::comm
