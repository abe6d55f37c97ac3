// The device optimizer step: one update of a contiguous fp32 shard (master parameters and
// states) from a gradient, optionally writing a 16-bit copy of the new parameters, with the
// per-element math of cpu/optimizer_math.h, the functors the CPU optimizer uses. The CUDA kernel
// calls optimizer_element; HostDevice runs the CPU optimizer's SIMD kernels (cpu/span_update.h),
// which give those functors' bits, so CPU, HostDevice and GPU produce the same bits
// (optimizer_math.h's no-FMA contract).
#pragma once

#include <cstddef>

#include "core/dtype.h"
#include "core/host_device.h"
#include "core/status.h"
#include "cpu/optimizer_math.h"
#include "cpu/span_update.h"

namespace tz::gpu {

// One update of a contiguous fp32 shard: cpu/span_update.h's struct, whose pointers are device
// pointers here, all holding `n` elements and not overlapping. The coefficients are computed once
// per step by the caller (bias corrections, lr, the gradient multiplier = loss unscale x clip
// coefficient). HostDevice hands it to cpu::update_span as it is.
using OptimizerStepArgs = cpu::SpanUpdate;

// kInvalidArgument naming the missing buffer when `args` lacks one its optimizer needs.
Status validate_optimizer_step(const OptimizerStepArgs& args);

// Updates element i. G is the gradient's C++ type, C the copy's (ignored without a copy).
template <typename G, typename C>
TZ_HOST_DEVICE inline void optimizer_element(const OptimizerStepArgs& a, std::size_t i) {
  const float g = to_f32(static_cast<const G*>(a.grad)[i]);
  float& p = a.param[i];
  switch (a.kind) {
    case optim::OptimizerKind::kAdam:
      optim::adam_update(a.adam, g, p, a.state[0][i], a.state[1][i]);
      break;
    case optim::OptimizerKind::kSgd: {
      float unused = 0.0f;
      optim::sgd_update(a.sgd, g, p, a.sgd.momentum != 0.0f ? a.state[0][i] : unused);
      break;
    }
    case optim::OptimizerKind::kLion:
      optim::lion_update(a.lion, g, p, a.state[0][i]);
      break;
    case optim::OptimizerKind::kAdagrad:
      optim::adagrad_update(a.adagrad, g, p, a.state[0][i]);
      break;
  }
  if (a.param_copy != nullptr) static_cast<C*>(a.param_copy)[i] = from_f32<C>(p);
}

}  // namespace tz::gpu
