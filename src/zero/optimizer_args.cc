// Device optimizer arguments from cpu::step_coeffs, the coefficients every backend applies.
#include "zero/optimizer_args.h"

namespace tz::zero {

gpu::OptimizerStepArgs device_step_coeffs(const cpu::OptimizerSpec& s, const cpu::StepArgs& a) {
  gpu::OptimizerStepArgs k;
  k.kind = s.kind;
  k.grad_dtype = a.grad_dtype;
  k.copy_dtype = a.copy_dtype;
  const cpu::StepCoeffs c = cpu::step_coeffs(s, a);
  k.adam = c.adam;
  k.sgd = c.sgd;
  k.lion = c.lion;
  k.adagrad = c.adagrad;
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
