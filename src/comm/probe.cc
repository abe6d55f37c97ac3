// Collective-backend probe for `tierzero info` (comm/probe.h).
#include "comm/probe.h"

#include <string>

#include "comm/launch_env.h"

#if defined(TZ_HAVE_MPI)
#include <mpi.h>
#endif
#if defined(TZ_HAVE_NCCL)
#include <nccl.h>
#endif

namespace tz::comm {

nlohmann::json probe_comm() {
  nlohmann::json out;
#if defined(TZ_HAVE_NCCL)
  out["nccl_built"] = true;
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) version = 0;
  // NCCL >= 2.9 encodes its version as major * 10000 + minor * 100 + patch.
  out["nccl_version"] = version == 0 ? std::string("unknown")
                                     : std::to_string(version / 10000) + "." +
                                           std::to_string(version / 100 % 100) + "." +
                                           std::to_string(version % 100);
  out["nccl_version_code"] = version;
#else
  out["nccl_built"] = false;
  out["nccl_version"] = "not built";
  out["nccl_version_code"] = 0;
#endif
#if defined(TZ_HAVE_MPI)
  out["mpi_built"] = true;
  // MPI_Get_library_version may be called before MPI_Init.
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(text, &len) == MPI_SUCCESS) {
    std::string s(text, static_cast<std::size_t>(len > 0 ? len : 0));
    while (!s.empty() && (s.back() == '\n' || s.back() == '\0' || s.back() == ' ')) s.pop_back();
    out["mpi_library_version"] = s;
  } else {
    out["mpi_library_version"] = "";
  }
#else
  out["mpi_built"] = false;
  out["mpi_library_version"] = "";
#endif
  const LaunchEnv env = detect_launch_env();
  out["launcher"] = env.launcher;
  out["rank"] = env.rank;
  out["world_size"] = env.world_size;
  out["local_rank"] = env.local_rank;
  return out;
}

}  // namespace tz::comm
