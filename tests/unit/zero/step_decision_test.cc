// The step decision (zero/step_decision.h) as a table: each row's inputs and the outcome written
// out by hand from DeepSpeed's rules (divisor = loss scale x world x accumulation; norm =
// sqrt(sum of squares) / divisor; clip when (norm + 1e-6) / max_norm > 1; eager rolls back on a
// clip or an overflow; an overflow skips in every mode).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "zero/step_decision.h"

namespace tz::zero {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Row {
  std::string name;
  StepInputs in;
  bool skip;
  double grad_norm;
  double multiplier;  // checked unless skip
  bool clipped;
  bool roll_back;
  StepUpdate update;
};

StepInputs inputs(double sum_squares, std::uint64_t nonfinite, double scale, int world, int k,
                  double max_norm, Overlap overlap) {
  StepInputs in;
  in.sum_squares = sum_squares;
  in.nonfinite_count = nonfinite;
  in.loss_scale = scale;
  in.world_size = world;
  in.accumulation_steps = k;
  in.max_norm = max_norm;
  in.overlap = overlap;
  return in;
}

std::vector<Row> rows() {
  // 9216 = 32^2 * 9: with divisor 8 * 2 * 2 = 32 the norm is 3.
  return {
      {"exact_plain", inputs(16, 0, 1, 1, 1, 0, Overlap::kExact), false, 4, 1, false, false,
       StepUpdate::kAllUnitsNow},
      {"exact_scaled_averaged", inputs(9216, 0, 8, 2, 2, 0, Overlap::kExact), false, 3, 0.03125,
       false, false, StepUpdate::kAllUnitsNow},
      {"exact_clipped", inputs(9216, 0, 8, 2, 2, 1, Overlap::kExact), false, 3,
       0.03125 / 3.000001, true, false, StepUpdate::kAllUnitsNow},
      {"exact_under_the_clip", inputs(9216, 0, 8, 2, 2, 5, Overlap::kExact), false, 3, 0.03125,
       false, false, StepUpdate::kAllUnitsNow},
      {"exact_overflow", inputs(0, 3, 1024, 1, 1, 1, Overlap::kExact), true, kInf, 0, false, false,
       StepUpdate::kNone},
      {"eager_kept", inputs(9216, 0, 8, 2, 2, 0, Overlap::kEager), false, 3, 0.03125, false, false,
       StepUpdate::kEarlyKept},
      {"eager_kept_under_the_clip", inputs(9216, 0, 8, 2, 2, 5, Overlap::kEager), false, 3,
       0.03125, false, false, StepUpdate::kEarlyKept},
      {"eager_clipped_rolls_back", inputs(9216, 0, 8, 2, 2, 1, Overlap::kEager), false, 3,
       0.03125 / 3.000001, true, true, StepUpdate::kAllUnitsNow},
      {"eager_overflow_rolls_back", inputs(5, 1, 65536, 4, 1, 0, Overlap::kEager), true, kInf, 0,
       false, true, StepUpdate::kNone},
      {"delayed_background", inputs(64, 0, 1, 4, 1, 0, Overlap::kDelayed), false, 2, 0.25, false,
       false, StepUpdate::kBackground},
      {"delayed_clipped", inputs(64, 0, 1, 4, 1, 0.5, Overlap::kDelayed), false, 2,
       0.25 / 4.000002, true, false, StepUpdate::kBackground},
      {"delayed_overflow", inputs(64, 2, 1, 4, 1, 0.5, Overlap::kDelayed), true, kInf, 0, false,
       false, StepUpdate::kNone},
  };
}

TEST(StepDecision, Table) {
  for (const Row& r : rows()) {
    SCOPED_TRACE(r.name + " (" + std::string(overlap_name(r.in.overlap)) + ")");
    const StepDecision d = decide_step(r.in);
    EXPECT_EQ(d.skip, r.skip);
    if (std::isinf(r.grad_norm)) {
      EXPECT_TRUE(std::isinf(d.grad_norm));
    } else {
      EXPECT_DOUBLE_EQ(d.grad_norm, r.grad_norm);
    }
    if (!r.skip) {
      EXPECT_NEAR(d.multiplier, r.multiplier, 1e-15 * r.multiplier);
    }
    EXPECT_EQ(d.clipped, r.clipped);
    EXPECT_EQ(d.roll_back, r.roll_back);
    EXPECT_EQ(d.update, r.update);
    EXPECT_EQ(d.counts_update(), r.update != StepUpdate::kNone);
  }
}

TEST(StepDecision, BrokenInputsAreProgrammerErrors) {
  EXPECT_DEATH(decide_step(inputs(1, 0, 0, 1, 1, 0, Overlap::kExact)), "loss scale");
  EXPECT_DEATH(decide_step(inputs(1, 0, 1, 0, 1, 0, Overlap::kExact)), "world size");
  EXPECT_DEATH(decide_step(inputs(1, 0, 1, 1, 1, -1, Overlap::kExact)), "gradient_clipping");
}

}  // namespace
}  // namespace tz::zero
