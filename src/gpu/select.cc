// Device selection: TZ_DEVICE, probing for CUDA, fallback to HostDevice.
#include "gpu/select.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/log.h"
#include "gpu/host_device.h"

namespace tz::gpu {
namespace {

int local_rank_from_env() {
  for (const char* var : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                          "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && r >= 0) return static_cast<int>(r);
    }
  }
  return 0;
}

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
  const int ordinal = options.cuda_ordinal >= 0 ? options.cuda_ordinal : local_rank_from_env();
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
