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

// RMSNorm (HF LlamaRMSNorm): rstd = 1 / sqrt(mean(x^2) + eps) from a row's sum of squares.
TZ_HOST_DEVICE inline float rmsnorm_rstd(float sum_sq, int dim, float eps) {
  return 1.0f / sqrtf(sum_sq / static_cast<float>(dim) + eps);
}
// The input gradient of one element of out = x * rstd * w, given dxhat = dout * w and the row's
// mean of dxhat * x: dx = rstd * (dxhat - x * rstd^2 * mean(dxhat * x)).
TZ_HOST_DEVICE inline float rmsnorm_dx(float dxhat, float x, float rstd, float mean_dxhat_x) {
  return rstd * (dxhat - x * (rstd * rstd * mean_dxhat_x));
}

// The logistic sigmoid through exp(-|x|) (in (0, 1], never overflows), both signs exact.
TZ_HOST_DEVICE inline float sigmoid(float x) {
  const float e = expf(-fabsf(x));
  const float r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : e * r;
}
// SwiGLU (HF LlamaMLP with hidden_act silu): silu(gate) * up, silu(g) = g * sigmoid(g).
TZ_HOST_DEVICE inline float swiglu_forward(float gate, float up) {
  return gate * sigmoid(gate) * up;
}
// Its gradients: d/dgate = dout * up * sig * (1 + gate * (1 - sig)), d/dup = dout * silu(gate).
TZ_HOST_DEVICE inline void swiglu_backward(float gate, float up, float dout, float* dgate,
                                           float* dup) {
  const float sig = sigmoid(gate);
  *dgate = dout * up * sig * (1.0f + gate * (1.0f - sig));
  *dup = dout * gate * sig;
}

// Rotary embedding: the angle of frequency inv_freq at position pos, in fp32 as HF computes it
// (position times inv_freq rounded to fp32, then cos and sin of that).
TZ_HOST_DEVICE inline float rope_angle(long long pos, float inv_freq) {
  return static_cast<float>(pos) * inv_freq;
}
// Rotates the pair (x[i], x[i + D/2]) by the angle of (cos, sin) (rotate_half convention); the
// backward passes -sin.
TZ_HOST_DEVICE inline void rope_rotate(float x0, float x1, float cos_a, float sin_a, float* y0,
                                       float* y1) {
  *y0 = x0 * cos_a - x1 * sin_a;
  *y1 = x1 * cos_a + x0 * sin_a;
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
