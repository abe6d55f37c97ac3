// GPU library workspaces as plan terms (gpu/workspaces.h), on the CPU: cuBLAS's workspace by
// compute capability, NCCL's buffer estimate from its defaults and the environment's overrides,
// and nothing on HostDevice. Expected values are NCCL's and cuBLAS's documented defaults,
// multiplied out here.
#include <gtest/gtest.h>

#include "gpu/host_device.h"
#include "gpu/workspaces.h"

namespace tz::gpu {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

TEST(GpuWorkspaces, CublasWorkspaceByComputeCapability) {
  EXPECT_EQ(cublas_workspace_bytes(9), 32 * kMiB);   // Hopper (H100/H200)
  EXPECT_EQ(cublas_workspace_bytes(10), 32 * kMiB);  // Blackwell
  EXPECT_EQ(cublas_workspace_bytes(8), 4 * kMiB);    // Ampere and older
}

TEST(GpuWorkspaces, NcclBuffersPerChannelAndRingNeighbour) {
  // Per channel and neighbour: Simple 4 MiB + LL 524288 B + LL128 4915200 B = 9633792 B.
  const std::uint64_t per = 4 * kMiB + 524288 + 4915200;
  EXPECT_EQ(per, 9633792u);
  EXPECT_EQ(nccl_buffer_bytes(1, nullptr, nullptr), 0u);  // one rank: no peers
  EXPECT_EQ(nccl_buffer_bytes(2, nullptr, nullptr), 1 * 32 * per);
  EXPECT_EQ(nccl_buffer_bytes(8, nullptr, nullptr), 2 * 32 * per);  // a ring: two neighbours
  // NCCL_BUFFSIZE and NCCL_MAX_NCHANNELS as the environment gives them.
  EXPECT_EQ(nccl_buffer_bytes(4, "1048576", "4"), 2 * 4 * (kMiB + 524288 + 4915200));
  EXPECT_EQ(nccl_buffer_bytes(4, "0x200000", ""), 2 * 32 * (2 * kMiB + 524288 + 4915200));
  // Unparsable or non-positive values fall back to NCCL's defaults.
  EXPECT_EQ(nccl_buffer_bytes(2, "lots", "-3"), 32 * per);
}

TEST(GpuWorkspaces, NoneOnHostDevice) {
  auto device = HostDevice::create(64 * kMiB);
  ASSERT_TRUE(device.is_ok());
  const DeviceWorkspaces w = device_workspaces(**device, 8, true);
  EXPECT_EQ(w.cublas, 0u);
  EXPECT_EQ(w.nccl, 0u);
}

}  // namespace
}  // namespace tz::gpu
