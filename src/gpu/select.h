// Choosing the device a process runs on: CUDA when a usable GPU is present, HostDevice otherwise.
// TZ_DEVICE=cuda|host in the environment forces one and fails clearly when it cannot be had.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "core/status.h"
#include "gpu/device.h"

namespace tz::gpu {

enum class DeviceChoice : std::uint8_t { kAuto, kHost, kCuda };
// Accepts "auto", "host", "cuda"; anything else is kInvalidArgument naming the accepted values.
Result<DeviceChoice> parse_device_choice(std::string_view text);

struct DeviceOptions {
  // kAuto defers to TZ_DEVICE and then to probing; kHost/kCuda (a CLI flag) override TZ_DEVICE.
  DeviceChoice choice = DeviceChoice::kAuto;
  // CUDA device ordinal; -1 picks the launcher's local rank (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
  // SLURM_LOCALID) modulo the number of GPUs, or 0.
  int cuda_ordinal = -1;
  // Byte budget of the device pool; 0 picks a default: 95% of the GPU's free memory, or half of
  // the physical memory for HostDevice.
  std::uint64_t budget_bytes = 0;
};

// Opens the device the options (and TZ_DEVICE) ask for. With kAuto and no TZ_DEVICE, a CUDA
// device that fails to open (no driver, no GPU) falls back to HostDevice with an info log line;
// a forced choice that fails returns the error ("TZ_DEVICE=cuda: no GPU: <reason>").
Result<std::unique_ptr<Device>> open_device(const DeviceOptions& options = {});

// A CudaDevice on GPU `ordinal` with the given budget (0: default), or kUnavailable with
// "no GPU: <reason>" (no driver, no device, or a build without CUDA).
Result<std::unique_ptr<Device>> create_cuda_device(int ordinal, std::uint64_t budget_bytes);

// Half of the machine's physical memory, HostDevice's default budget.
std::uint64_t default_host_budget_bytes();

}  // namespace tz::gpu
