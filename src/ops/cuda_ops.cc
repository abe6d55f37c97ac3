// The CUDA backend of ops/ops.h: matmuls through cuBLAS (cublasGemmEx, fp32 accumulation for
// fp32, bf16 and fp16 storage), the other ops as the kernels of cuda_kernels.cu. Every op is
// enqueued on the caller's CudaDevice stream; every cuBLAS call and kernel launch is checked and
// a failure comes back as kDeviceError naming the op. Built only with TZ_CUDA.
#if defined(TZ_HAVE_CUDA)

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/cuda_check.h"
#include "gpu/launch_check.h"
#include "gpu/workspaces.h"
#include "ops/internal/backends.h"
#include "ops/internal/cuda_kernels.h"

namespace tz::ops::internal {
namespace {

namespace ck = cuda_kernels;

Status cublas_status(cublasStatus_t st, std::string_view what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status(ErrorCode::kDeviceError, static_cast<int>(st),
                std::string(what) + " failed: " + cublasGetStatusString(st));
}

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

class CudaOps final : public Ops {
 public:
  CudaOps(gpu::Device& device, cublasHandle_t handle, gpu::DeviceBuffer workspace,
          std::string name)
      : device_(device), handle_(handle), workspace_(std::move(workspace)), name_(std::move(name)) {}
  ~CudaOps() override { cublasDestroy(handle_); }

  gpu::Device& device() override { return device_; }
  std::string_view name() const override { return name_; }

 protected:
  // The ops of ops.h, their arguments already checked by the public methods (ops.cc); cuBLAS
  // multiplies like with like, so act and param dtypes must be equal.
  Limits limits() const override { return Limits{false, ck::kMaxHeadDim, 65535}; }

  Status embedding_forward_impl(Tensor out, const std::int32_t* tokens, ConstTensor wte,
                                ConstTensor wpe, std::int64_t batch, std::int64_t seq,
                                std::int64_t embd, std::int64_t /*vocab*/,
                                std::int64_t first_row, std::int64_t table_rows,
                                gpu::Stream& stream) override {
    constexpr std::string_view op = "embedding_forward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched(op, ck::embedding_forward(out.data, tokens, wte.data, wpe.data, batch, seq,
                                              embd, first_row, table_rows, out.dtype,
                                              raw(stream)));
  }

  Status embedding_backward_impl(Tensor dwte, Tensor dwpe, ConstTensor dout,
                                 const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                                 std::int64_t embd, std::int64_t /*vocab*/,
                                 std::int64_t first_row, std::int64_t table_rows,
                                 gpu::Stream& stream) override {
    constexpr std::string_view op = "embedding_backward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched(op, ck::embedding_backward(dwte.data, dwpe.data, dout.data, tokens, batch, seq,
                                               embd, first_row, table_rows, dout.dtype,
                                               raw(stream)));
  }

  Status copy_block_impl(Tensor dst, std::int64_t dst_stride, ConstTensor src,
                         std::int64_t src_stride, std::int64_t rows, std::int64_t cols,
                         gpu::Stream& stream) override {
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched("copy_block", ck::copy_block(dst.data, dst_stride, src.data, src_stride, rows,
                                                 cols, dst.dtype, raw(stream)));
  }

  Status layernorm_forward_impl(Tensor out, float* mean, float* rstd, ConstTensor x,
                                ConstTensor weight, ConstTensor bias, std::int64_t rows,
                                std::int64_t dim, gpu::Stream& stream) override {
    constexpr std::string_view op = "layernorm_forward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched(op, ck::layernorm_forward(out.data, mean, rstd, x.data, weight.data, bias.data,
                                              rows, dim, out.dtype, raw(stream)));
  }

  Status layernorm_backward_impl(Tensor dx, Accumulate dx_mode, Tensor dweight, Tensor dbias,
                                 ConstTensor dout, ConstTensor x, ConstTensor weight,
                                 const float* mean, const float* rstd, std::int64_t rows,
                                 std::int64_t dim, gpu::Stream& stream) override {
    constexpr std::string_view op = "layernorm_backward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched(op, ck::layernorm_backward(dx.data, dx_mode == Accumulate::kAdd, dweight.data,
                                               dbias.data, dout.data, x.data, weight.data, mean,
                                               rstd, rows, dim, dx.dtype, raw(stream)));
  }

  Status matmul_forward_impl(Tensor out, ConstTensor x, ConstTensor weight, WeightLayout layout,
                             ConstTensor bias, std::int64_t rows, std::int64_t in_dim,
                             std::int64_t out_dim, gpu::Stream& stream) override {
    constexpr std::string_view op = "matmul_forward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    float beta = 0.0f;
    if (bias.data != nullptr) {
      TZ_RETURN_IF_ERROR(launched(op, ck::broadcast_rows(out.data, bias.data, rows, out_dim,
                                                         out.dtype, raw(stream))));
      beta = 1.0f;
    }
    // Row-major Y (m, n) = X (m, k) W is column-major Y^T = W^T X^T; a row-major (k, n) weight
    // is the column-major W^T already, a row-major (n, k) one needs the transpose.
    const bool in_out = layout == WeightLayout::kInOut;
    return gemm(op, !in_out, false, out_dim, rows, in_dim, weight.data, in_out ? out_dim : in_dim,
                x.data, in_dim, beta, out.data, out_dim, out.dtype);
  }

  Status matmul_backward_impl(Tensor dx, Accumulate dx_mode, Tensor dweight, Tensor dbias,
                              ConstTensor dout, ConstTensor x, ConstTensor weight,
                              WeightLayout layout, std::int64_t rows, std::int64_t in_dim,
                              std::int64_t out_dim, gpu::Stream& stream) override {
    constexpr std::string_view op = "matmul_backward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    const bool in_out = layout == WeightLayout::kInOut;
    const DType dt = dout.dtype;
    if (dx.data != nullptr) {
      // dX^T (k, m) = W (k, n) dout^T: the (k, n) weight's buffer is column-major (n, k), so
      // transposed; the (n, k) one's is column-major (k, n) as it is.
      TZ_RETURN_IF_ERROR(gemm(op, in_out, false, in_dim, rows, out_dim, weight.data,
                              in_out ? out_dim : in_dim, dout.data, out_dim,
                              dx_mode == Accumulate::kAdd ? 1.0f : 0.0f, dx.data, in_dim, dt));
    }
    if (dweight.data != nullptr) {
      if (in_out) {  // dW^T (n, k) += dout^T (n, m) X (m, k)
        TZ_RETURN_IF_ERROR(gemm(op, false, true, out_dim, in_dim, rows, dout.data, out_dim, x.data,
                                in_dim, 1.0f, dweight.data, out_dim, dt));
      } else {  // dW^T (k, n) += X^T (k, m) dout (m, n)
        TZ_RETURN_IF_ERROR(gemm(op, false, true, in_dim, out_dim, rows, x.data, in_dim, dout.data,
                                out_dim, 1.0f, dweight.data, in_dim, dt));
      }
    }
    if (dbias.data != nullptr) {
      TZ_RETURN_IF_ERROR(
          launched(op, ck::column_sums(dbias.data, dout.data, rows, out_dim, dt, raw(stream))));
    }
    return Status::ok();
  }

  Status gelu_forward_impl(Tensor out, ConstTensor x, std::int64_t n,
                           gpu::Stream& stream) override {
    constexpr std::string_view op = "gelu_forward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched(op, ck::gelu_forward(out.data, x.data, n, out.dtype, raw(stream)));
  }

  Status gelu_backward_impl(Tensor dx, Accumulate dx_mode, ConstTensor dout, ConstTensor x,
                            std::int64_t n, gpu::Stream& stream) override {
    constexpr std::string_view op = "gelu_backward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched(op, ck::gelu_backward(dx.data, dx_mode == Accumulate::kAdd, dout.data, x.data,
                                          n, dx.dtype, raw(stream)));
  }

  Status residual_forward_impl(Tensor out, ConstTensor a, ConstTensor b, std::int64_t n,
                               gpu::Stream& stream) override {
    constexpr std::string_view op = "residual_forward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched(op, ck::residual_forward(out.data, a.data, b.data, n, out.dtype, raw(stream)));
  }

  Status scale_impl(Tensor out, Accumulate mode, ConstTensor x, const std::uint8_t* keep,
                    float alpha, std::int64_t n, gpu::Stream& stream) override {
    constexpr std::string_view op = "scale";
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched(op, ck::scale(out.data, mode == Accumulate::kAdd, x.data, keep, alpha, n,
                                  out.dtype, raw(stream)));
  }

  Status residual_backward_impl(Tensor da, Accumulate da_mode, Tensor db, Accumulate db_mode,
                                ConstTensor dout, std::int64_t n, gpu::Stream& stream) override {
    constexpr std::string_view op = "residual_backward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    if (da.data != nullptr) {
      TZ_RETURN_IF_ERROR(launched(op, ck::accumulate(da.data, da_mode == Accumulate::kAdd,
                                                     dout.data, n, dout.dtype, raw(stream))));
    }
    if (db.data != nullptr) {
      TZ_RETURN_IF_ERROR(launched(op, ck::accumulate(db.data, db_mode == Accumulate::kAdd,
                                                     dout.data, n, dout.dtype, raw(stream))));
    }
    return Status::ok();
  }

  Status cross_entropy_forward_impl(float* losses, ConstTensor logits, const std::int32_t* targets,
                                    std::int64_t rows, std::int64_t vocab,
                                    gpu::Stream& stream) override {
    constexpr std::string_view op = "cross_entropy_forward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched(op, ck::cross_entropy(nullptr, losses, logits.data, targets, rows, vocab, 0.0f,
                                          logits.dtype, raw(stream)));
  }

  Status cross_entropy_backward_impl(Tensor dlogits, float* losses, ConstTensor logits,
                                     const std::int32_t* targets, std::int64_t rows,
                                     std::int64_t vocab, float grad_scale,
                                     gpu::Stream& stream) override {
    constexpr std::string_view op = "cross_entropy_backward";
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched(op, ck::cross_entropy(dlogits.data, losses, logits.data, targets, rows, vocab,
                                          grad_scale, logits.dtype, raw(stream)));
  }

  Result<double> gemm_seconds_impl(std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                                   int repeats, gpu::Stream& stream) override {
    constexpr std::string_view op = "gemm_seconds";
    TZ_RETURN_IF_ERROR(prepare(stream));
    const std::size_t es = dtype_size(dtype);
    TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer a, device_.allocate(static_cast<std::size_t>(m * k) * es));
    TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer b, device_.allocate(static_cast<std::size_t>(k * n) * es));
    TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer c, device_.allocate(static_cast<std::size_t>(m * n) * es));
    TZ_RETURN_IF_ERROR(device_.fill(a.data(), dtype, static_cast<std::size_t>(m * k), 0.5f, stream));
    TZ_RETURN_IF_ERROR(device_.fill(b.data(), dtype, static_cast<std::size_t>(k * n), 0.25f, stream));
    std::vector<double> times;
    for (int rep = -1; rep < repeats; ++rep) {
      TZ_RETURN_IF_ERROR(stream.synchronize());
      const auto t0 = std::chrono::steady_clock::now();
      // Row-major C = A B is column-major C^T = B^T A^T: the buffers as they are.
      TZ_RETURN_IF_ERROR(gemm(op, false, false, n, m, k, b.data(), n, a.data(), k, 0.0f, c.data(),
                              n, dtype));
      TZ_RETURN_IF_ERROR(stream.synchronize());
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      if (rep >= 0) times.push_back(dt.count());
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  Status rmsnorm_forward_impl(Tensor out, float* rstd, ConstTensor x, ConstTensor weight,
                              float eps, std::int64_t rows, std::int64_t dim,
                              gpu::Stream& stream) override {
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched("rmsnorm_forward",
                    ck::rmsnorm_forward(out.data, rstd, x.data, weight.data, eps, rows, dim,
                                        out.dtype, raw(stream)));
  }

  Status rmsnorm_backward_impl(Tensor dx, Accumulate dx_mode, Tensor dweight, ConstTensor dout,
                               ConstTensor x, ConstTensor weight, const float* rstd,
                               std::int64_t rows, std::int64_t dim,
                               gpu::Stream& stream) override {
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched("rmsnorm_backward",
                    ck::rmsnorm_backward(dx.data, dx_mode == Accumulate::kAdd, dweight.data,
                                         dout.data, x.data, weight.data, rstd, rows, dim,
                                         dx.dtype, raw(stream)));
  }

  Status rope_impl(Tensor x, const float* inv_freq, std::int64_t batch, std::int64_t seq,
                   std::int64_t heads, std::int64_t head_dim, std::int64_t row_stride,
                   std::int64_t pos_offset, bool inverse, gpu::Stream& stream) override {
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched(inverse ? "rope_backward" : "rope_forward",
                    ck::rope(x.data, inv_freq, batch, seq, heads, head_dim, row_stride,
                             pos_offset, inverse, x.dtype, raw(stream)));
  }

  Status swiglu_forward_impl(Tensor out, ConstTensor gate, ConstTensor up, std::int64_t rows,
                             std::int64_t dim, std::int64_t in_stride,
                             gpu::Stream& stream) override {
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched("swiglu_forward", ck::swiglu_forward(out.data, gate.data, up.data, rows, dim,
                                                         in_stride, out.dtype, raw(stream)));
  }

  Status swiglu_backward_impl(Tensor dgate, Tensor dup, ConstTensor dout, ConstTensor gate,
                              ConstTensor up, std::int64_t rows, std::int64_t dim,
                              std::int64_t in_stride, gpu::Stream& stream) override {
    TZ_RETURN_IF_ERROR(prepare(stream));
    return launched("swiglu_backward",
                    ck::swiglu_backward(dgate.data, dup.data, dout.data, gate.data, up.data, rows,
                                        dim, in_stride, dgate.dtype, raw(stream)));
  }

  Status gqa_attention_forward_impl(Tensor out, float* lse, ConstTensor q, ConstTensor k,
                                    ConstTensor v, std::int64_t batch, std::int64_t q_len,
                                    std::int64_t kv_len, std::int64_t q_heads,
                                    std::int64_t kv_heads, std::int64_t head_dim,
                                    std::int64_t q_stride, std::int64_t kv_stride, float scale,
                                    gpu::Stream& stream) override {
    TZ_RETURN_IF_ERROR(prepare(stream));
    const ck::GqaArgs a{batch,    q_len,    kv_len,    q_heads, kv_heads,
                        head_dim, q_stride, kv_stride, scale};
    return launched("gqa_attention_forward",
                    ck::gqa_attention_forward(out.data, lse, q.data, k.data, v.data, a, out.dtype,
                                              raw(stream)));
  }

  Status gqa_attention_backward_impl(Tensor dq, Tensor dk, Tensor dv, Accumulate d_mode,
                                     float* delta, ConstTensor dout, ConstTensor q,
                                     ConstTensor k, ConstTensor v, ConstTensor out,
                                     const float* lse, std::int64_t batch, std::int64_t seq,
                                     std::int64_t q_heads, std::int64_t kv_heads,
                                     std::int64_t head_dim, std::int64_t q_stride,
                                     std::int64_t kv_stride, float scale,
                                     gpu::Stream& stream) override {
    TZ_RETURN_IF_ERROR(prepare(stream));
    const ck::GqaArgs a{batch, seq, seq, q_heads, kv_heads, head_dim, q_stride, kv_stride, scale};
    return launched("gqa_attention_backward",
                    ck::gqa_attention_backward(dq.data, dk.data, dv.data,
                                               d_mode == Accumulate::kAdd, delta, dout.data,
                                               q.data, k.data, v.data, out.data, lse, a, dq.dtype,
                                               raw(stream)));
  }

 private:
  static void* raw(gpu::Stream& stream) { return stream.native_handle(); }

  // Makes the device current and points cuBLAS at `stream` (the public method checked that it
  // is this device's).
  Status prepare(gpu::Stream& stream) {
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_.cuda_ordinal()));
    // An error pending from an earlier call is not this op's (gpu/launch_check.h).
    TZ_RETURN_IF_ERROR(gpu::clear_before_launch(gpu::cuda_launch_errors(), "ops kernel"));
    return cublas_status(cublasSetStream(handle_, static_cast<cudaStream_t>(raw(stream))),
                         "cublasSetStream");
  }

  static Status launched(std::string_view op, int err) {
    return gpu::launch_result(gpu::cuda_launch_errors(), err, op);
  }

  // Column-major C (m, n) = op(A) op(B) + beta C, all of dtype dt, fp32 accumulation.
  Status gemm(std::string_view op, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
              std::int64_t k, const void* a, std::int64_t lda, const void* b, std::int64_t ldb,
              float beta, void* c, std::int64_t ldc, DType dt) {
    const float alpha = 1.0f;
    const cudaDataType_t t = cuda_type(dt);
    return cublas_status(
        cublasGemmEx(handle_, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                     static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, a, t,
                     static_cast<int>(lda), b, t, static_cast<int>(ldb), &beta, c, t,
                     static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        std::string(op) + ": cublasGemmEx");
  }

  gpu::Device& device_;
  cublasHandle_t handle_;
  gpu::DeviceBuffer workspace_;  // cuBLAS's only workspace (freed after cublasDestroy)
  std::string name_;
};

}  // namespace

Result<std::unique_ptr<Ops>> create_cuda_ops(gpu::Device& device, const OpsOptions& /*options*/) {
  TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.cuda_ordinal()));
  cublasHandle_t handle = nullptr;
  TZ_RETURN_IF_ERROR(cublas_status(cublasCreate(&handle), "ops: cublasCreate"));
  int version = 0;
  if (cublasGetVersion(handle, &version) != CUBLAS_STATUS_SUCCESS) version = 0;
  // cuBLAS's workspace from the device pool, of the size the engine's plan counts
  // (gpu/workspaces.h), so cuBLAS allocates nothing outside the budget on its own.
  const std::uint64_t ws_bytes = gpu::device_workspaces(device, 1, false).cublas;
  auto workspace = device.allocate(ws_bytes);
  if (!workspace.is_ok()) {
    cublasDestroy(handle);
    return std::move(workspace).take_status().with_context("ops: cuBLAS workspace");
  }
  if (const Status st = cublas_status(cublasSetWorkspace(handle, workspace->data(), ws_bytes),
                                      "ops: cublasSetWorkspace");
      !st.is_ok()) {
    cublasDestroy(handle);
    return st;
  }
  return std::unique_ptr<Ops>(new CudaOps(
      device, handle, std::move(*workspace),
      "cuda (cuBLAS " + std::to_string(version) + ", " + device.name() + ")"));
}

}  // namespace tz::ops::internal

#endif  // TZ_HAVE_CUDA
