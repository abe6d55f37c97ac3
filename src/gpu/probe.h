// What `tierzero info` reports about GPUs. Never fails and never crashes, also on machines
// without a GPU or a CUDA driver.
#pragma once

#include <nlohmann/json.hpp>

namespace tz::gpu {

// {"cuda_built": bool, "driver_version": int, "runtime_version": int,
//  "gpus": [{"name", "memory_bytes", "compute_capability": "9.0", "pci_bus_id"}],
//  "error": "no GPU: <reason>" (only when no GPU can be used)}.
// Versions are CUDA's integers (12040 = 12.4); 0 when unknown.
nlohmann::json probe_gpus();

}  // namespace tz::gpu
