// Device selection: TZ_DEVICE, probing for CUDA, fallback to HostDevice.
#include "gpu/select.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/log.h"
#include "gpu/host_device.h"
#include "gpu/launch_env.h"

namespace tz::gpu {
namespace {

Result<std::unique_ptr<Device>> open_host(std::uint64_t budget_bytes) {
  TZ_ASSIGN_OR_RETURN(auto host,
                      HostDevice::create(budget_bytes != 0 ? budget_bytes
                                                           : default_host_budget_bytes()));
  return std::unique_ptr<Device>(std::move(host));
}

}  // namespace

Result<DeviceChoice> parse_device_choice(std::string_view text) {
  if (text == "auto") return DeviceChoice::kAuto;
  if (text == "host") return DeviceChoice::kHost;
  if (text == "cuda") return DeviceChoice::kCuda;
  return Status::invalid_argument("device '" + std::string(text) +
                                  "': expected one of auto, host, cuda");
}

int build_min_compute_capability() {
#if defined(TZ_CUDA_MIN_ARCH)
  return TZ_CUDA_MIN_ARCH;
#else
  return 0;
#endif
}

Status check_compute_capability(std::string_view gpu_name, int ordinal, int major, int minor,
                                int min_cc) {
  if (min_cc <= 0 || major * 10 + minor >= min_cc) return Status::ok();
  return Status::unavailable("no GPU: " + std::string(gpu_name) + " (cuda:" +
                             std::to_string(ordinal) + ") has compute capability " +
                             std::to_string(major) + "." + std::to_string(minor) + ", below " +
                             std::to_string(min_cc / 10) + "." + std::to_string(min_cc % 10) +
                             ", the oldest this build has kernels for (CMAKE_CUDA_ARCHITECTURES)");
}

std::uint64_t default_cuda_budget_bytes(std::uint64_t free_bytes) {
  const std::uint64_t usable = free_bytes / 100 * 95;
  const std::uint64_t floor = usable / 4;
  return usable > kCudaLibraryReserveBytes + floor ? usable - kCudaLibraryReserveBytes : floor;
}

int default_cuda_ordinal() { return detect_launch_env().local_rank; }

std::uint64_t default_host_budget_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 1ull << 30;  // unknown: a modest 1 GiB
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size) / 2;
}

Result<std::unique_ptr<Device>> open_device(const DeviceOptions& options) {
  DeviceChoice choice = options.choice;
  std::string source = "device";
  if (choice == DeviceChoice::kAuto) {
    if (const char* env = std::getenv("TZ_DEVICE"); env != nullptr && *env != '\0') {
      Result<DeviceChoice> parsed = parse_device_choice(env);
      if (!parsed.is_ok()) return std::move(parsed).take_status().with_context("TZ_DEVICE");
      choice = *parsed;
      source = "TZ_DEVICE";
    }
  }
  const int ordinal = options.cuda_ordinal >= 0 ? options.cuda_ordinal : default_cuda_ordinal();
  switch (choice) {
    case DeviceChoice::kHost:
      return open_host(options.budget_bytes);
    case DeviceChoice::kCuda: {
      Result<std::unique_ptr<Device>> cuda = create_cuda_device(ordinal, options.budget_bytes);
      if (!cuda.is_ok()) {
        return std::move(cuda).take_status().with_context(source + "=cuda");
      }
      return cuda;
    }
    case DeviceChoice::kAuto: {
      Result<std::unique_ptr<Device>> cuda = create_cuda_device(ordinal, options.budget_bytes);
      if (cuda.is_ok()) return cuda;
      TZ_LOG_INFO("using HostDevice (%s)", cuda.status().message().c_str());
      return open_host(options.budget_bytes);
    }
  }
  return Status::internal("open_device: unknown choice");
}

}  // namespace tz::gpu
