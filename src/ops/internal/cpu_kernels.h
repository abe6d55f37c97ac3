// Internal to ops/: the fp32 vector primitives of the CPU backend (cpu_kernels.cc, Highway,
// compiled per x86 target and dispatched at run time like cpu/simd_kernels.cc). Every op of the
// CPU backend is written from these and the conversions of cpu/simd.h; the per-element formulas
// are those of ops/ops_math.h (the tails of every loop call them directly).
#pragma once

#include <cstddef>

namespace tz::ops::cpu_kernels {

// sum of a[i] * b[i].
float dot(const float* a, const float* b, std::size_t n);
// sum of a[i].
float sum(const float* a, std::size_t n);
// max of a[i] (n > 0).
float max(const float* a, std::size_t n);
// y[i] += alpha * x[i].
void axpy(float alpha, const float* x, float* y, std::size_t n);
// C (m x n) = beta * C + A (m x k) B (k x n), row-major with leading dimensions; beta 0 or 1.
// One dispatch for a whole small block (attention's 64 x 64 tiles), broadcast-FMA over B's rows.
void matmul_acc(const float* a, std::size_t lda, const float* b, std::size_t ldb, float* c,
                std::size_t ldc, std::size_t m, std::size_t k, std::size_t n, float beta);
// x[i] *= alpha.
void scale(float alpha, float* x, std::size_t n);
// out[i] = a[i] + b[i] (out may alias a or b).
void add(const float* a, const float* b, float* out, std::size_t n);
// out[i] = exp(x[i] * alpha - shift); returns the sum of out. out may alias x.
float exp_shifted(const float* x, float alpha, float shift, float* out, std::size_t n);
// out[i] = gelu(x[i]) (out may alias x).
void gelu_forward(const float* x, float* out, std::size_t n);
// dx[i] = dout[i] * gelu'(x[i]) (+ dx[i] when accumulate). dx may alias dout.
void gelu_backward(const float* x, const float* dout, float* dx, std::size_t n, bool accumulate);
// LayerNorm of one row: returns mean and rstd, writes out = (x - mean) * rstd * w + b.
void layernorm_row(const float* x, const float* w, const float* b, float* out, std::size_t n,
                   float* mean, float* rstd);
// LayerNorm backward of one row: dx (+= when accumulate), dw += dout * xhat, db += dout.
void layernorm_row_backward(const float* x, const float* w, const float* dout, float mean,
                            float rstd, float* dx, bool accumulate, float* dw, float* db,
                            std::size_t n);
// RMSNorm of one row: returns rstd, writes out = x * rstd * w (out may alias x).
float rmsnorm_row(const float* x, const float* w, float* out, std::size_t n, float eps);
// RMSNorm backward of one row: dx (+= when accumulate), dw += dout * x * rstd (dw may be null).
void rmsnorm_row_backward(const float* x, const float* w, const float* dout, float rstd, float* dx,
                          bool accumulate, float* dw, std::size_t n);
// out[i] = silu(gate[i]) * up[i].
void swiglu_forward(const float* gate, const float* up, float* out, std::size_t n);
// dgate[i], dup[i] from dout[i] (overwrite).
void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, std::size_t n);
// In place on one head x (2 * half): (x[i], x[i + half]) rotated by (cos[i], sin[i]), or by the
// opposite angle when inverse.
void rope_rotate(float* x, const float* cos_a, const float* sin_a, std::size_t half, bool inverse);
// Cross-entropy of one row of logits: returns the loss; when grad is not null writes
// grad = (softmax - onehot(target)) * grad_scale (grad may alias logits).
float cross_entropy_row(const float* logits, float* grad, std::size_t n, std::size_t target,
                        float grad_scale);

}  // namespace tz::ops::cpu_kernels
