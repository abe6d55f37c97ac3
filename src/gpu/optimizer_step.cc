// Argument checks of the device optimizer step (gpu/optimizer_step.h).
#include "gpu/optimizer_step.h"

#include <string>

namespace tz::gpu {

Status validate_optimizer_step(const OptimizerStepArgs& a) {
  if (a.n == 0) return Status::ok();
  if (a.param == nullptr || a.grad == nullptr) {
    return Status::invalid_argument("optimizer_step: param and grad are required");
  }
  int needed = 0;
  switch (a.kind) {
    case optim::OptimizerKind::kAdam:
      needed = 2;
      break;
    case optim::OptimizerKind::kSgd:
      needed = a.sgd.momentum != 0.0f ? 1 : 0;
      break;
    case optim::OptimizerKind::kLion:
    case optim::OptimizerKind::kAdagrad:
      needed = 1;
      break;
  }
  for (int s = 0; s < needed; ++s) {
    if (a.state[s] == nullptr) {
      return Status::invalid_argument("optimizer_step: state[" + std::to_string(s) +
                                      "] is required by this optimizer");
    }
  }
  if (a.param_copy != nullptr && a.copy_dtype != DType::kBF16 && a.copy_dtype != DType::kF16) {
    return Status::invalid_argument(
        "optimizer_step: the parameter copy must be bf16 or fp16 (an fp32 copy is the "
        "parameters themselves)");
  }
  return Status::ok();
}

}  // namespace tz::gpu
