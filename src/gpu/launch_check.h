// Kernel launches report their own failure only. The CUDA runtime keeps one "last error" per
// thread: a runtime call that failed earlier (already reported through its own check) or an
// asynchronous fault of an earlier kernel leaves it set, and a wrapper that reads it only after
// launching would blame the next kernel for it. So every launch first takes what is pending: a
// pending error that clears is logged as an earlier call's and dropped; one that does not clear (a
// sticky error: the context is lost and every later call fails) is returned, named as an earlier
// failure, and nothing is launched. Then the launch's own error is read and named after it.
//
// The logic is written against LaunchErrors so that tests drive it with a fake on the CPU;
// cuda_launch_errors() is the CUDA runtime's (cudaGetLastError). No CUDA header here.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace tz::gpu {

class LaunchErrors {
 public:
  virtual ~LaunchErrors() = default;
  // The pending error code, which reading clears unless it is sticky (cudaGetLastError); 0 is
  // success.
  virtual int take() = 0;
  // "cudaErrorX (text, code N)" for a code.
  virtual std::string describe(int code) const = 0;
};

// Empties the pending error before launching `what` (above). OK unless the error is sticky.
Status clear_before_launch(LaunchErrors& errors, std::string_view what);

// The status of launching `what`, whose own error (read right after the launch) is `code`:
// kDeviceError naming `what` and the error, or OK.
Status launch_result(LaunchErrors& errors, int code, std::string_view what);

// clear_before_launch, then `launch` (which enqueues the kernels and returns the error read right
// after them, as the launchers of cuda_kernels.h do), then launch_result.
template <typename Launch>
Status checked_launch(LaunchErrors& errors, std::string_view what, Launch&& launch) {
  TZ_RETURN_IF_ERROR(clear_before_launch(errors, what));
  return launch_result(errors, launch(), what);
}

// The CUDA runtime's last error of the calling thread. Only in builds with CUDA (TZ_HAVE_CUDA).
LaunchErrors& cuda_launch_errors();

}  // namespace tz::gpu
