// Internal to ops/: launchers of the CUDA backend's kernels (cuda_kernels.cu), plain C++ so that
// cuda_ops.cc (g++) calls them without CUDA headers, as gpu/cuda_kernels.h does. Each enqueues its
// kernels on `stream` (a cudaStream_t) for one storage dtype `dt` shared by every act and param
// tensor of the op, and returns the cudaError_t of cudaGetLastError after the launches (0 = ok).
// Shapes were checked by the caller (ops/ops.h's contract; head_dim <= kMaxHeadDim).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace tz::ops::cuda_kernels {

inline constexpr int kMaxHeadDim = 128;

// wte holds the table's rows [first_row, first_row + table_rows); other tokens are skipped.
int embedding_forward(void* out, const std::int32_t* tokens, const void* wte, const void* wpe,
                      std::int64_t batch, std::int64_t seq, std::int64_t embd,
                      std::int64_t first_row, std::int64_t table_rows, DType dt, void* stream);
int embedding_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens,
                       std::int64_t batch, std::int64_t seq, std::int64_t embd,
                       std::int64_t first_row, std::int64_t table_rows, DType dt, void* stream);
int copy_block(void* dst, std::int64_t dst_stride, const void* src, std::int64_t src_stride,
               std::int64_t rows, std::int64_t cols, DType dt, void* stream);
int layernorm_forward(void* out, float* mean, float* rstd, const void* x, const void* weight,
                      const void* bias, std::int64_t rows, std::int64_t dim, DType dt,
                      void* stream);
int layernorm_backward(void* dx, bool add, void* dweight, void* dbias, const void* dout,
                       const void* x, const void* weight, const float* mean, const float* rstd,
                       std::int64_t rows, std::int64_t dim, DType dt, void* stream);
// out[r, :] = bias (the matmul then adds x W with beta = 1).
int broadcast_rows(void* out, const void* bias, std::int64_t rows, std::int64_t cols, DType dt,
                   void* stream);
// dbias[c] += sum over rows of dout[r, c] (one thread per column: a fixed order).
int column_sums(void* dbias, const void* dout, std::int64_t rows, std::int64_t cols, DType dt,
                void* stream);
int gelu_forward(void* out, const void* x, std::int64_t n, DType dt, void* stream);
int gelu_backward(void* dx, bool add, const void* dout, const void* x, std::int64_t n, DType dt,
                  void* stream);
int residual_forward(void* out, const void* a, const void* b, std::int64_t n, DType dt,
                     void* stream);
// dst = src (add: dst += src).
int accumulate(void* dst, bool add, const void* src, std::int64_t n, DType dt, void* stream);
// out = alpha * x * keep (keep null: all kept; add: out += that).
int scale(void* out, bool add, const void* x, const std::uint8_t* keep, float alpha,
          std::int64_t n, DType dt, void* stream);
// dlogits null: losses only.
int cross_entropy(void* dlogits, float* losses, const void* logits, const std::int32_t* targets,
                  std::int64_t rows, std::int64_t vocab, float grad_scale, DType dt,
                  void* stream);

// The Llama family's ops (ops.h), shapes as there.
int rmsnorm_forward(void* out, float* rstd, const void* x, const void* weight, float eps,
                    std::int64_t rows, std::int64_t dim, DType dt, void* stream);
int rmsnorm_backward(void* dx, bool add, void* dweight, const void* dout, const void* x,
                     const void* weight, const float* rstd, std::int64_t rows, std::int64_t dim,
                     DType dt, void* stream);
int rope(void* x, const float* inv_freq, std::int64_t batch, std::int64_t seq, std::int64_t heads,
         std::int64_t head_dim, std::int64_t row_stride, std::int64_t pos_offset, bool inverse,
         DType dt, void* stream);
int swiglu_forward(void* out, const void* gate, const void* up, std::int64_t rows,
                   std::int64_t dim, std::int64_t in_stride, DType dt, void* stream);
int swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                    std::int64_t rows, std::int64_t dim, std::int64_t in_stride, DType dt,
                    void* stream);
// Grouped-query attention's sizes: q rows q_stride apart, k and v rows kv_stride apart.
struct GqaArgs {
  std::int64_t batch, q_len, kv_len, q_heads, kv_heads, head_dim, q_stride, kv_stride;
  float scale;
};
int gqa_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                          const GqaArgs& a, DType dt, void* stream);
int gqa_attention_backward(void* dq, void* dk, void* dv, bool add, float* delta,
                           const void* dout, const void* q, const void* k, const void* v,
                           const void* out, const float* lse, const GqaArgs& a, DType dt,
                           void* stream);

}  // namespace tz::ops::cuda_kernels
