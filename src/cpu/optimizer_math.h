// Per-element optimizer math shared by the CPU paths (the scalar reference and every SIMD
// target) and the future CUDA kernel, so all of them compute exactly the same function. It holds
// the per-step coefficient structs (computed once per step on the host) and one TZ_HOST_DEVICE
// update function per optimizer. No CUDA includes: nvcc compiles it as C++17.
//
// Bit-exactness contract: every operation is a single IEEE-754 binary32 operation rounded to
// nearest even (multiply, add, subtract, divide, square root), evaluated in the order written.
// Nothing may be fused into an FMA: the CPU module is compiled with -ffp-contract=off, the SIMD
// kernels use separate Mul/Add, and under nvcc the helpers below use the explicitly rounded
// intrinsics (__fmul_rn etc.), which the compiler never contracts. With that, the scalar path,
// every SIMD width and the GPU produce identical bits for identical inputs.
#pragma once

#include <cstdint>

#include "core/host_device.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace tz::optim {

// The optimizers the CPU (and later the GPU) update implements. AdamW is kAdam with
// AdamCoeffs::param_scale != 1 (decoupled weight decay); Adam with L2 decay uses l2_decay.
enum class OptimizerKind : std::uint8_t { kAdam, kSgd, kLion, kAdagrad };

// Single-rounding float operations that no compiler may fuse (see the file comment).
TZ_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TZ_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TZ_HOST_DEVICE inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TZ_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TZ_HOST_DEVICE inline float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// Adam / AdamW for step t (1-based), after Kingma & Ba with PyTorch's operation order:
//   g  = grad * grad_scale                      (unscale x clip coefficient, folded in)
//   g += l2_decay * p                           (Adam's L2 decay; skipped when 0)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   d  = sqrt(v) / sqrt(1 - beta2^t) + eps      (sqrt_bias_correction2 = 1 without correction)
//   p *= param_scale                            (AdamW: 1 - lr * weight_decay; skipped when 1)
//   p -= step_size * (m / d)                    (step_size = lr / (1 - beta1^t), or lr)
struct AdamCoeffs {
  float grad_scale = 1.0f;
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float step_size = 1e-3f;
  float sqrt_bias_correction2 = 1.0f;
  float l2_decay = 0.0f;
  float param_scale = 1.0f;
};

TZ_HOST_DEVICE inline void adam_update(const AdamCoeffs& c, float grad, float& p, float& m,
                                       float& v) {
  float g = mul_rn(grad, c.grad_scale);
  if (c.l2_decay != 0.0f) g = add_rn(g, mul_rn(c.l2_decay, p));
  m = add_rn(mul_rn(c.beta1, m), mul_rn(c.one_minus_beta1, g));
  v = add_rn(mul_rn(c.beta2, v), mul_rn(c.one_minus_beta2, mul_rn(g, g)));
  const float denom = add_rn(div_rn(sqrt_rn(v), c.sqrt_bias_correction2), c.eps);
  if (c.param_scale != 1.0f) p = mul_rn(p, c.param_scale);
  p = sub_rn(p, mul_rn(c.step_size, div_rn(m, denom)));
}

// SGD with momentum (PyTorch's definition, Sutskever et al. for Nesterov):
//   g  = grad * grad_scale;  g += weight_decay * p (skipped when 0)
//   b  = first_step ? g : momentum * b + dampening_complement * g   (only when momentum != 0)
//   g  = nesterov ? g + momentum * b : b                            (only when momentum != 0)
//   p -= lr * g
struct SgdCoeffs {
  float grad_scale = 1.0f;
  float lr = 1e-2f;
  float momentum = 0.0f;
  float dampening_complement = 1.0f;  // 1 - dampening
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = true;  // the momentum buffer starts as the first gradient
};

TZ_HOST_DEVICE inline void sgd_update(const SgdCoeffs& c, float grad, float& p, float& buf) {
  float g = mul_rn(grad, c.grad_scale);
  if (c.weight_decay != 0.0f) g = add_rn(g, mul_rn(c.weight_decay, p));
  if (c.momentum != 0.0f) {
    buf = c.first_step ? g : add_rn(mul_rn(c.momentum, buf), mul_rn(c.dampening_complement, g));
    g = c.nesterov ? add_rn(g, mul_rn(c.momentum, buf)) : buf;
  }
  p = sub_rn(p, mul_rn(c.lr, g));
}

// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"):
//   g  = grad * grad_scale
//   u  = sign(beta1 * m + (1 - beta1) * g)          (sign(0) = 0, sign(NaN) = 0)
//   p *= param_scale                                (1 - lr * weight_decay; skipped when 1)
//   p -= lr * u
//   m  = beta2 * m + (1 - beta2) * g
struct LionCoeffs {
  float grad_scale = 1.0f;
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.99f;
  float one_minus_beta2 = 0.01f;
  float param_scale = 1.0f;
};

TZ_HOST_DEVICE inline float sign_of(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
}

TZ_HOST_DEVICE inline void lion_update(const LionCoeffs& c, float grad, float& p, float& m) {
  const float g = mul_rn(grad, c.grad_scale);
  const float u = sign_of(add_rn(mul_rn(c.beta1, m), mul_rn(c.one_minus_beta1, g)));
  if (c.param_scale != 1.0f) p = mul_rn(p, c.param_scale);
  p = sub_rn(p, mul_rn(c.lr, u));
  m = add_rn(mul_rn(c.beta2, m), mul_rn(c.one_minus_beta2, g));
}

// Adagrad (Duchi et al. 2011, PyTorch's definition):
//   g  = grad * grad_scale;  g += weight_decay * p (skipped when 0)
//   s += g * g
//   p -= clr * (g / (sqrt(s) + eps))                (clr = lr / (1 + (t - 1) * lr_decay))
struct AdagradCoeffs {
  float grad_scale = 1.0f;
  float clr = 1e-2f;
  float eps = 1e-10f;
  float weight_decay = 0.0f;
};

TZ_HOST_DEVICE inline void adagrad_update(const AdagradCoeffs& c, float grad, float& p,
                                          float& sum) {
  float g = mul_rn(grad, c.grad_scale);
  if (c.weight_decay != 0.0f) g = add_rn(g, mul_rn(c.weight_decay, p));
  sum = add_rn(sum, mul_rn(g, g));
  p = sub_rn(p, mul_rn(c.clr, div_rn(g, add_rn(sqrt_rn(sum), c.eps))));
}

}  // namespace tz::optim
