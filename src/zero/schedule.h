// Learning-rate schedules of the DeepSpeed `scheduler` section with DeepSpeed's formulas
// (deepspeed/runtime/lr_schedules.py): WarmupLR, WarmupDecayLR, WarmupCosineLR and OneCycle's
// learning-rate part. A pure function of the schedule position, so tests check it at any step.
#pragma once

#include <cstdint>

#include "core/config.h"

namespace tz::zero {

// The learning rate at DeepSpeed's `last_batch_iteration` = `iteration` (-1 before the first
// scheduler step). DeepSpeed steps the scheduler after every applied optimizer step (not after
// one skipped for overflow), so applied update t (1-based) uses iteration start + t - 1, where
// start is scheduler.params.last_batch_iteration (-1 by default: the first update uses -1).
// `base_lr` is optimizer.params.lr (WarmupCosineLR scales it; the other types ignore it). No
// type: base_lr.
double scheduled_lr(const SchedulerConfig& schedule, double base_lr, std::int64_t iteration);

}  // namespace tz::zero
