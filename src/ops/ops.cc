// Ops::create: the backend for the device's kind (ops/ops.h).
#include "ops/ops.h"

#include "ops/internal/backends.h"

namespace tz::ops {

Result<std::unique_ptr<Ops>> Ops::create(gpu::Device& device, const OpsOptions& options) {
  if (options.cpu_threads < 0) {
    return Status::invalid_argument("ops: cpu_threads must be >= 0 (0 = every core), got " +
                                    std::to_string(options.cpu_threads));
  }
  switch (device.kind()) {
    case gpu::DeviceKind::kHost:
      return internal::create_cpu_ops(device, options);
    case gpu::DeviceKind::kCuda:
#if defined(TZ_HAVE_CUDA)
      return internal::create_cuda_ops(device, options);
#else
      return Status::unavailable(
          "ops: the CUDA kernels are not built in (configure with -DTZ_CUDA=ON on a machine with "
          "nvcc)");
#endif
  }
  return Status::internal("ops: unknown device kind");
}

}  // namespace tz::ops
