// DeepSpeed's dynamic and static loss scaling (loss_scaler.h).
#include "zero/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace tz::zero {

LossScaler::LossScaler(const Fp16Config& config) {
  if (!config.enabled) return;
  if (config.loss_scale > 0) {
    scale_ = config.loss_scale;
    return;
  }
  dynamic_ = true;
  scale_ = std::ldexp(1.0, static_cast<int>(config.initial_scale_power));
  min_scale_ = config.min_loss_scale;
  window_ = std::max<std::int64_t>(1, config.loss_scale_window);
  delayed_shift_ = std::max<std::int64_t>(1, config.hysteresis);
  cur_hysteresis_ = delayed_shift_;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  // DynamicLossScaler.update_scale with consecutive_hysteresis = False and scale_factor = 2.
  if (overflow) {
    if (delayed_shift_ == 1 || cur_hysteresis_ == 1) {
      scale_ = std::max(scale_ / 2.0, min_scale_);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else if ((cur_iter_ - last_overflow_iter_) % window_ == 0) {
    cur_hysteresis_ = delayed_shift_;
    scale_ *= 2.0;
  }
  ++cur_iter_;
}

nlohmann::ordered_json LossScaler::state() const {
  nlohmann::ordered_json j;
  j["scale"] = scale_;
  j["cur_hysteresis"] = cur_hysteresis_;
  j["cur_iter"] = cur_iter_;
  j["last_overflow_iter"] = last_overflow_iter_;
  return j;
}

Status LossScaler::restore(const nlohmann::json& state) {
  if (!state.is_object() || !state.contains("scale") || !state.contains("cur_hysteresis") ||
      !state.contains("cur_iter") || !state.contains("last_overflow_iter")) {
    return Status::invalid_argument(
        "loss scaler state: expected an object with scale, cur_hysteresis, cur_iter and "
        "last_overflow_iter");
  }
  scale_ = state["scale"].get<double>();
  cur_hysteresis_ = state["cur_hysteresis"].get<std::int64_t>();
  cur_iter_ = state["cur_iter"].get<std::int64_t>();
  last_overflow_iter_ = state["last_overflow_iter"].get<std::int64_t>();
  return Status::ok();
}

}  // namespace tz::zero
