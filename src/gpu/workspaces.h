// GPU memory that libraries hold beside the engine's buffers, as plan terms (zero/plan.h):
// cuBLAS's workspace, set explicitly from the device pool (ops/cuda_ops.cc), and NCCL's channel
// buffers, which NCCL allocates itself (an estimate from its documented defaults). Pure formulas
// plus one function that reads the device and the environment; no CUDA in this header.
#pragma once

#include <cstdint>

namespace tz::gpu {

class Device;

// cuBLAS's workspace for a GPU of compute capability `cc_major`: 32 MiB on Hopper and newer
// (cc >= 9), 4 MiB before (the default pool sizes of cuBLAS's cublasSetWorkspace docs); the
// handle gets exactly this much from the device pool, so it never allocates more on its own.
std::uint64_t cublas_workspace_bytes(int cc_major);

// NCCL's buffers per rank, an estimate: for each channel and each ring neighbour (none with one
// rank, one with two, two from three on), the three protocols' buffers: Simple's NCCL_BUFFSIZE
// (4 MiB by default), LL's 512 KiB and LL128's 4800 KiB (NCCL's defaults). Channels:
// NCCL_MAX_NCHANNELS when set, else 32 (NCCL's most on Hopper). `buffsize` and `max_channels` are
// the environment's values (nullptr or empty: unset; unparsable: the default).
std::uint64_t nccl_buffer_bytes(int world_size, const char* buffsize, const char* max_channels);

struct DeviceWorkspaces {
  std::uint64_t cublas = 0;
  std::uint64_t nccl = 0;
};

// Both for `device` and `world_size` ranks: zero on a device that is host memory (HostDevice has
// no cuBLAS or NCCL); NCCL's from NCCL_BUFFSIZE and NCCL_MAX_NCHANNELS, and only when the ranks
// talk over NCCL (`nccl`).
DeviceWorkspaces device_workspaces(const Device& device, int world_size, bool nccl);

}  // namespace tz::gpu
