// GPU probe for `tierzero info` (gpu/probe.h).
#include "gpu/probe.h"

#include <string>

#if defined(TZ_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace tz::gpu {

nlohmann::json probe_gpus() {
  nlohmann::json out;
  out["gpus"] = nlohmann::json::array();
#if defined(TZ_HAVE_CUDA)
  out["cuda_built"] = true;
  int driver = 0;
  int runtime = 0;
  // Both calls work without a driver (the driver version is then 0); errors leave the zeros.
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  out["driver_version"] = driver;
  out["runtime_version"] = runtime;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    out["error"] = std::string("no GPU: ") + cudaGetErrorName(err) + " (" +
                   cudaGetErrorString(err) + ")";
    return out;
  }
  if (count == 0) {
    out["error"] = "no GPU: the CUDA driver reports 0 devices";
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    nlohmann::json gpu;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      gpu["error"] = "cudaGetDeviceProperties failed";
      out["gpus"].push_back(gpu);
      continue;
    }
    gpu["name"] = prop.name;
    gpu["memory_bytes"] = static_cast<std::uint64_t>(prop.totalGlobalMem);
    gpu["compute_capability"] = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), i) == cudaSuccess) {
      gpu["pci_bus_id"] = bus_id;
    } else {
      gpu["pci_bus_id"] = "";
    }
    out["gpus"].push_back(gpu);
  }
#else
  out["cuda_built"] = false;
  out["driver_version"] = 0;
  out["runtime_version"] = 0;
  out["error"] = "no GPU: tierzero was built without CUDA (TZ_CUDA=OFF)";
#endif
  return out;
}

}  // namespace tz::gpu
