// The fp32 vector primitives of the CPU backend (internal/cpu_kernels.h), compiled once per x86
// target (EMU128, SSE4, AVX2, AVX3) by re-including this file through foreach_target.h; the
// HWY_ONCE part dispatches to the best one the CPU supports. Loops run whole vectors with FMA and
// leave the tail to the scalar formulas of ops_math.h, so results may differ from a scalar loop by
// rounding only (the tests compare both against float64 references).
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_AVX3_DL)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <cmath>
#include <algorithm>
#include <cstddef>

#include "ops/internal/cpu_kernels.h"
#include "ops/ops_math.h"

HWY_BEFORE_NAMESPACE();
namespace tz::ops::cpu_kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

HWY_INLINE float reduce_sum(D d, V v) { return hn::GetLane(hn::SumOfLanes(d, v)); }

float DotImpl(const float* a, const float* b, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  V s0 = hn::Zero(d);
  V s1 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + lanes), hn::LoadU(d, b + i + lanes), s1);
  }
  for (; i + lanes <= n; i += lanes) s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
  float r = reduce_sum(d, hn::Add(s0, s1));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

float SumImpl(const float* a, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  V s = hn::Zero(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) s = hn::Add(s, hn::LoadU(d, a + i));
  float r = reduce_sum(d, s);
  for (; i < n; ++i) r += a[i];
  return r;
}

float MaxImpl(const float* a, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  float r = a[0];
  std::size_t i = 0;
  if (n >= lanes) {
    V m = hn::LoadU(d, a);
    for (i = lanes; i + lanes <= n; i += lanes) m = hn::Max(m, hn::LoadU(d, a + i));
    r = hn::GetLane(hn::MaxOfLanes(d, m));
  }
  for (; i < n; ++i) r = a[i] > r ? a[i] : r;
  return r;
}

void AxpyImpl(float alpha, const float* x, float* y, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  const V va = hn::Set(d, alpha);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}

// Rows [i, i + kRows) of C = [C +] A B over the columns [0, nb) the register blocks cover: blocks
// of kRows rows x 2 vectors of C stay in registers while p runs (2 kRows FMAs per 2 loads of B and
// kRows broadcasts of A, instead of a load and a store of C per FMA). The loops over the block are
// unrolled by pragma: without it GCC 12 kept acc[][] on the stack, a load and a store per FMA,
// which ran the attention's block products at a quarter of their speed.
template <std::size_t kRows>
HWY_INLINE void MatmulRowBlock(const float* a, std::size_t lda, const float* b, std::size_t ldb,
                               float* c, std::size_t ldc, std::size_t i, std::size_t k,
                               std::size_t nb, float beta) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  for (std::size_t j = 0; j < nb; j += 2 * lanes) {
    V acc[kRows][2];
    #pragma GCC unroll 16
    for (std::size_t r = 0; r < kRows; ++r) {
      #pragma GCC unroll 16
      for (std::size_t h = 0; h < 2; ++h) {
        acc[r][h] = beta == 0.0f ? hn::Zero(d) : hn::LoadU(d, c + (i + r) * ldc + j + h * lanes);
      }
    }
    for (std::size_t p = 0; p < k; ++p) {
      const V b0 = hn::LoadU(d, b + p * ldb + j);
      const V b1 = hn::LoadU(d, b + p * ldb + j + lanes);
      #pragma GCC unroll 16
      for (std::size_t r = 0; r < kRows; ++r) {
        const V ar = hn::Set(d, a[(i + r) * lda + p]);
        acc[r][0] = hn::MulAdd(ar, b0, acc[r][0]);
        acc[r][1] = hn::MulAdd(ar, b1, acc[r][1]);
      }
    }
    #pragma GCC unroll 16
    for (std::size_t r = 0; r < kRows; ++r) {
      #pragma GCC unroll 16
      for (std::size_t h = 0; h < 2; ++h) {
        hn::StoreU(acc[r][h], d, c + (i + r) * ldc + j + h * lanes);
      }
    }
  }
}

// C (m x n, row stride ldc) = [C +] A (m x k) B (k x n): every element is summed over p in order
// with one fused multiply-add per term. Blocks of 6 rows (12 accumulators: 16 vector registers on
// AVX2 hold them with both B vectors and the broadcast), then of 4, go through MatmulRowBlock; the
// rows and columns past the blocks go row by row through AxpyImpl, whose vector/scalar split they
// share with a row-at-a-time product, so every path gives the same bits.
void MatmulAccImpl(const float* a, std::size_t lda, const float* b, std::size_t ldb, float* c,
                   std::size_t ldc, std::size_t m, std::size_t k, std::size_t n, float beta) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  const std::size_t nb = n / (2 * lanes) * (2 * lanes);  // columns the register blocks cover
  auto tail_columns = [&](std::size_t row) {
    float* ci = c + row * ldc + nb;
    if (beta == 0.0f) std::fill(ci, ci + (n - nb), 0.0f);
    for (std::size_t p = 0; p < k; ++p) AxpyImpl(a[row * lda + p], b + p * ldb + nb, ci, n - nb);
  };
  std::size_t i = 0;
  for (; i + 6 <= m; i += 6) {
    MatmulRowBlock<6>(a, lda, b, ldb, c, ldc, i, k, nb, beta);
    if (nb != n) {
      for (std::size_t r = 0; r < 6; ++r) tail_columns(i + r);
    }
  }
  for (; i + 4 <= m; i += 4) {
    MatmulRowBlock<4>(a, lda, b, ldb, c, ldc, i, k, nb, beta);
    if (nb != n) {
      for (std::size_t r = 0; r < 4; ++r) tail_columns(i + r);
    }
  }
  for (; i < m; ++i) {
    float* ci = c + i * ldc;
    if (beta == 0.0f) std::fill(ci, ci + n, 0.0f);
    for (std::size_t p = 0; p < k; ++p) AxpyImpl(a[i * lda + p], b + p * ldb, ci, n);
  }
}

void ScaleImpl(float alpha, float* x, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  const V va = hn::Set(d, alpha);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Mul(va, hn::LoadU(d, x + i)), d, x + i);
  for (; i < n; ++i) x[i] *= alpha;
}

void AddImpl(const float* a, const float* b, float* out, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i);
  }
  for (; i < n; ++i) out[i] = a[i] + b[i];
}

float ExpShiftedImpl(const float* x, float alpha, float shift, float* out, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  const V va = hn::Set(d, alpha);
  const V vs = hn::Set(d, shift);
  V s = hn::Zero(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const V e = hn::Exp(d, hn::MulSub(hn::LoadU(d, x + i), va, vs));
    hn::StoreU(e, d, out + i);
    s = hn::Add(s, e);
  }
  float r = reduce_sum(d, s);
  for (; i < n; ++i) {
    out[i] = expf(x[i] * alpha - shift);
    r += out[i];
  }
  return r;
}

// gelu_new lane-wise, the expression of math::gelu_forward.
HWY_INLINE V gelu_vec(D d, V x) {
  const V u = hn::Mul(hn::Set(d, math::kGeluSqrt2OverPi),
                      hn::MulAdd(hn::Mul(hn::Set(d, math::kGeluCubic), hn::Mul(x, x)), x, x));
  const V half_x = hn::Mul(hn::Set(d, 0.5f), x);
  return hn::MulAdd(half_x, hn::Tanh(d, u), half_x);
}

// math::gelu_derivative lane-wise.
HWY_INLINE V gelu_derivative_vec(D d, V x) {
  const V x2 = hn::Mul(x, x);
  const V u = hn::Mul(hn::Set(d, math::kGeluSqrt2OverPi),
                      hn::MulAdd(hn::Mul(hn::Set(d, math::kGeluCubic), x2), x, x));
  const V th = hn::Tanh(d, u);
  const V du = hn::Mul(hn::Set(d, math::kGeluSqrt2OverPi),
                       hn::MulAdd(hn::Set(d, 3.0f * math::kGeluCubic), x2, hn::Set(d, 1.0f)));
  const V half = hn::Set(d, 0.5f);
  const V left = hn::Mul(half, hn::Add(hn::Set(d, 1.0f), th));
  const V sech2 = hn::NegMulAdd(th, th, hn::Set(d, 1.0f));
  return hn::MulAdd(hn::Mul(hn::Mul(half, x), sech2), du, left);
}

void GeluForwardImpl(const float* x, float* out, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(gelu_vec(d, hn::LoadU(d, x + i)), d, out + i);
  for (; i < n; ++i) out[i] = math::gelu_forward(x[i]);
}

void GeluBackwardImpl(const float* x, const float* dout, float* dx, std::size_t n,
                      bool accumulate) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    V g = hn::Mul(hn::LoadU(d, dout + i), gelu_derivative_vec(d, hn::LoadU(d, x + i)));
    if (accumulate) g = hn::Add(g, hn::LoadU(d, dx + i));
    hn::StoreU(g, d, dx + i);
  }
  for (; i < n; ++i) {
    const float g = dout[i] * math::gelu_derivative(x[i]);
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

void LayerNormRowImpl(const float* x, const float* w, const float* b, float* out, std::size_t n,
                      float* mean_out, float* rstd_out) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  const int dim = static_cast<int>(n);
  const float mean = math::layernorm_mean(SumImpl(x, n), dim);
  const V vm = hn::Set(d, mean);
  V acc = hn::Zero(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const V dev = hn::Sub(hn::LoadU(d, x + i), vm);
    acc = hn::MulAdd(dev, dev, acc);
  }
  float sq = reduce_sum(d, acc);
  for (; i < n; ++i) sq += (x[i] - mean) * (x[i] - mean);
  const float rstd = math::layernorm_rstd(sq, dim);
  const V vr = hn::Set(d, rstd);
  for (i = 0; i + lanes <= n; i += lanes) {
    const V xhat = hn::Mul(hn::Sub(hn::LoadU(d, x + i), vm), vr);
    hn::StoreU(hn::MulAdd(xhat, hn::LoadU(d, w + i), hn::LoadU(d, b + i)), d, out + i);
  }
  for (; i < n; ++i) out[i] = (x[i] - mean) * rstd * w[i] + b[i];
  *mean_out = mean;
  *rstd_out = rstd;
}

void LayerNormRowBackwardImpl(const float* x, const float* w, const float* dout, float mean,
                              float rstd, float* dx, bool accumulate, float* dw, float* db,
                              std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  const V vm = hn::Set(d, mean);
  const V vr = hn::Set(d, rstd);
  V s1 = hn::Zero(d);
  V s2 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const V xhat = hn::Mul(hn::Sub(hn::LoadU(d, x + i), vm), vr);
    const V g = hn::LoadU(d, dout + i);
    const V dxhat = hn::Mul(g, hn::LoadU(d, w + i));
    s1 = hn::Add(s1, dxhat);
    s2 = hn::MulAdd(dxhat, xhat, s2);
    if (dw != nullptr) hn::StoreU(hn::MulAdd(g, xhat, hn::LoadU(d, dw + i)), d, dw + i);
    if (db != nullptr) hn::StoreU(hn::Add(g, hn::LoadU(d, db + i)), d, db + i);
  }
  float sum_dxhat = reduce_sum(d, s1);
  float sum_dxhat_xhat = reduce_sum(d, s2);
  for (; i < n; ++i) {
    const float xhat = (x[i] - mean) * rstd;
    const float dxhat = dout[i] * w[i];
    sum_dxhat += dxhat;
    sum_dxhat_xhat += dxhat * xhat;
    if (dw != nullptr) dw[i] += dout[i] * xhat;
    if (db != nullptr) db[i] += dout[i];
  }
  const float m1 = sum_dxhat / static_cast<float>(n);
  const float m2 = sum_dxhat_xhat / static_cast<float>(n);
  const V vm1 = hn::Set(d, m1);
  const V vm2 = hn::Set(d, m2);
  for (i = 0; i + lanes <= n; i += lanes) {
    const V xhat = hn::Mul(hn::Sub(hn::LoadU(d, x + i), vm), vr);
    const V dxhat = hn::Mul(hn::LoadU(d, dout + i), hn::LoadU(d, w + i));
    V g = hn::Mul(hn::NegMulAdd(xhat, vm2, hn::Sub(dxhat, vm1)), vr);
    if (accumulate) g = hn::Add(g, hn::LoadU(d, dx + i));
    hn::StoreU(g, d, dx + i);
  }
  for (; i < n; ++i) {
    const float xhat = (x[i] - mean) * rstd;
    const float g = math::layernorm_dx(dout[i] * w[i], xhat, m1, m2, rstd);
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

float RmsNormRowImpl(const float* x, const float* w, float* out, std::size_t n, float eps) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  const float rstd = math::rmsnorm_rstd(DotImpl(x, x, n), static_cast<int>(n), eps);
  const V vr = hn::Set(d, rstd);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + i), vr), hn::LoadU(d, w + i)), d, out + i);
  }
  for (; i < n; ++i) out[i] = x[i] * rstd * w[i];
  return rstd;
}

void RmsNormRowBackwardImpl(const float* x, const float* w, const float* dout, float rstd,
                            float* dx, bool accumulate, float* dw, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  const V vr = hn::Set(d, rstd);
  V s = hn::Zero(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const V xv = hn::LoadU(d, x + i);
    const V g = hn::LoadU(d, dout + i);
    s = hn::MulAdd(hn::Mul(g, hn::LoadU(d, w + i)), xv, s);
    if (dw != nullptr) hn::StoreU(hn::MulAdd(g, hn::Mul(xv, vr), hn::LoadU(d, dw + i)), d, dw + i);
  }
  float sum_dxhat_x = reduce_sum(d, s);
  for (; i < n; ++i) {
    sum_dxhat_x += dout[i] * w[i] * x[i];
    if (dw != nullptr) dw[i] += dout[i] * (x[i] * rstd);
  }
  const float m = sum_dxhat_x / static_cast<float>(n);
  const V vk = hn::Set(d, rstd * rstd * m);
  for (i = 0; i + lanes <= n; i += lanes) {
    const V dxhat = hn::Mul(hn::LoadU(d, dout + i), hn::LoadU(d, w + i));
    V g = hn::Mul(vr, hn::NegMulAdd(hn::LoadU(d, x + i), vk, dxhat));
    if (accumulate) g = hn::Add(g, hn::LoadU(d, dx + i));
    hn::StoreU(g, d, dx + i);
  }
  for (; i < n; ++i) {
    const float g = math::rmsnorm_dx(dout[i] * w[i], x[i], rstd, m);
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

// math::sigmoid lane-wise: exp(-|x|) never overflows.
HWY_INLINE V sigmoid_vec(D d, V x) {
  const V e = hn::Exp(d, hn::Neg(hn::Abs(x)));
  const V r = hn::Div(hn::Set(d, 1.0f), hn::Add(hn::Set(d, 1.0f), e));
  return hn::IfThenElse(hn::Ge(x, hn::Zero(d)), r, hn::Mul(e, r));
}

void SwigluForwardImpl(const float* gate, const float* up, float* out, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const V g = hn::LoadU(d, gate + i);
    hn::StoreU(hn::Mul(hn::Mul(g, sigmoid_vec(d, g)), hn::LoadU(d, up + i)), d, out + i);
  }
  for (; i < n; ++i) out[i] = math::swiglu_forward(gate[i], up[i]);
}

void SwigluBackwardImpl(const float* gate, const float* up, const float* dout, float* dgate,
                        float* dup, std::size_t n) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  const V one = hn::Set(d, 1.0f);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const V g = hn::LoadU(d, gate + i);
    const V u = hn::LoadU(d, up + i);
    const V go = hn::LoadU(d, dout + i);
    const V sig = sigmoid_vec(d, g);
    // dgate = dout * up * sig * (1 + g * (1 - sig)); dup = dout * g * sig.
    const V inner = hn::MulAdd(g, hn::Sub(one, sig), one);
    hn::StoreU(hn::Mul(hn::Mul(hn::Mul(go, u), sig), inner), d, dgate + i);
    hn::StoreU(hn::Mul(hn::Mul(go, g), sig), d, dup + i);
  }
  for (; i < n; ++i) math::swiglu_backward(gate[i], up[i], dout[i], dgate + i, dup + i);
}

void RopeRotateImpl(float* x, const float* cos_a, const float* sin_a, std::size_t half,
                    bool inverse) {
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  float* x1 = x + half;
  std::size_t i = 0;
  for (; i + lanes <= half; i += lanes) {
    const V a = hn::LoadU(d, x + i);
    const V b = hn::LoadU(d, x1 + i);
    const V c = hn::LoadU(d, cos_a + i);
    V s = hn::LoadU(d, sin_a + i);
    if (inverse) s = hn::Neg(s);
    hn::StoreU(hn::NegMulAdd(b, s, hn::Mul(a, c)), d, x + i);  // a c - b s
    hn::StoreU(hn::MulAdd(a, s, hn::Mul(b, c)), d, x1 + i);    // b c + a s
  }
  for (; i < half; ++i) {
    math::rope_rotate(x[i], x1[i], cos_a[i], inverse ? -sin_a[i] : sin_a[i], x + i, x1 + i);
  }
}

float CrossEntropyRowImpl(const float* logits, float* grad, std::size_t n, std::size_t target,
                          float grad_scale) {
  const float m = MaxImpl(logits, n);
  const float target_logit = logits[target];
  float s;
  if (grad != nullptr) {
    // grad holds exp(x - max) after this pass (it may be the logits themselves).
    s = ExpShiftedImpl(logits, 1.0f, m, grad, n);
    ScaleImpl(grad_scale / s, grad, n);
    grad[target] -= grad_scale;
  } else {
    const D d;
    const std::size_t lanes = hn::Lanes(d);
    const V vm = hn::Set(d, m);
    V acc = hn::Zero(d);
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes) acc = hn::Add(acc, hn::Exp(d, hn::Sub(hn::LoadU(d, logits + i), vm)));
    s = reduce_sum(d, acc);
    for (; i < n; ++i) s += expf(logits[i] - m);
  }
  math::OnlineSoftmax norm;
  norm.merge(m, s);
  return math::cross_entropy_loss(norm.log_sum_exp(), target_logit);
}

}  // namespace HWY_NAMESPACE
}  // namespace tz::ops::cpu_kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tz::ops::cpu_kernels {

HWY_EXPORT(DotImpl);
HWY_EXPORT(SumImpl);
HWY_EXPORT(MaxImpl);
HWY_EXPORT(AxpyImpl);
HWY_EXPORT(ScaleImpl);
HWY_EXPORT(MatmulAccImpl);
HWY_EXPORT(AddImpl);
HWY_EXPORT(ExpShiftedImpl);
HWY_EXPORT(GeluForwardImpl);
HWY_EXPORT(GeluBackwardImpl);
HWY_EXPORT(LayerNormRowImpl);
HWY_EXPORT(LayerNormRowBackwardImpl);
HWY_EXPORT(CrossEntropyRowImpl);
HWY_EXPORT(RmsNormRowImpl);
HWY_EXPORT(RmsNormRowBackwardImpl);
HWY_EXPORT(SwigluForwardImpl);
HWY_EXPORT(SwigluBackwardImpl);
HWY_EXPORT(RopeRotateImpl);

float dot(const float* a, const float* b, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(DotImpl)(a, b, n);
}
float sum(const float* a, std::size_t n) { return HWY_DYNAMIC_DISPATCH(SumImpl)(a, n); }
float max(const float* a, std::size_t n) { return HWY_DYNAMIC_DISPATCH(MaxImpl)(a, n); }
void axpy(float alpha, const float* x, float* y, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyImpl)(alpha, x, y, n);
}
void scale(float alpha, float* x, std::size_t n) { HWY_DYNAMIC_DISPATCH(ScaleImpl)(alpha, x, n); }
void matmul_acc(const float* a, std::size_t lda, const float* b, std::size_t ldb, float* c,
                std::size_t ldc, std::size_t m, std::size_t k, std::size_t n, float beta) {
  HWY_DYNAMIC_DISPATCH(MatmulAccImpl)(a, lda, b, ldb, c, ldc, m, k, n, beta);
}
void add(const float* a, const float* b, float* out, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(AddImpl)(a, b, out, n);
}
float exp_shifted(const float* x, float alpha, float shift, float* out, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(ExpShiftedImpl)(x, alpha, shift, out, n);
}
void gelu_forward(const float* x, float* out, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(GeluForwardImpl)(x, out, n);
}
void gelu_backward(const float* x, const float* dout, float* dx, std::size_t n, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(GeluBackwardImpl)(x, dout, dx, n, accumulate);
}
void layernorm_row(const float* x, const float* w, const float* b, float* out, std::size_t n,
                   float* mean, float* rstd) {
  HWY_DYNAMIC_DISPATCH(LayerNormRowImpl)(x, w, b, out, n, mean, rstd);
}
void layernorm_row_backward(const float* x, const float* w, const float* dout, float mean,
                            float rstd, float* dx, bool accumulate, float* dw, float* db,
                            std::size_t n) {
  HWY_DYNAMIC_DISPATCH(LayerNormRowBackwardImpl)(x, w, dout, mean, rstd, dx, accumulate, dw, db,
                                                 n);
}
float cross_entropy_row(const float* logits, float* grad, std::size_t n, std::size_t target,
                        float grad_scale) {
  return HWY_DYNAMIC_DISPATCH(CrossEntropyRowImpl)(logits, grad, n, target, grad_scale);
}

float rmsnorm_row(const float* x, const float* w, float* out, std::size_t n, float eps) {
  return HWY_DYNAMIC_DISPATCH(RmsNormRowImpl)(x, w, out, n, eps);
}
void rmsnorm_row_backward(const float* x, const float* w, const float* dout, float rstd, float* dx,
                          bool accumulate, float* dw, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(RmsNormRowBackwardImpl)(x, w, dout, rstd, dx, accumulate, dw, n);
}
void swiglu_forward(const float* gate, const float* up, float* out, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluForwardImpl)(gate, up, out, n);
}
void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluBackwardImpl)(gate, up, dout, dgate, dup, n);
}
void rope_rotate(float* x, const float* cos_a, const float* sin_a, std::size_t half,
                 bool inverse) {
  HWY_DYNAMIC_DISPATCH(RopeRotateImpl)(x, cos_a, sin_a, half, inverse);
}

}  // namespace tz::ops::cpu_kernels
#endif  // HWY_ONCE
