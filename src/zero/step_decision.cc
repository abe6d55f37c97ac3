// The step decision (step_decision.h).
#include "zero/step_decision.h"

#include <cmath>
#include <limits>

#include "core/assert.h"

namespace tz::zero {

std::string_view overlap_name(Overlap overlap) {
  switch (overlap) {
    case Overlap::kExact:
      return "exact";
    case Overlap::kEager:
      return "eager";
    case Overlap::kDelayed:
      return "delayed";
  }
  return "?";
}

StepDecision decide_step(const StepInputs& in) {
  TZ_ASSERT(in.loss_scale > 0, "the loss scale must be positive");
  TZ_ASSERT(in.world_size >= 1 && in.accumulation_steps >= 1, "world size and accumulation >= 1");
  TZ_ASSERT(in.max_norm >= 0, "gradient_clipping must not be negative");
  TZ_ASSERT(in.nonfinite_count > 0 || in.sum_squares >= 0, "a finite sum of squares is >= 0");
  StepDecision d;
  d.skip = in.nonfinite_count > 0;
  // The summed gradient carries the loss scale, every rank's and every micro-batch's share.
  const double divisor = in.loss_scale * static_cast<double>(in.world_size) *
                         static_cast<double>(in.accumulation_steps);
  d.grad_norm = d.skip ? std::numeric_limits<double>::infinity() : std::sqrt(in.sum_squares) / divisor;
  d.multiplier = 1.0 / divisor;
  if (!d.skip && in.max_norm > 0) {
    // DeepSpeed's clipping: scale by max_norm / (norm + 1e-6) when that is below 1.
    const double clip = (d.grad_norm + 1e-6) / in.max_norm;
    if (clip > 1.0) {
      d.multiplier /= clip;
      d.clipped = true;
    }
  }
  switch (in.overlap) {
    case Overlap::kExact:
      d.update = d.skip ? StepUpdate::kNone : StepUpdate::kAllUnitsNow;
      break;
    case Overlap::kEager:
      // The early updates used 1 / divisor: right unless the step clips or overflows.
      d.roll_back = d.skip || d.clipped;
      d.update = d.skip ? StepUpdate::kNone
                        : (d.roll_back ? StepUpdate::kAllUnitsNow : StepUpdate::kEarlyKept);
      break;
    case Overlap::kDelayed:
      d.update = d.skip ? StepUpdate::kNone : StepUpdate::kBackground;
      break;
  }
  TZ_ASSERT(!d.skip || d.update == StepUpdate::kNone, "a skipped step runs no update");
  return d;
}

}  // namespace tz::zero
