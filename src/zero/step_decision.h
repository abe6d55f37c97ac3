// The step decision (DESIGN.md, "zero/": step decision (pure)): from the global gradient norm
// totals, the loss scale, the world size, the accumulation, the clipping and the overlap mode, what
// one optimizer step does: skip it (Inf/NaN somewhere), the multiplier the update applies to the
// summed gradient (unscaling, averaging and clipping in one factor), whether eager's early updates
// are rolled back, and which update runs (now over every unit, in the background, or none because
// the early updates were already this step's). No state, no device: a table test covers it
// (tests/unit/zero/step_decision_test.cc).
#pragma once

#include <cstdint>
#include <string_view>

namespace tz::zero {

// tierzero.overlap (docs/zero.md, "Overlap modes").
enum class Overlap : std::uint8_t { kExact, kEager, kDelayed };
std::string_view overlap_name(Overlap overlap);

struct StepInputs {
  // The all-reduced totals over every rank's gradient shards (gpu::NormAccumulator): the sum of
  // squares of the loss-scaled gradient summed over ranks and micro-batches, and how many of its
  // elements were Inf or NaN.
  double sum_squares = 0;
  std::uint64_t nonfinite_count = 0;
  double loss_scale = 1;        // the scale the step's backward used (> 0)
  int world_size = 1;           // >= 1
  int accumulation_steps = 1;   // gradient_accumulation_steps, >= 1
  double max_norm = 0;          // gradient_clipping; 0 = no clipping
  Overlap overlap = Overlap::kExact;
};

// Which update the step runs once decided.
enum class StepUpdate : std::uint8_t {
  kNone,         // overflow: skipped
  kEarlyKept,    // eager: the early updates (multiplier 1 / divisor) were this step's update
  kAllUnitsNow,  // exact, or eager after a rollback: every unit in step(), with `multiplier`
  kBackground,   // delayed: the update starts now and runs during the next step's passes
};

struct StepDecision {
  bool skip = false;         // an Inf/NaN gradient on some rank: no update, loss scale lowered
  double grad_norm = 0;      // L2 norm of the unscaled averaged gradient; +inf on overflow
  double multiplier = 0;     // the factor applied to the summed gradient (undefined when skip)
  bool clipped = false;      // DeepSpeed's clip: max_norm / (norm + 1e-6) < 1
  bool roll_back = false;    // eager: the early updates are undone (clipped or overflowed)
  StepUpdate update = StepUpdate::kNone;
  // The optimizer's update count advances by one (every update but a skipped step's).
  bool counts_update() const { return update != StepUpdate::kNone; }
};

StepDecision decide_step(const StepInputs& in);

}  // namespace tz::zero
