// Launch-error handling (gpu/launch_check.h), and the CUDA runtime's LaunchErrors.
#include "gpu/launch_check.h"

#include <string>

#include "core/log.h"

#if defined(TZ_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace tz::gpu {

Status clear_before_launch(LaunchErrors& errors, std::string_view what) {
  const int pending = errors.take();
  if (pending == 0) return Status::ok();
  const int again = errors.take();
  const std::string name = errors.describe(pending);
  if (again == 0) {
    TZ_LOG_WARN("before %.*s: cleared a pending CUDA error of an earlier call: %s",
                static_cast<int>(what.size()), what.data(), name.c_str());
    return Status::ok();
  }
  return Status(ErrorCode::kDeviceError, pending,
                std::string(what) + " not launched: an earlier CUDA call or kernel failed with " +
                    name + ", a sticky error (the device context is lost)");
}

Status launch_result(LaunchErrors& errors, int code, std::string_view what) {
  if (code == 0) return Status::ok();
  return Status(ErrorCode::kDeviceError, code,
                std::string(what) + ": launch failed: " + errors.describe(code));
}

#if defined(TZ_HAVE_CUDA)
namespace {

class CudaLaunchErrors final : public LaunchErrors {
 public:
  int take() override { return static_cast<int>(cudaGetLastError()); }
  std::string describe(int code) const override {
    const auto err = static_cast<cudaError_t>(code);
    return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ", code " +
           std::to_string(code) + ")";
  }
};

}  // namespace

LaunchErrors& cuda_launch_errors() {
  static CudaLaunchErrors errors;
  return errors;
}
#endif

}  // namespace tz::gpu
