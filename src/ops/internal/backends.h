// Internal to ops/: the factories of the two backends behind Ops::create (ops.cc).
#pragma once

#include <memory>

#include "core/status.h"
#include "ops/ops.h"

namespace tz::ops::internal {

Result<std::unique_ptr<Ops>> create_cpu_ops(gpu::Device& device, const OpsOptions& options);
#if defined(TZ_HAVE_CUDA)
Result<std::unique_ptr<Ops>> create_cuda_ops(gpu::Device& device, const OpsOptions& options);
#endif

}  // namespace tz::ops::internal
