// GPU library workspaces as plan terms (workspaces.h).
#include "gpu/workspaces.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "gpu/device.h"

#if defined(TZ_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace tz::gpu {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
// NCCL's defaults (src/include/device.h): DEFAULT_BUFFSIZE, DEFAULT_LL_BUFFSIZE
// (8 lines x 512 threads x 8 steps x 16 B) and DEFAULT_LL128_BUFFSIZE (120 x 640 x 8 x 8 B).
constexpr std::uint64_t kSimpleDefault = 4 * kMiB;
constexpr std::uint64_t kLl = 8ull * 512 * 8 * 16;
constexpr std::uint64_t kLl128 = 120ull * 640 * 8 * 8;
constexpr std::uint64_t kChannelsDefault = 32;

// A positive integer from the environment's text, else `fallback`.
std::uint64_t env_value(const char* text, std::uint64_t fallback) {
  if (text == nullptr || *text == '\0' || *text == '-') return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 0);
  return (end != nullptr && *end == '\0' && v > 0) ? v : fallback;
}

}  // namespace

std::uint64_t cublas_workspace_bytes(int cc_major) { return cc_major >= 9 ? 32 * kMiB : 4 * kMiB; }

std::uint64_t nccl_buffer_bytes(int world_size, const char* buffsize, const char* max_channels) {
  const std::uint64_t neighbours = static_cast<std::uint64_t>(std::clamp(world_size - 1, 0, 2));
  const std::uint64_t channels = env_value(max_channels, kChannelsDefault);
  return neighbours * channels * (env_value(buffsize, kSimpleDefault) + kLl + kLl128);
}

DeviceWorkspaces device_workspaces(const Device& device, int world_size, bool nccl) {
  DeviceWorkspaces w;
  if (device.host_accessible() || device.cuda_ordinal() < 0) return w;
  int major = 9;
#if defined(TZ_HAVE_CUDA)
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.cuda_ordinal()) !=
      cudaSuccess) {
    major = 9;
  }
#endif
  w.cublas = cublas_workspace_bytes(major);
  if (nccl) {
    w.nccl = nccl_buffer_bytes(world_size, std::getenv("NCCL_BUFFSIZE"),
                               std::getenv("NCCL_MAX_NCHANNELS"));
  }
  return w;
}

}  // namespace tz::gpu
