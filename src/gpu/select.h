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
  // CUDA device ordinal; -1 picks default_cuda_ordinal() (the launcher's local rank) modulo the
  // number of GPUs.
  int cuda_ordinal = -1;
  // Byte budget of the device pool; 0 picks a default: default_cuda_budget_bytes (95% of the
  // GPU's free memory less the libraries' reserve), or half of the physical memory for HostDevice.
  std::uint64_t budget_bytes = 0;
};

// Opens the device the options (and TZ_DEVICE) ask for. With kAuto and no TZ_DEVICE, a CUDA
// device that fails to open (no driver, no GPU) falls back to HostDevice with an info log line;
// a forced choice that fails returns the error ("TZ_DEVICE=cuda: no GPU: <reason>").
Result<std::unique_ptr<Device>> open_device(const DeviceOptions& options = {});

// The GPU a process of this launch opens by default: its local rank as gpu/launch_env.h reads it
// (the same local rank the communicators use), or 0 outside a launcher.
int default_cuda_ordinal();

// A CudaDevice on GPU `ordinal` (modulo the number of GPUs; -1: default_cuda_ordinal()) with the
// given budget (0: default), or kUnavailable with "no GPU: <reason>" (no driver, no device, a
// GPU older than the build's oldest target, or a build without CUDA).
Result<std::unique_ptr<Device>> create_cuda_device(int ordinal, std::uint64_t budget_bytes);

// The oldest compute capability this build has kernels for, as major * 10 + minor (80 for
// sm_80): the smallest entry of CMAKE_CUDA_ARCHITECTURES; 0 when unknown ("native", "all") or
// built without CUDA.
int build_min_compute_capability();

// OK when GPU `ordinal` (named `gpu_name`), of compute capability major.minor, can run the
// build's kernels (major * 10 + minor >= min_cc; min_cc 0 accepts any); otherwise kUnavailable
// "no GPU: <name> (cuda:N) has compute capability 7.5, below 8.0, the oldest this build has
// kernels for (CMAKE_CUDA_ARCHITECTURES)", so the failure is named at open, not at the first
// kernel.
Status check_compute_capability(std::string_view gpu_name, int ordinal, int major, int minor,
                                 int min_cc);

// Memory the default CUDA budget leaves beside the device pool for what libraries and the
// runtime take themselves: cuBLAS/cuBLASLt workspaces (32 MiB per handle on Hopper), NCCL's
// communicator buffers (a few MiB per peer and channel), the sum-of-squares scratch, CUDA graphs.
inline constexpr std::uint64_t kCudaLibraryReserveBytes = 1ull << 30;

// The default budget of a CudaDevice on a GPU with `free_bytes` free: 95% of it less
// kCudaLibraryReserveBytes (at least a quarter of the 95%, for small GPUs).
std::uint64_t default_cuda_budget_bytes(std::uint64_t free_bytes);

// Half of the machine's physical memory, HostDevice's default budget.
std::uint64_t default_host_budget_bytes();

}  // namespace tz::gpu
