// Launcher environment detection (gpu/launch_env.h).
#include "gpu/launch_env.h"

#include <cstdlib>

namespace tz::gpu {
namespace {

// The variable as a non-negative int, or -1 when absent or malformed.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 24) return -1;
  return static_cast<int>(x);
}

}  // namespace

LaunchEnv detect_launch_env() {
  struct Scheme {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
  };
  static constexpr Scheme kSchemes[] = {
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
  };
  for (const Scheme& s : kSchemes) {
    const int rank = env_int(s.rank);
    const int size = env_int(s.size);
    if (rank < 0 || size < 1 || rank >= size) continue;
    LaunchEnv env;
    env.rank = rank;
    env.world_size = size;
    const int local = env_int(s.local_rank);
    env.local_rank = local >= 0 ? local : 0;
    env.launcher = s.launcher;
    return env;
  }
  return LaunchEnv{};
}

}  // namespace tz::gpu
