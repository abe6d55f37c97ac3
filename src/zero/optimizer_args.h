// The device optimizer's per-step coefficients from the same OptimizerSpec and StepArgs the CPU
// optimizer takes, computed exactly as cpu/optimizer.cc does for its own kernels, so that an
// update on the device and one on the CPU produce the same bits (the engine's offload choices
// must not change the result).
#pragma once

#include "cpu/optimizer.h"
#include "gpu/optimizer_step.h"

namespace tz::zero {

// Coefficients of `spec` for `args` (step, grad_multiplier, lr_override); buffers left null.
gpu::OptimizerStepArgs device_step_coeffs(const cpu::OptimizerSpec& spec,
                                          const cpu::StepArgs& args);

// Coefficients that make Device::optimizer_step compute param[i] += grad[i] exactly (fp32
// accumulation of a 16-bit or fp32 gradient): SGD without momentum or decay, lr = -1, scale 1.
// The Device interface has no add kernel; p - (-1 * g) is the IEEE sum p + g.
gpu::OptimizerStepArgs device_accumulate_coeffs();

}  // namespace tz::zero
