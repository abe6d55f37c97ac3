// Ops::create, the backend for the device's kind, and the public methods of ops/ops.h: each checks
// every argument once, for both backends (internal/check.h; a backend's own bounds come from its
// limits()), then hands the call to the backend's *_impl, which only enqueues the work. A check
// written here is the same on the CPU and on the GPU, so the backends cannot drift apart.
#include "ops/ops.h"

#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <string>

#include "ops/internal/backends.h"
#include "ops/internal/check.h"

namespace tz::ops {

using internal::check_dtype;
using internal::check_optional;
using internal::check_present;
using internal::check_sizes;
using internal::check_tensor;

Result<std::unique_ptr<Ops>> Ops::create(gpu::Device& device, const OpsOptions& options) {
  if (options.cpu_threads < 0) {
    return Status::invalid_argument("ops: cpu_threads must be >= 0 (0 = every core), got " +
                                    std::to_string(options.cpu_threads));
  }
  switch (device.kind()) {
    case gpu::DeviceKind::kHost:
      return internal::create_cpu_ops(device, options);
    case gpu::DeviceKind::kCuda:
#if defined(TZ_HAVE_CUDA)
      return internal::create_cuda_ops(device, options);
#else
      return Status::unavailable(
          "ops: the CUDA kernels are not built in (configure with -DTZ_CUDA=ON on a machine with "
          "nvcc)");
#endif
  }
  return Status::internal("ops: unknown device kind");
}

Status Ops::check_stream(gpu::Stream& stream) {
  if (&stream.device() == &device()) return Status::ok();
  return Status::invalid_argument("ops: the stream '" + stream.name() +
                                  "' belongs to another device than the Ops object's");
}

namespace {

// A parameter tensor of an op whose activations are `act`: present, of a storage dtype, and
// equal to act when the backend cannot mix them.
Status check_param(std::string_view op, std::string_view arg, ConstTensor t, DType act,
                   bool mixed) {
  TZ_RETURN_IF_ERROR(check_tensor(op, arg, t));
  return mixed ? Status::ok() : check_dtype(op, arg, t, act);
}

// An optional parameter tensor (a gradient that may not be wanted): null, or as check_param.
Status check_optional_param(std::string_view op, std::string_view arg, ConstTensor t, DType act,
                            bool mixed) {
  if (t.data == nullptr) return Status::ok();
  return check_param(op, arg, t, act, mixed);
}

// Every tensor of `rest` is present and of first's dtype (the act tensors of one op).
struct NamedTensor {
  std::string_view name;
  ConstTensor t;
};
Status check_same(std::string_view op, std::initializer_list<NamedTensor> rest, DType dtype) {
  for (const NamedTensor& n : rest) {
    TZ_RETURN_IF_ERROR(check_tensor(op, n.name, n.t));
    TZ_RETURN_IF_ERROR(check_dtype(op, n.name, n.t, dtype));
  }
  return Status::ok();
}

Status check_at_least(std::string_view op, std::string_view arg, std::int64_t value,
                      std::string_view bound_name, std::int64_t bound) {
  if (value >= bound) return Status::ok();
  return Status::invalid_argument(std::string(op) + ": " + std::string(arg) + " " +
                                  std::to_string(value) + " is less than " +
                                  std::string(bound_name) + " " + std::to_string(bound));
}

// The embedding's slice of the table: table_rows 0 (the whole table, first_row 0) or rows
// [first_row, first_row + table_rows) inside [0, vocab).
Status check_table_slice(std::string_view op, std::int64_t first_row, std::int64_t table_rows,
                         std::int64_t vocab) {
  if (table_rows == 0 && first_row == 0) return Status::ok();
  if (table_rows > 0 && first_row >= 0 && first_row <= vocab - table_rows) return Status::ok();
  return Status::invalid_argument(std::string(op) + ": the table's rows [" +
                                  std::to_string(first_row) + ", " +
                                  std::to_string(first_row + table_rows) +
                                  ") (first_row, table_rows) are not inside [0, vocab " +
                                  std::to_string(vocab) + ")");
}

}  // namespace

// ---- embedding -------------------------------------------------------------------------------

Status Ops::embedding_forward(Tensor out, const std::int32_t* tokens, ConstTensor wte,
                              ConstTensor wpe, std::int64_t batch, std::int64_t seq,
                              std::int64_t embd, std::int64_t vocab, gpu::Stream& stream,
                              std::int64_t first_row, std::int64_t table_rows) {
  constexpr std::string_view op = "embedding_forward";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"batch", batch}, {"seq", seq}, {"embd", embd},
                                      {"vocab", vocab}}));
  TZ_RETURN_IF_ERROR(check_table_slice(op, first_row, table_rows, vocab));
  TZ_RETURN_IF_ERROR(check_tensor(op, "out", out));
  TZ_RETURN_IF_ERROR(check_present(op, "tokens", tokens));
  TZ_RETURN_IF_ERROR(check_param(op, "wte", wte, out.dtype, limits().mixed_dtypes));
  TZ_RETURN_IF_ERROR(check_optional(op, "wpe", wpe, wte.dtype));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return embedding_forward_impl(out, tokens, wte, wpe, batch, seq, embd, vocab, first_row,
                                table_rows > 0 ? table_rows : vocab, stream);
}

Status Ops::embedding_backward(Tensor dwte, Tensor dwpe, ConstTensor dout,
                               const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                               std::int64_t embd, std::int64_t vocab, gpu::Stream& stream,
                               std::int64_t first_row, std::int64_t table_rows) {
  constexpr std::string_view op = "embedding_backward";
  const bool mixed = limits().mixed_dtypes;
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"batch", batch}, {"seq", seq}, {"embd", embd},
                                      {"vocab", vocab}}));
  TZ_RETURN_IF_ERROR(check_table_slice(op, first_row, table_rows, vocab));
  if (table_rows > 0 && dwpe.data != nullptr) {
    return Status::invalid_argument(std::string(op) + ": dwpe must be null with a slice of the "
                                    "table (table_rows " + std::to_string(table_rows) + ")");
  }
  TZ_RETURN_IF_ERROR(check_tensor(op, "dout", dout));
  TZ_RETURN_IF_ERROR(check_present(op, "tokens", tokens));
  TZ_RETURN_IF_ERROR(check_optional_param(op, "dwte", dwte, dout.dtype, mixed));
  TZ_RETURN_IF_ERROR(check_optional_param(op, "dwpe", dwpe, dout.dtype, mixed));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return embedding_backward_impl(dwte, dwpe, dout, tokens, batch, seq, embd, vocab, first_row,
                                 table_rows > 0 ? table_rows : vocab, stream);
}

// ---- strided block copy -----------------------------------------------------------------------

Status Ops::copy_block(Tensor dst, std::int64_t dst_stride, ConstTensor src,
                       std::int64_t src_stride, std::int64_t rows, std::int64_t cols,
                       gpu::Stream& stream) {
  constexpr std::string_view op = "copy_block";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"rows", rows}, {"cols", cols}}));
  TZ_RETURN_IF_ERROR(check_at_least(op, "dst_stride", dst_stride, "cols", cols));
  TZ_RETURN_IF_ERROR(check_at_least(op, "src_stride", src_stride, "cols", cols));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dst", dst));
  TZ_RETURN_IF_ERROR(check_same(op, {{"src", src}}, dst.dtype));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return copy_block_impl(dst, dst_stride, src, src_stride, rows, cols, stream);
}

// ---- layernorm --------------------------------------------------------------------------------

Status Ops::layernorm_forward(Tensor out, float* mean, float* rstd, ConstTensor x,
                              ConstTensor weight, ConstTensor bias, std::int64_t rows,
                              std::int64_t dim, gpu::Stream& stream) {
  constexpr std::string_view op = "layernorm_forward";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"rows", rows}, {"dim", dim}}));
  TZ_RETURN_IF_ERROR(check_tensor(op, "out", out));
  TZ_RETURN_IF_ERROR(check_same(op, {{"x", x}}, out.dtype));
  TZ_RETURN_IF_ERROR(check_param(op, "weight", weight, out.dtype, limits().mixed_dtypes));
  TZ_RETURN_IF_ERROR(check_same(op, {{"bias", bias}}, weight.dtype));
  TZ_RETURN_IF_ERROR(check_present(op, "mean", mean));
  TZ_RETURN_IF_ERROR(check_present(op, "rstd", rstd));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return layernorm_forward_impl(out, mean, rstd, x, weight, bias, rows, dim, stream);
}

Status Ops::layernorm_backward(Tensor dx, Accumulate dx_mode, Tensor dweight, Tensor dbias,
                               ConstTensor dout, ConstTensor x, ConstTensor weight,
                               const float* mean, const float* rstd, std::int64_t rows,
                               std::int64_t dim, gpu::Stream& stream) {
  constexpr std::string_view op = "layernorm_backward";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"rows", rows}, {"dim", dim}}));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dx", dx));
  TZ_RETURN_IF_ERROR(check_same(op, {{"dout", dout}, {"x", x}}, dx.dtype));
  TZ_RETURN_IF_ERROR(check_param(op, "weight", weight, dx.dtype, limits().mixed_dtypes));
  TZ_RETURN_IF_ERROR(check_optional(op, "dweight", dweight, weight.dtype));
  TZ_RETURN_IF_ERROR(check_optional(op, "dbias", dbias, weight.dtype));
  TZ_RETURN_IF_ERROR(check_present(op, "mean", mean));
  TZ_RETURN_IF_ERROR(check_present(op, "rstd", rstd));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return layernorm_backward_impl(dx, dx_mode, dweight, dbias, dout, x, weight, mean, rstd, rows,
                                 dim, stream);
}

// ---- matmul -----------------------------------------------------------------------------------

Status Ops::matmul_forward(Tensor out, ConstTensor x, ConstTensor weight, WeightLayout layout,
                           ConstTensor bias, std::int64_t rows, std::int64_t in_dim,
                           std::int64_t out_dim, gpu::Stream& stream) {
  constexpr std::string_view op = "matmul_forward";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"rows", rows}, {"in_dim", in_dim}, {"out_dim", out_dim}}));
  TZ_RETURN_IF_ERROR(check_tensor(op, "out", out));
  TZ_RETURN_IF_ERROR(check_same(op, {{"x", x}}, out.dtype));
  TZ_RETURN_IF_ERROR(check_param(op, "weight", weight, out.dtype, limits().mixed_dtypes));
  TZ_RETURN_IF_ERROR(check_optional(op, "bias", bias, weight.dtype));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return matmul_forward_impl(out, x, weight, layout, bias, rows, in_dim, out_dim, stream);
}

Status Ops::matmul_backward(Tensor dx, Accumulate dx_mode, Tensor dweight, Tensor dbias,
                            ConstTensor dout, ConstTensor x, ConstTensor weight,
                            WeightLayout layout, std::int64_t rows, std::int64_t in_dim,
                            std::int64_t out_dim, gpu::Stream& stream) {
  constexpr std::string_view op = "matmul_backward";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"rows", rows}, {"in_dim", in_dim}, {"out_dim", out_dim}}));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dout", dout));
  TZ_RETURN_IF_ERROR(check_same(op, {{"x", x}}, dout.dtype));
  TZ_RETURN_IF_ERROR(check_optional(op, "dx", dx, dout.dtype));
  if (dx.data != nullptr || weight.data != nullptr) {
    TZ_RETURN_IF_ERROR(check_param(op, "weight", weight, dout.dtype, limits().mixed_dtypes));
    TZ_RETURN_IF_ERROR(check_optional(op, "dweight", dweight, weight.dtype));
    TZ_RETURN_IF_ERROR(check_optional(op, "dbias", dbias, weight.dtype));
  } else {
    // No dx: the weight is not read (a tied LM head's chunk, whose gradient is computed after
    // its parameters were released: model/llama_impl.h).
    TZ_RETURN_IF_ERROR(check_optional_param(op, "dweight", dweight, dout.dtype,
                                            limits().mixed_dtypes));
    TZ_RETURN_IF_ERROR(check_optional_param(op, "dbias", dbias, dout.dtype,
                                            limits().mixed_dtypes));
  }
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return matmul_backward_impl(dx, dx_mode, dweight, dbias, dout, x, weight, layout, rows, in_dim,
                              out_dim, stream);
}

// ---- attention over fused qkv ----------------------------------------------------------------

namespace {
// Attention's sizes: all > 0, embd divisible by heads, and within the backend's limits.
Status check_attention_shape(std::string_view op, std::int64_t batch, std::int64_t seq,
                             std::int64_t embd, std::int64_t heads, std::int64_t max_head_dim,
                             std::int64_t max_batch_heads) {
  TZ_RETURN_IF_ERROR(internal::check_attention(op, batch, seq, embd, heads));
  if (max_head_dim > 0 && embd / heads > max_head_dim) {
    return Status::invalid_argument(std::string(op) + ": head_dim " +
                                    std::to_string(embd / heads) + " exceeds this backend's " +
                                    std::to_string(max_head_dim));
  }
  if (max_batch_heads > 0 && batch * heads > max_batch_heads) {
    return Status::invalid_argument(std::string(op) + ": batch*heads " +
                                    std::to_string(batch * heads) + " exceeds this backend's " +
                                    std::to_string(max_batch_heads));
  }
  return Status::ok();
}

// GPT-2's fused qkv rows [q | k | v] as grouped-query attention with kv_heads == heads: three
// views into one buffer, each row 3*embd elements apart (one kernel serves both families).
struct FusedQkv {
  ConstTensor q, k, v;
  std::int64_t head_dim = 0;
  std::int64_t stride = 0;
  float scale = 0;
};
FusedQkv fused_qkv(ConstTensor qkv, std::int64_t embd, std::int64_t heads) {
  const auto* base = static_cast<const std::byte*>(qkv.data);
  const std::size_t part_bytes = static_cast<std::size_t>(embd) * dtype_size(qkv.dtype);
  FusedQkv f;
  f.q = ConstTensor(base, qkv.dtype);
  f.k = ConstTensor(base + part_bytes, qkv.dtype);
  f.v = ConstTensor(base + 2 * part_bytes, qkv.dtype);
  f.head_dim = embd / heads;
  f.stride = 3 * embd;
  f.scale = 1.0f / std::sqrt(static_cast<float>(f.head_dim));
  return f;
}
}  // namespace

Status Ops::attention_forward(Tensor out, float* lse, ConstTensor qkv, std::int64_t batch,
                              std::int64_t seq, std::int64_t embd, std::int64_t heads,
                              gpu::Stream& stream) {
  constexpr std::string_view op = "attention_forward";
  const Limits lim = limits();
  TZ_RETURN_IF_ERROR(check_attention_shape(op, batch, seq, embd, heads, lim.max_head_dim,
                                           lim.max_batch_heads));
  TZ_RETURN_IF_ERROR(check_tensor(op, "out", out));
  TZ_RETURN_IF_ERROR(check_same(op, {{"qkv", qkv}}, out.dtype));
  TZ_RETURN_IF_ERROR(check_present(op, "lse", lse));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  const FusedQkv f = fused_qkv(qkv, embd, heads);
  return gqa_attention_forward_impl(out, lse, f.q, f.k, f.v, batch, seq, seq, heads, heads,
                                    f.head_dim, f.stride, f.stride, f.scale, stream);
}

Status Ops::attention_backward(Tensor dqkv, Accumulate dqkv_mode, float* delta, ConstTensor dout,
                               ConstTensor qkv, ConstTensor out, const float* lse,
                               std::int64_t batch, std::int64_t seq, std::int64_t embd,
                               std::int64_t heads, gpu::Stream& stream) {
  constexpr std::string_view op = "attention_backward";
  const Limits lim = limits();
  TZ_RETURN_IF_ERROR(check_attention_shape(op, batch, seq, embd, heads, lim.max_head_dim,
                                           lim.max_batch_heads));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dqkv", dqkv));
  TZ_RETURN_IF_ERROR(check_same(op, {{"dout", dout}, {"qkv", qkv}, {"out", out}}, dqkv.dtype));
  TZ_RETURN_IF_ERROR(check_present(op, "lse", lse));
  TZ_RETURN_IF_ERROR(check_present(op, "delta", delta));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  const FusedQkv f = fused_qkv(qkv, embd, heads);
  const FusedQkv d = fused_qkv(ConstTensor(dqkv), embd, heads);
  auto writable = [&](ConstTensor t) { return Tensor{const_cast<void*>(t.data), t.dtype}; };
  return gqa_attention_backward_impl(writable(d.q), writable(d.k), writable(d.v), dqkv_mode,
                                     delta, dout, f.q, f.k, f.v, out, lse, batch, seq, heads,
                                     heads, f.head_dim, f.stride, f.stride, f.scale, stream);
}

// ---- gelu, residual ------------------------------------------------------------------------------

Status Ops::gelu_forward(Tensor out, ConstTensor x, std::int64_t n, gpu::Stream& stream) {
  constexpr std::string_view op = "gelu_forward";
  TZ_RETURN_IF_ERROR(internal::check_positive(op, "n", n));
  TZ_RETURN_IF_ERROR(check_tensor(op, "out", out));
  TZ_RETURN_IF_ERROR(check_same(op, {{"x", x}}, out.dtype));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return gelu_forward_impl(out, x, n, stream);
}

Status Ops::gelu_backward(Tensor dx, Accumulate dx_mode, ConstTensor dout, ConstTensor x,
                          std::int64_t n, gpu::Stream& stream) {
  constexpr std::string_view op = "gelu_backward";
  TZ_RETURN_IF_ERROR(internal::check_positive(op, "n", n));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dx", dx));
  TZ_RETURN_IF_ERROR(check_same(op, {{"dout", dout}, {"x", x}}, dx.dtype));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return gelu_backward_impl(dx, dx_mode, dout, x, n, stream);
}

Status Ops::residual_forward(Tensor out, ConstTensor a, ConstTensor b, std::int64_t n,
                             gpu::Stream& stream) {
  constexpr std::string_view op = "residual_forward";
  TZ_RETURN_IF_ERROR(internal::check_positive(op, "n", n));
  TZ_RETURN_IF_ERROR(check_tensor(op, "out", out));
  TZ_RETURN_IF_ERROR(check_same(op, {{"a", a}, {"b", b}}, out.dtype));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return residual_forward_impl(out, a, b, n, stream);
}

Status Ops::residual_backward(Tensor da, Accumulate da_mode, Tensor db, Accumulate db_mode,
                              ConstTensor dout, std::int64_t n, gpu::Stream& stream) {
  constexpr std::string_view op = "residual_backward";
  TZ_RETURN_IF_ERROR(internal::check_positive(op, "n", n));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dout", dout));
  TZ_RETURN_IF_ERROR(check_optional(op, "da", da, dout.dtype));
  TZ_RETURN_IF_ERROR(check_optional(op, "db", db, dout.dtype));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return residual_backward_impl(da, da_mode, db, db_mode, dout, n, stream);
}

Status Ops::scale(Tensor out, Accumulate mode, ConstTensor x, const std::uint8_t* keep,
                  float alpha, std::int64_t n, gpu::Stream& stream) {
  constexpr std::string_view op = "scale";
  TZ_RETURN_IF_ERROR(internal::check_positive(op, "n", n));
  TZ_RETURN_IF_ERROR(check_tensor(op, "out", out));
  TZ_RETURN_IF_ERROR(check_same(op, {{"x", x}}, out.dtype));
  if (!std::isfinite(alpha)) {
    return Status::invalid_argument("ops scale: alpha must be finite, got " +
                                    std::to_string(alpha));
  }
  if (mode == Accumulate::kAdd && out.data == x.data) {
    return Status::invalid_argument("ops scale: out may not alias x when adding");
  }
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return scale_impl(out, mode, x, keep, alpha, n, stream);
}

// ---- cross-entropy -----------------------------------------------------------------------------

Status Ops::cross_entropy_forward(float* losses, ConstTensor logits, const std::int32_t* targets,
                                  std::int64_t rows, std::int64_t vocab, gpu::Stream& stream) {
  constexpr std::string_view op = "cross_entropy_forward";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"rows", rows}, {"vocab", vocab}}));
  TZ_RETURN_IF_ERROR(check_tensor(op, "logits", logits));
  TZ_RETURN_IF_ERROR(check_present(op, "targets", targets));
  TZ_RETURN_IF_ERROR(check_present(op, "losses", losses));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return cross_entropy_forward_impl(losses, logits, targets, rows, vocab, stream);
}

Status Ops::cross_entropy_backward(Tensor dlogits, float* losses, ConstTensor logits,
                                   const std::int32_t* targets, std::int64_t rows,
                                   std::int64_t vocab, float grad_scale, gpu::Stream& stream) {
  constexpr std::string_view op = "cross_entropy_backward";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"rows", rows}, {"vocab", vocab}}));
  TZ_RETURN_IF_ERROR(check_tensor(op, "logits", logits));
  TZ_RETURN_IF_ERROR(check_present(op, "targets", targets));
  TZ_RETURN_IF_ERROR(check_same(op, {{"dlogits", dlogits}}, logits.dtype));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return cross_entropy_backward_impl(dlogits, losses, logits, targets, rows, vocab, grad_scale,
                                     stream);
}

// ---- GEMM ceiling ---------------------------------------------------------------------------------

Result<double> Ops::gemm_seconds(std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                                 int repeats, gpu::Stream& stream) {
  constexpr std::string_view op = "gemm_seconds";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"m", m}, {"n", n}, {"k", k}, {"repeats", repeats}}));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return gemm_seconds_impl(m, n, k, dtype, repeats, stream);
}

// ---- RMSNorm --------------------------------------------------------------------------------

Status Ops::rmsnorm_forward(Tensor out, float* rstd, ConstTensor x, ConstTensor weight, float eps,
                            std::int64_t rows, std::int64_t dim, gpu::Stream& stream) {
  constexpr std::string_view op = "rmsnorm_forward";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"rows", rows}, {"dim", dim}}));
  TZ_RETURN_IF_ERROR(check_tensor(op, "out", out));
  TZ_RETURN_IF_ERROR(check_tensor(op, "x", x));
  TZ_RETURN_IF_ERROR(check_dtype(op, "x", x, out.dtype));
  TZ_RETURN_IF_ERROR(check_param(op, "weight", weight, out.dtype, limits().mixed_dtypes));
  TZ_RETURN_IF_ERROR(check_present(op, "rstd", rstd));
  if (!std::isfinite(eps) || eps < 0.0f) {
    return Status::invalid_argument(std::string(op) + ": eps must be finite and >= 0, got " +
                                    std::to_string(eps));
  }
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return rmsnorm_forward_impl(out, rstd, x, weight, eps, rows, dim, stream);
}

Status Ops::rmsnorm_backward(Tensor dx, Accumulate dx_mode, Tensor dweight, ConstTensor dout,
                             ConstTensor x, ConstTensor weight, const float* rstd,
                             std::int64_t rows, std::int64_t dim, gpu::Stream& stream) {
  constexpr std::string_view op = "rmsnorm_backward";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"rows", rows}, {"dim", dim}}));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dx", dx));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dout", dout));
  TZ_RETURN_IF_ERROR(check_dtype(op, "dout", dout, dx.dtype));
  TZ_RETURN_IF_ERROR(check_tensor(op, "x", x));
  TZ_RETURN_IF_ERROR(check_dtype(op, "x", x, dx.dtype));
  TZ_RETURN_IF_ERROR(check_param(op, "weight", weight, dx.dtype, limits().mixed_dtypes));
  TZ_RETURN_IF_ERROR(check_optional(op, "dweight", dweight, weight.dtype));
  TZ_RETURN_IF_ERROR(check_present(op, "rstd", rstd));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return rmsnorm_backward_impl(dx, dx_mode, dweight, dout, x, weight, rstd, rows, dim, stream);
}

// ---- rotary embedding ---------------------------------------------------------------------

namespace {
Status check_rope(std::string_view op, std::string_view x_name, Tensor x, const float* inv_freq,
                  std::int64_t batch, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, std::int64_t row_stride, std::int64_t pos_offset) {
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"batch", batch}, {"seq", seq}, {"heads", heads},
                                      {"head_dim", head_dim}}));
  TZ_RETURN_IF_ERROR(check_tensor(op, x_name, x));
  TZ_RETURN_IF_ERROR(check_present(op, "inv_freq", inv_freq));
  if (head_dim % 2 != 0) {
    return Status::invalid_argument(std::string(op) + ": head_dim " + std::to_string(head_dim) +
                                    " must be even (the rotation pairs its halves)");
  }
  TZ_RETURN_IF_ERROR(check_at_least(op, "row_stride", row_stride, "heads*head_dim",
                                    heads * head_dim));
  if (pos_offset < 0) {
    return Status::invalid_argument(std::string(op) + ": pos_offset must be >= 0, got " +
                                    std::to_string(pos_offset));
  }
  return Status::ok();
}
}  // namespace

Status Ops::rope_forward(Tensor x, const float* inv_freq, std::int64_t batch, std::int64_t seq,
                         std::int64_t heads, std::int64_t head_dim, std::int64_t row_stride,
                         std::int64_t pos_offset, gpu::Stream& stream) {
  TZ_RETURN_IF_ERROR(check_rope("rope_forward", "x", x, inv_freq, batch, seq, heads, head_dim,
                                row_stride, pos_offset));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return rope_impl(x, inv_freq, batch, seq, heads, head_dim, row_stride, pos_offset, false,
                   stream);
}

Status Ops::rope_backward(Tensor dx, const float* inv_freq, std::int64_t batch, std::int64_t seq,
                          std::int64_t heads, std::int64_t head_dim, std::int64_t row_stride,
                          std::int64_t pos_offset, gpu::Stream& stream) {
  TZ_RETURN_IF_ERROR(check_rope("rope_backward", "dx", dx, inv_freq, batch, seq, heads, head_dim,
                                row_stride, pos_offset));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return rope_impl(dx, inv_freq, batch, seq, heads, head_dim, row_stride, pos_offset, true,
                   stream);
}

// ---- SwiGLU -------------------------------------------------------------------------------

Status Ops::swiglu_forward(Tensor out, ConstTensor gate, ConstTensor up, std::int64_t rows,
                           std::int64_t dim, std::int64_t in_stride, gpu::Stream& stream) {
  constexpr std::string_view op = "swiglu_forward";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"rows", rows}, {"dim", dim}}));
  TZ_RETURN_IF_ERROR(check_at_least(op, "in_stride", in_stride, "dim", dim));
  TZ_RETURN_IF_ERROR(check_tensor(op, "out", out));
  TZ_RETURN_IF_ERROR(check_tensor(op, "gate", gate));
  TZ_RETURN_IF_ERROR(check_dtype(op, "gate", gate, out.dtype));
  TZ_RETURN_IF_ERROR(check_tensor(op, "up", up));
  TZ_RETURN_IF_ERROR(check_dtype(op, "up", up, out.dtype));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return swiglu_forward_impl(out, gate, up, rows, dim, in_stride, stream);
}

Status Ops::swiglu_backward(Tensor dgate, Tensor dup, ConstTensor dout, ConstTensor gate,
                            ConstTensor up, std::int64_t rows, std::int64_t dim,
                            std::int64_t in_stride, gpu::Stream& stream) {
  constexpr std::string_view op = "swiglu_backward";
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"rows", rows}, {"dim", dim}}));
  TZ_RETURN_IF_ERROR(check_at_least(op, "in_stride", in_stride, "dim", dim));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dgate", dgate));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dup", dup));
  TZ_RETURN_IF_ERROR(check_dtype(op, "dup", dup, dgate.dtype));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dout", dout));
  TZ_RETURN_IF_ERROR(check_dtype(op, "dout", dout, dgate.dtype));
  TZ_RETURN_IF_ERROR(check_tensor(op, "gate", gate));
  TZ_RETURN_IF_ERROR(check_dtype(op, "gate", gate, dgate.dtype));
  TZ_RETURN_IF_ERROR(check_tensor(op, "up", up));
  TZ_RETURN_IF_ERROR(check_dtype(op, "up", up, dgate.dtype));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return swiglu_backward_impl(dgate, dup, dout, gate, up, rows, dim, in_stride, stream);
}

// ---- grouped-query attention ------------------------------------------------------------------

namespace {
Status check_gqa_shape(std::string_view op, std::int64_t batch, std::int64_t q_len,
                       std::int64_t kv_len, std::int64_t q_heads, std::int64_t kv_heads,
                       std::int64_t head_dim, std::int64_t q_stride, std::int64_t kv_stride,
                       float scale, std::int64_t max_head_dim, std::int64_t max_batch_heads) {
  TZ_RETURN_IF_ERROR(check_sizes(op, {{"batch", batch}, {"q_len", q_len}, {"kv_len", kv_len},
                                      {"q_heads", q_heads}, {"kv_heads", kv_heads},
                                      {"head_dim", head_dim}}));
  if (q_heads % kv_heads != 0) {
    return Status::invalid_argument(std::string(op) + ": q_heads " + std::to_string(q_heads) +
                                    " does not divide by kv_heads " + std::to_string(kv_heads));
  }
  TZ_RETURN_IF_ERROR(check_at_least(op, "kv_len", kv_len, "q_len", q_len));
  TZ_RETURN_IF_ERROR(check_at_least(op, "q_stride", q_stride, "q_heads*head_dim",
                                    q_heads * head_dim));
  TZ_RETURN_IF_ERROR(check_at_least(op, "kv_stride", kv_stride, "kv_heads*head_dim",
                                    kv_heads * head_dim));
  if (!std::isfinite(scale) || scale <= 0.0f) {
    return Status::invalid_argument(std::string(op) + ": scale must be finite and > 0, got " +
                                    std::to_string(scale));
  }
  if (max_head_dim > 0 && head_dim > max_head_dim) {
    return Status::invalid_argument(std::string(op) + ": head_dim " + std::to_string(head_dim) +
                                    " exceeds this backend's " + std::to_string(max_head_dim));
  }
  if (max_batch_heads > 0 && batch * q_heads > max_batch_heads) {
    return Status::invalid_argument(std::string(op) + ": batch*q_heads " +
                                    std::to_string(batch * q_heads) + " exceeds this backend's " +
                                    std::to_string(max_batch_heads));
  }
  return Status::ok();
}
}  // namespace

Status Ops::gqa_attention_forward(Tensor out, float* lse, ConstTensor q, ConstTensor k,
                                  ConstTensor v, std::int64_t batch, std::int64_t q_len,
                                  std::int64_t kv_len, std::int64_t q_heads,
                                  std::int64_t kv_heads, std::int64_t head_dim,
                                  std::int64_t q_stride, std::int64_t kv_stride, float scale,
                                  gpu::Stream& stream) {
  constexpr std::string_view op = "gqa_attention_forward";
  const Limits lim = limits();
  TZ_RETURN_IF_ERROR(check_gqa_shape(op, batch, q_len, kv_len, q_heads, kv_heads, head_dim,
                                     q_stride, kv_stride, scale, lim.max_head_dim,
                                     lim.max_batch_heads));
  TZ_RETURN_IF_ERROR(check_tensor(op, "out", out));
  TZ_RETURN_IF_ERROR(check_present(op, "lse", lse));
  for (const auto& [name, t] : {std::pair<std::string_view, ConstTensor>{"q", q}, {"k", k},
                                {"v", v}}) {
    TZ_RETURN_IF_ERROR(check_tensor(op, name, t));
    TZ_RETURN_IF_ERROR(check_dtype(op, name, t, out.dtype));
  }
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return gqa_attention_forward_impl(out, lse, q, k, v, batch, q_len, kv_len, q_heads, kv_heads,
                                    head_dim, q_stride, kv_stride, scale, stream);
}

Status Ops::gqa_attention_backward(Tensor dq, Tensor dk, Tensor dv, Accumulate d_mode,
                                   float* delta, ConstTensor dout, ConstTensor q, ConstTensor k,
                                   ConstTensor v, ConstTensor out, const float* lse,
                                   std::int64_t batch, std::int64_t seq, std::int64_t q_heads,
                                   std::int64_t kv_heads, std::int64_t head_dim,
                                   std::int64_t q_stride, std::int64_t kv_stride, float scale,
                                   gpu::Stream& stream) {
  constexpr std::string_view op = "gqa_attention_backward";
  const Limits lim = limits();
  TZ_RETURN_IF_ERROR(check_gqa_shape(op, batch, seq, seq, q_heads, kv_heads, head_dim, q_stride,
                                     kv_stride, scale, lim.max_head_dim, lim.max_batch_heads));
  TZ_RETURN_IF_ERROR(check_tensor(op, "dq", dq));
  for (const auto& [name, t] :
       {std::pair<std::string_view, ConstTensor>{"dk", dk}, {"dv", dv}, {"dout", dout}, {"q", q},
        {"k", k}, {"v", v}, {"out", out}}) {
    TZ_RETURN_IF_ERROR(check_tensor(op, name, t));
    TZ_RETURN_IF_ERROR(check_dtype(op, name, t, dq.dtype));
  }
  TZ_RETURN_IF_ERROR(check_present(op, "lse", lse));
  TZ_RETURN_IF_ERROR(check_present(op, "delta", delta));
  TZ_RETURN_IF_ERROR(check_stream(stream));
  return gqa_attention_backward_impl(dq, dk, dv, d_mode, delta, dout, q, k, v, out, lse, batch,
                                     seq, q_heads, kv_heads, head_dim, q_stride, kv_stride, scale,
                                     stream);
}

}  // namespace tz::ops
