// The per-element math of the kernels, as TZ_HOST_DEVICE functions shared by the CPU backend (its
// scalar tails and reference paths) and the CUDA kernels, so both compute the same formulas and
// the CPU tests cover the GPU's math too (as cpu/optimizer_math.h does for the optimizers). The
// CPU backend's Highway loops (cpu_kernels.cc) evaluate the same expressions lane-wise.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace tz::ops::math {

inline constexpr float kLayerNormEps = 1e-5f;  // HF GPT-2's layer_norm_epsilon
inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;

// HF's "gelu_new": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
TZ_HOST_DEVICE inline float gelu_forward(float x) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// d gelu / dx: 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
TZ_HOST_DEVICE inline float gelu_derivative(float x) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float th = tanhf(u);
  const float du = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

// LayerNorm statistics from a row's sum and its sum of squared deviations from the mean
// (two-pass: mean first, then the deviations, which keeps the variance accurate when |mean| is
// large against the spread): the biased variance, as torch.nn.LayerNorm.
TZ_HOST_DEVICE inline float layernorm_mean(float sum, int dim) {
  return sum / static_cast<float>(dim);
}
TZ_HOST_DEVICE inline float layernorm_rstd(float sum_sq_dev, int dim) {
  return 1.0f / sqrtf(sum_sq_dev / static_cast<float>(dim) + kLayerNormEps);
}
// The input gradient of one element given the row's two means of the backward:
// dx = (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) * rstd, with dxhat = dout * weight.
TZ_HOST_DEVICE inline float layernorm_dx(float dxhat, float xhat, float mean_dxhat,
                                         float mean_dxhat_xhat, float rstd) {
  return (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * rstd;
}

// A running softmax normaliser over a stream of scores (the online softmax of blocked
// attention): `max` so far and `sum` of exp(score - max). Merging another block's (max, sum)
// rescales the smaller side, so the result does not depend on how the stream was split.
struct OnlineSoftmax {
  float max = -INFINITY;
  float sum = 0.0f;
  // The factor by which what was accumulated against the old max must be multiplied when the
  // max becomes `new_max` (>= max).
  TZ_HOST_DEVICE float rescale(float new_max) const {
    return max == -INFINITY ? 0.0f : expf(max - new_max);
  }
  TZ_HOST_DEVICE void merge(float block_max, float block_sum) {
    if (block_max == -INFINITY) return;
    const float m = max > block_max ? max : block_max;
    sum = sum * rescale(m) + block_sum * expf(block_max - m);
    max = m;
  }
  TZ_HOST_DEVICE float log_sum_exp() const { return max + logf(sum); }
};

// Cross-entropy of one position from its log-sum-exp and its target's logit.
TZ_HOST_DEVICE inline float cross_entropy_loss(float lse, float target_logit) {
  return lse - target_logit;
}
// d loss / d logit_j scaled: (softmax_j - [j == target]) * grad_scale.
TZ_HOST_DEVICE inline float cross_entropy_grad(float logit, float lse, bool is_target,
                                               float grad_scale) {
  return (expf(logit - lse) - (is_target ? 1.0f : 0.0f)) * grad_scale;
}

}  // namespace tz::ops::math
