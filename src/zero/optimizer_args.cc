// Device optimizer coefficients matching cpu/optimizer.cc's make_kernel (optimizer_args.h).
#include "zero/optimizer_args.h"

#include <cmath>

namespace tz::zero {

namespace {
float to_float(double x) { return static_cast<float>(x); }
}  // namespace

gpu::OptimizerStepArgs device_step_coeffs(const cpu::OptimizerSpec& s, const cpu::StepArgs& a) {
  gpu::OptimizerStepArgs k;
  k.kind = s.kind;
  k.grad_dtype = a.grad_dtype;
  k.copy_dtype = a.copy_dtype;
  const double lr = a.lr_override >= 0.0 ? a.lr_override : s.lr;
  const double t = static_cast<double>(a.step);
  switch (s.kind) {
    case optim::OptimizerKind::kAdam: {
      optim::AdamCoeffs& c = k.adam;
      c.grad_scale = a.grad_multiplier;
      c.beta1 = to_float(s.beta1);
      c.beta2 = to_float(s.beta2);
      c.one_minus_beta1 = to_float(1.0 - static_cast<double>(c.beta1));
      c.one_minus_beta2 = to_float(1.0 - static_cast<double>(c.beta2));
      c.eps = to_float(s.eps);
      if (s.bias_correction) {
        c.step_size = to_float(lr / (1.0 - std::pow(static_cast<double>(c.beta1), t)));
        c.sqrt_bias_correction2 =
            to_float(std::sqrt(1.0 - std::pow(static_cast<double>(c.beta2), t)));
      } else {
        c.step_size = to_float(lr);
        c.sqrt_bias_correction2 = 1.0f;
      }
      if (s.decoupled_weight_decay) {
        c.l2_decay = 0.0f;
        c.param_scale = to_float(1.0 - lr * s.weight_decay);
      } else {
        c.l2_decay = to_float(s.weight_decay);
        c.param_scale = 1.0f;
      }
      break;
    }
    case optim::OptimizerKind::kSgd: {
      optim::SgdCoeffs& c = k.sgd;
      c.grad_scale = a.grad_multiplier;
      c.lr = to_float(lr);
      c.momentum = to_float(s.momentum);
      c.dampening_complement = to_float(1.0 - s.dampening);
      c.weight_decay = to_float(s.weight_decay);
      c.nesterov = s.nesterov;
      c.first_step = a.step == 1;
      break;
    }
    case optim::OptimizerKind::kLion: {
      optim::LionCoeffs& c = k.lion;
      c.grad_scale = a.grad_multiplier;
      c.lr = to_float(lr);
      c.beta1 = to_float(s.beta1);
      c.beta2 = to_float(s.beta2);
      c.one_minus_beta1 = to_float(1.0 - static_cast<double>(c.beta1));
      c.one_minus_beta2 = to_float(1.0 - static_cast<double>(c.beta2));
      c.param_scale = to_float(1.0 - lr * s.weight_decay);
      break;
    }
    case optim::OptimizerKind::kAdagrad: {
      optim::AdagradCoeffs& c = k.adagrad;
      c.grad_scale = a.grad_multiplier;
      c.clr = to_float(lr / (1.0 + (t - 1.0) * s.lr_decay));
      c.eps = to_float(s.eps);
      c.weight_decay = to_float(s.weight_decay);
      break;
    }
  }
  return k;
}

gpu::OptimizerStepArgs device_accumulate_coeffs() {
  gpu::OptimizerStepArgs k;
  k.kind = optim::OptimizerKind::kSgd;
  k.sgd.grad_scale = 1.0f;
  k.sgd.lr = -1.0f;
  k.sgd.momentum = 0.0f;
  k.sgd.weight_decay = 0.0f;
  return k;
}

}  // namespace tz::zero
