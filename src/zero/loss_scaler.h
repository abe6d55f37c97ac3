// Loss scaling for fp16 training with DeepSpeed's semantics (deepspeed/runtime/fp16/
// loss_scaler.py, DynamicLossScaler): the scale starts at 2^initial_scale_power; an overflow
// lowers it by 2 once `hysteresis` overflows have been absorbed (never below min_loss_scale);
// `loss_scale_window` steps after the last overflow it doubles. A static scale never changes.
// Pure state, no device work: the engine feeds it the global overflow flag each step.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/status.h"

namespace tz::zero {

class LossScaler {
 public:
  // Disabled (scale 1) unless fp16.enabled; static when fp16.loss_scale > 0.
  explicit LossScaler(const Fp16Config& config);

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  // One optimizer step's outcome: `overflow` = an Inf/NaN anywhere in the gradient on any rank.
  void update(bool overflow);

  nlohmann::ordered_json state() const;
  Status restore(const nlohmann::json& state);

 private:
  bool dynamic_ = false;
  double scale_ = 1.0;
  double min_scale_ = 1.0;
  std::int64_t window_ = 1000;
  std::int64_t delayed_shift_ = 1;  // the configured hysteresis
  std::int64_t cur_hysteresis_ = 1;
  std::int64_t cur_iter_ = 0;
  std::int64_t last_overflow_iter_ = -1;
};

}  // namespace tz::zero
