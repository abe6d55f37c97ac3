// Rank, world size and local rank as the launcher set them: Open MPI (OMPI_COMM_WORLD_*), MPICH
// / Intel MPI (PMI_*, MPI_LOCALRANKID), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) or
// torchrun (RANK, WORLD_SIZE, LOCAL_RANK), first match wins. The one reader of these variables:
// the communicators take rank and world size from it, the device choice its local rank (the GPU
// a process opens), so both always agree. It lives in gpu/ because comm/ depends on gpu/.
#pragma once

#include <string>

namespace tz::gpu {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // "openmpi", "pmi", "slurm", "torchrun", or "none" (a single process).
  std::string launcher = "none";
};

LaunchEnv detect_launch_env();

}  // namespace tz::gpu
