// DeepSpeed's learning-rate schedule formulas (schedule.h).
#include "zero/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tz::zero {

namespace {

// The warm-up fraction in [0, 1) of WarmupLR, WarmupDecayLR and WarmupCosineLR at `it` < W.
double warmup_fraction(const SchedulerConfig& s, std::int64_t it, std::int64_t w) {
  if (s.warmup_type == "linear") return static_cast<double>(it) / static_cast<double>(w);
  return std::log(static_cast<double>(it + 1)) / std::log(static_cast<double>(w));
}

}  // namespace

double scheduled_lr(const SchedulerConfig& s, double base_lr, std::int64_t it) {
  const std::int64_t w = std::max<std::int64_t>(2, s.warmup_num_steps);  // DeepSpeed: max(2, .)
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR") {
    // get_lr(): min_lr before the first step, then min_lr + (max_lr - min_lr) * gamma.
    if (it < 0) return s.warmup_min_lr;
    double gamma = 1.0;
    if (it < w) {
      gamma = warmup_fraction(s, it, w);
    } else if (s.type == "WarmupDecayLR") {
      const double total = static_cast<double>(s.total_num_steps);
      gamma = std::max(0.0, (total - static_cast<double>(it)) /
                                std::max(1.0, total - static_cast<double>(w)));
    }
    return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
  }
  if (s.type == "WarmupCosineLR") {
    if (it < 0) return 0.0;  // DeepSpeed's get_lr() before the first step
    double ratio;
    if (it < w) {
      ratio = s.warmup_min_ratio + warmup_fraction(s, it, w) * (1.0 - s.warmup_min_ratio);
    } else {
      const double real_last = static_cast<double>(it - w + 1);
      const double real_total = static_cast<double>(s.total_num_steps - w);
      // DeepSpeed divides by zero when total_num_steps == warmup_num_steps; the limit of the
      // cosine past its end is the minimum ratio.
      const double c = real_total > 0 ? (1.0 + std::cos(std::numbers::pi * real_last / real_total)) / 2
                                       : 0.0;
      ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * c);
    }
    return base_lr * ratio;
  }
  if (s.type == "OneCycle") {
    const double first = s.cycle_first_step_size;
    const double second = s.cycle_second_step_size < 0 ? first : s.cycle_second_step_size;
    const double total = first + second;
    const double step_ratio = first / total;
    if (static_cast<double>(it) < total) {
      const double bi = static_cast<double>(it + 1);
      const double cycle = std::floor(1.0 + bi / total);
      const double x = 1.0 + bi / total - cycle;
      const double scale = x <= step_ratio ? x / step_ratio : (x - 1.0) / (step_ratio - 1.0);
      return s.cycle_min_lr + (s.cycle_max_lr - s.cycle_min_lr) * scale;
    }
    // Post-cycle decay; DeepSpeed skips it when decay_step_size or decay_lr_rate is 0.
    if (s.decay_step_size == 0.0 || s.decay_lr_rate == 0.0) return s.cycle_min_lr;
    const double interval = (static_cast<double>(it) - total + 1.0) / s.decay_step_size;
    return s.cycle_min_lr / (1.0 + s.decay_lr_rate * interval);
  }
  return base_lr;
}

}  // namespace tz::zero
