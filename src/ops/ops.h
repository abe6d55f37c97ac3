// The model's kernels behind one interface (DESIGN.md, "ops/"): forward and backward of the token
// and position embedding, layernorm, matmul with bias, causal self-attention, gelu, residual add
// the fused softmax + cross-entropy (GPT-2), a masked scale (LoRA), and RMSNorm, rotary embedding, SwiGLU and
// grouped-query causal attention with a KV-cache offset (the Llama family). Two backends, chosen
// by the device's kind: the CPU backend (kHost: BLAS for the matmuls, Highway + oneTBB for the
// rest) and the CUDA backend (kCuda: cuBLAS, .cu kernels). The per-element math both share is
// ops/ops_math.h.
//
// Contract common to every op:
// - Pointers are device pointers of the Ops object's device; tensors are dense and row-major.
// - Every op is stream-ordered: it is enqueued on `stream` (a stream of the same device), returns
//   at once, and runs after the work enqueued on that stream before it (including stream waits,
//   such as the one engine.gather() issues for parameters). Inputs must stay valid and unchanged,
//   and outputs unread, until that work completes (an event or a synchronize proves it).
//   The CPU backend enqueues each op as one Device::host_callback on the stream: it runs on the
//   stream's worker thread, which then uses the Ops object's oneTBB arena (and BLAS with the same
//   thread count) for its parallel parts, so a CPU op never blocks the caller.
// - Errors: every argument is checked when the op is enqueued; a null pointer where a tensor is
//   required, a zero or negative size, an unsupported dtype or a shape that does not fit returns
//   kInvalidArgument naming the op and the argument, and nothing is enqueued. These checks are
//   the public methods' (ops.cc), one set for both backends; what one backend cannot take comes
//   from its limits() and is named in the message. Once enqueued an op cannot fail on the CPU
//   backend; the CUDA backend returns kDeviceError when a launch fails.
//   Token ids and targets are data, not arguments: each must lie in [0, vocab) (the CPU backend
//   asserts it; the caller checks user input before it reaches the device).
// - Dtypes: activations (`act`: inputs, outputs and their gradients) and parameters (`param`:
//   weights, biases, tables and their gradients) are fp32, bf16 or fp16 storage; all arithmetic and
//   every sum is fp32 (16-bit values are rounded to nearest even once, when stored). Statistics
//   saved for backward (layernorm mean/rstd, attention logsumexp, softmax losses) are always fp32;
//   token ids and targets are int32. The CPU backend accepts any act/param combination; the CUDA
//   backend requires act == param (cuBLAS multiplies like with like) and returns kInvalidArgument
//   otherwise.
// - Gradients: parameter gradients (dweight, dbias, dwte, dwpe, dln) always ACCUMULATE (+=) into
//   their buffers, so the tied LM head and the token embedding add into the same wte gradient and
//   micro-batches may add up; the engine hands them out zeroed. Input gradients (dx) take an
//   Accumulate argument: kOverwrite writes them, kAdd adds into them (the residual stream's
//   gradient is the sum of the skip and the branch).
// - Aliasing: outputs never alias inputs unless an op says so.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"
#include "gpu/device.h"

namespace tz::ops {

// A device tensor: where its elements are and what they are. Its shape comes from the op's
// arguments.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
};
struct ConstTensor {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  ConstTensor() = default;
  ConstTensor(const void* d, DType t) : data(d), dtype(t) {}
  ConstTensor(Tensor t) : data(t.data), dtype(t.dtype) {}  // NOLINT(google-explicit-constructor)
};

enum class Accumulate : std::uint8_t { kOverwrite, kAdd };

// How a matmul's weight is stored. kInOut: (in, out), as GPT-2's Conv1D (y = x W + b);
// kOutIn: (out, in), as the token table wte (V, C) used as the tied LM head (logits = x wte^T).
enum class WeightLayout : std::uint8_t { kInOut, kOutIn };

struct OpsOptions {
  // Threads of the CPU backend's oneTBB arena and of BLAS (set explicitly, so the two never
  // oversubscribe the cores); 0 = the number of cores this process may run on. Ignored by CUDA.
  int cpu_threads = 0;
  // Matmuls whose operands are both bf16 run on oneDNN's native bf16 kernels where the CPU has
  // them (ops::cpu_bf16_gemm_native(): avx512_bf16 or AMX), summing in fp32; false widens them
  // to fp32 around sgemm as on other CPUs (the two differ only by the order of the sums).
  bool native_bf16_gemm = true;
};

class Ops {
 public:
  // The backend for `device`'s kind: kHost -> CPU backend, kCuda -> CUDA backend. `device` must
  // outlive the Ops object. kUnavailable when the kind's backend is not built in (CUDA without
  // TZ_CUDA); kDeviceError when cuBLAS cannot be initialised; kInvalidArgument for cpu_threads < 0.
  static Result<std::unique_ptr<Ops>> create(gpu::Device& device, const OpsOptions& options = {});
  virtual ~Ops() = default;
  Ops(const Ops&) = delete;
  Ops& operator=(const Ops&) = delete;

  virtual gpu::Device& device() = 0;
  // "cpu (oneDNN 2.6.3 (OpenMP) sgemm avx2; 2 threads; AVX2)" or "cuda (cuBLAS 13.0, H100 ...)".
  virtual std::string_view name() const = 0;

  // --- Embedding ----------------------------------------------------------------------------
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] for b < batch, t < seq.
  // out: act (batch*seq, embd); tokens: int32 (batch*seq); wte: param (vocab, embd);
  // wpe: param (>= seq, embd) (only its first seq rows are read), or null: no learned positions
  // (the Llama family), out = wte[tokens].
  // A slice of the table (the Llama family's vocabulary chunks, model/llama.h): with table_rows >
  // 0, wte holds only the table's rows [first_row, first_row + table_rows) (row i of wte is token
  // first_row + i), and the positions whose token lies outside them are left as they are (no wpe
  // either); tokens must still lie in [0, vocab). table_rows 0: the whole table (first_row 0).
  Status embedding_forward(Tensor out, const std::int32_t* tokens, ConstTensor wte,
                                   ConstTensor wpe, std::int64_t batch, std::int64_t seq,
                                   std::int64_t embd, std::int64_t vocab, gpu::Stream& stream,
                                   std::int64_t first_row = 0, std::int64_t table_rows = 0);
  // dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum over b of dout[b,t,:]. Either gradient
  // may be null (not wanted). Deterministic: the same inputs give the same bits (no atomics).
  // first_row and table_rows as the forward's: dwte holds those rows, and the positions whose
  // token lies outside them add nothing to it (dwpe must then be null).
  Status embedding_backward(Tensor dwte, Tensor dwpe, ConstTensor dout,
                                    const std::int32_t* tokens, std::int64_t batch,
                                    std::int64_t seq, std::int64_t embd, std::int64_t vocab,
                                    gpu::Stream& stream, std::int64_t first_row = 0,
                                    std::int64_t table_rows = 0);

  // --- Strided block copy (the LM head's vocabulary chunks into the logits and back) ----------
  // dst[r * dst_stride + j] = src[r * src_stride + j] for r < rows, j < cols. dst, src: act, the
  // same dtype; strides >= cols; dst and src do not overlap.
  Status copy_block(Tensor dst, std::int64_t dst_stride, ConstTensor src, std::int64_t src_stride,
                    std::int64_t rows, std::int64_t cols, gpu::Stream& stream);

  // --- LayerNorm (eps 1e-5, biased variance, as torch.nn.LayerNorm) -------------------------
  // out = (x - mean) * rstd * weight + bias, per row. out, x: act (rows, dim); weight, bias:
  // param (dim); mean, rstd: fp32 (rows), written (saved for backward). out may not alias x.
  Status layernorm_forward(Tensor out, float* mean, float* rstd, ConstTensor x,
                                   ConstTensor weight, ConstTensor bias, std::int64_t rows,
                                   std::int64_t dim, gpu::Stream& stream);
  // From the forward's x, mean and rstd: dx (overwrite or add), dweight += , dbias += .
  // dweight or dbias may be null; dx may not alias dout.
  Status layernorm_backward(Tensor dx, Accumulate dx_mode, Tensor dweight, Tensor dbias,
                                    ConstTensor dout, ConstTensor x, ConstTensor weight,
                                    const float* mean, const float* rstd, std::int64_t rows,
                                    std::int64_t dim, gpu::Stream& stream);

  // --- Matmul with bias -----------------------------------------------------------------------
  // out = x W + b. out: act (rows, out_dim); x: act (rows, in_dim); weight: param (in_dim, out_dim)
  // for kInOut or (out_dim, in_dim) for kOutIn; bias: param (out_dim) or null (no bias).
  Status matmul_forward(Tensor out, ConstTensor x, ConstTensor weight, WeightLayout layout,
                                ConstTensor bias, std::int64_t rows, std::int64_t in_dim,
                                std::int64_t out_dim, gpu::Stream& stream);
  // dx = dout W^T (overwrite or add; null: not wanted), dweight += x^T dout (in the weight's own
  // layout; null: not wanted), dbias += column sums of dout (null: not wanted). The weight is read
  // for dx only: it may be null when dx is.
  Status matmul_backward(Tensor dx, Accumulate dx_mode, Tensor dweight, Tensor dbias,
                                 ConstTensor dout, ConstTensor x, ConstTensor weight,
                                 WeightLayout layout, std::int64_t rows, std::int64_t in_dim,
                                 std::int64_t out_dim, gpu::Stream& stream);

  // --- Causal self-attention over fused qkv ---------------------------------------------------
  // qkv: act (batch, seq, 3*embd), each row [q | k | v], each of those split into `heads` heads of
  // head_dim = embd / heads (HF GPT-2's split). out: act (batch, seq, embd), heads concatenated:
  // out_h[t] = sum_{s<=t} softmax_s(q_h[t].k_h[s] / sqrt(head_dim)) v_h[s].
  // lse: fp32 (batch, heads, seq), written: the log-sum-exp of each row's scaled scores, saved for
  // backward. Blocked online softmax: memory beyond the tensors is O(block * head_dim) per thread,
  // never seq x seq. embd % heads must be 0.
  Status attention_forward(Tensor out, float* lse, ConstTensor qkv, std::int64_t batch,
                                   std::int64_t seq, std::int64_t embd, std::int64_t heads,
                                   gpu::Stream& stream);
  // dqkv: act (batch, seq, 3*embd), overwrite or add. From the forward's qkv, out and lse and the
  // gradient dout of out. delta: fp32 scratch (batch, heads, seq), overwritten (rowsum(dout*out)).
  Status attention_backward(Tensor dqkv, Accumulate dqkv_mode, float* delta,
                                    ConstTensor dout, ConstTensor qkv, ConstTensor out,
                                    const float* lse, std::int64_t batch, std::int64_t seq,
                                    std::int64_t embd, std::int64_t heads, gpu::Stream& stream);

  // --- GELU, tanh approximation (HF "gelu_new") -----------------------------------------------
  // out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), n elements of act. out may alias x.
  Status gelu_forward(Tensor out, ConstTensor x, std::int64_t n, gpu::Stream& stream);
  // dx = dout * gelu'(x) (overwrite or add). dx may alias dout when dx_mode is kOverwrite.
  Status gelu_backward(Tensor dx, Accumulate dx_mode, ConstTensor dout, ConstTensor x,
                               std::int64_t n, gpu::Stream& stream);

  // --- Residual add ----------------------------------------------------------------------------
  // out = a + b, n elements of act. out may alias a or b.
  Status residual_forward(Tensor out, ConstTensor a, ConstTensor b, std::int64_t n,
                                  gpu::Stream& stream);
  // The gradient of a + b reaches both: da and db each receive dout (overwrite or add, each by
  // its mode); either may be null; neither may alias dout. (The skip path of a pre-LN block needs
  // no call: the residual stream's gradient already is dout.)
  Status residual_backward(Tensor da, Accumulate da_mode, Tensor db, Accumulate db_mode,
                                   ConstTensor dout, std::int64_t n, gpu::Stream& stream);

  // --- Scale with an optional keep mask (LoRA's alpha / r and its dropout) ---------------------
  // out[i] = alpha * x[i] * keep[i] (overwrite or add), n elements of act; keep: a uint8 device
  // array of 0/1 (n), or null (all kept). out may alias x when mode is kOverwrite.
  Status scale(Tensor out, Accumulate mode, ConstTensor x, const std::uint8_t* keep, float alpha,
               std::int64_t n, gpu::Stream& stream);

  // --- Fused softmax + cross-entropy ----------------------------------------------------------
  // losses[i] = logsumexp(logits[i,:]) - logits[i, targets[i]] for i < rows. logits: act
  // (rows, vocab); targets: int32 (rows); losses: fp32 (rows), written. The mean loss is the sum
  // of losses over the positions divided by their count (the caller's reduction).
  Status cross_entropy_forward(float* losses, ConstTensor logits,
                                       const std::int32_t* targets, std::int64_t rows,
                                       std::int64_t vocab, gpu::Stream& stream);
  // dlogits[i,:] = (softmax(logits[i,:]) - onehot(targets[i])) * grad_scale, with grad_scale =
  // dloss / N for a mean over N positions (times the loss scale under fp16). One pass over each
  // row's logits; dlogits may alias logits (in place, so only one micro-batch's logits ever
  // exist). losses: as the forward's, written in the same pass when non-null (the fused path).
  Status cross_entropy_backward(Tensor dlogits, float* losses, ConstTensor logits,
                                        const std::int32_t* targets, std::int64_t rows,
                                        std::int64_t vocab, float grad_scale,
                                        gpu::Stream& stream);

  // --- RMSNorm (HF LlamaRMSNorm / Qwen3RMSNorm) ---------------------------------------------
  // out = x * rstd * weight per row, rstd = 1 / sqrt(mean(x^2) + eps), fp32 math. out, x: act
  // (rows, dim); weight: param (dim); rstd: fp32 (rows), written (saved for backward); eps finite
  // and >= 0. out may alias x. Qwen3's q_norm / k_norm are this op over rows = tokens * heads,
  // dim = head_dim.
  Status rmsnorm_forward(Tensor out, float* rstd, ConstTensor x, ConstTensor weight, float eps,
                         std::int64_t rows, std::int64_t dim, gpu::Stream& stream);
  // From the forward's x and rstd: dx (overwrite or add), dweight += (null: not wanted).
  // dx may not alias dout or x.
  Status rmsnorm_backward(Tensor dx, Accumulate dx_mode, Tensor dweight, ConstTensor dout,
                          ConstTensor x, ConstTensor weight, const float* rstd, std::int64_t rows,
                          std::int64_t dim, gpu::Stream& stream);

  // --- Rotary position embedding (HF rotate_half convention, not interleaved) ----------------
  // In place on x: act rows (b, t) for b < batch, t < seq, `row_stride` elements apart
  // (>= heads * head_dim), each holding `heads` heads of head_dim at the row's start (so q or k
  // inside a fused qkv row: x = qkv + offset, row_stride = the qkv row's length). With position
  // p = pos_offset + t and angle_i = p * inv_freq[i] (fp32 product, then cos/sin, as HF), for
  // i < head_dim / 2: y[i] = x[i] cos - x[i + D/2] sin, y[i + D/2] = x[i + D/2] cos + x[i] sin.
  // inv_freq: fp32 device array (head_dim / 2) from rope_theta and rope_scaling (the model's).
  // head_dim must be even; pos_offset >= 0 (the KV cache's length when decoding).
  Status rope_forward(Tensor x, const float* inv_freq, std::int64_t batch, std::int64_t seq,
                      std::int64_t heads, std::int64_t head_dim, std::int64_t row_stride,
                      std::int64_t pos_offset, gpu::Stream& stream);
  // The gradient through the rotation: the inverse rotation (angle -> -angle), in place on dx
  // (laid out as the forward's x).
  Status rope_backward(Tensor dx, const float* inv_freq, std::int64_t batch, std::int64_t seq,
                       std::int64_t heads, std::int64_t head_dim, std::int64_t row_stride,
                       std::int64_t pos_offset, gpu::Stream& stream);

  // --- SwiGLU: out = silu(gate) * up -----------------------------------------------------------
  // out: act (rows, dim), contiguous; gate, up: act rows `in_stride` elements apart (>= dim), so
  // a fused [gate | up] matmul output works (in_stride = 2 * dim, up = gate + dim).
  Status swiglu_forward(Tensor out, ConstTensor gate, ConstTensor up, std::int64_t rows,
                        std::int64_t dim, std::int64_t in_stride, gpu::Stream& stream);
  // dgate = dout * up * silu'(gate), dup = dout * silu(gate), both OVERWRITTEN, laid out as gate
  // and up (rows in_stride apart; they may point into one fused [dgate | dup] buffer). Neither
  // may alias dout, gate or up.
  Status swiglu_backward(Tensor dgate, Tensor dup, ConstTensor dout, ConstTensor gate,
                         ConstTensor up, std::int64_t rows, std::int64_t dim,
                         std::int64_t in_stride, gpu::Stream& stream);

  // --- Grouped-query causal attention (MHA when kv_heads == q_heads) --------------------------
  // q: act (batch, q_len) rows `q_stride` elements apart, q_heads * head_dim at each row's start;
  // k, v: act (batch, kv_len) rows `kv_stride` elements apart, kv_heads * head_dim each. Query
  // head h uses kv head h / (q_heads / kv_heads) (q_heads % kv_heads == 0). Query i sits at
  // absolute position kv_len - q_len + i (kv_len >= q_len) and sees keys 0 .. that position, so
  // q_len == kv_len is training and q_len == 1 with kv_len = cache length + 1 is one decode step
  // over a KV cache. out_h[i] = sum_j softmax_j(scale * q_h[i].k[j]) v[j] with `scale` (finite,
  // > 0; 1/sqrt(head_dim) for the family). out: act (batch, q_len, q_heads * head_dim),
  // contiguous. lse: fp32 (batch, q_heads, q_len), written: each row's log-sum-exp of the scaled
  // scores, saved for backward. Blocked online softmax: never a q_len x kv_len buffer. The CUDA
  // backend takes head_dim <= 128 and batch * q_heads <= 65535.
  Status gqa_attention_forward(Tensor out, float* lse, ConstTensor q, ConstTensor k,
                               ConstTensor v, std::int64_t batch, std::int64_t q_len,
                               std::int64_t kv_len, std::int64_t q_heads, std::int64_t kv_heads,
                               std::int64_t head_dim, std::int64_t q_stride,
                               std::int64_t kv_stride, float scale, gpu::Stream& stream);
  // Backward of the training case (q_len == kv_len == seq): dq, dk, dv laid out as q, k, v (same
  // strides; they may point into one fused dqkv buffer, since they never overlap), each written
  // by d_mode (overwrite or add), from the forward's out and lse and dout (laid out as out).
  // delta: fp32 scratch (batch, q_heads, seq), overwritten (rowsum(dout * out)). Deterministic:
  // dk and dv of a kv head sum its query heads in head order, no atomics.
  Status gqa_attention_backward(Tensor dq, Tensor dk, Tensor dv, Accumulate d_mode, float* delta,
                                ConstTensor dout, ConstTensor q, ConstTensor k, ConstTensor v,
                                ConstTensor out, const float* lse, std::int64_t batch,
                                std::int64_t seq, std::int64_t q_heads, std::int64_t kv_heads,
                                std::int64_t head_dim, std::int64_t q_stride,
                                std::int64_t kv_stride, float scale, gpu::Stream& stream);

  // --- The same-run ceiling of `tierzero bench ops` ------------------------------------------
  // The backend's GEMM alone, C (m, n) = A (m, k) B (k, n), row-major, fp32 accumulation: oneDNN
  // sgemm on the CPU (always fp32 there: the CPU backend widens 16-bit tensors; ops/gemm.h),
  // cublasGemmEx with `dtype` storage on CUDA. Operands are allocated here and filled with a
  // constant; one warm-up, then the median seconds of `repeats` runs. Synchronizes `stream`.
  // kOutOfMemory when the operands do not fit; kInvalidArgument for a size <= 0 or repeats < 1.
  Result<double> gemm_seconds(std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                                      int repeats, gpu::Stream& stream);

 protected:
  Ops() = default;

  // What a backend cannot take, checked by the public methods with every other argument.
  struct Limits {
    bool mixed_dtypes = true;       // act and param dtypes may differ (false: CUDA)
    std::int64_t max_head_dim = 0;  // attention's head_dim bound (0: none)
    std::int64_t max_batch_heads = 0;  // attention's batch * heads bound (0: none)
  };
  virtual Limits limits() const = 0;

  // The backends' implementations of the public methods of the same name without the suffix,
  // called after those validated every argument (ops.cc): they only enqueue the work. The
  // embedding's table_rows is resolved (> 0: the whole table is first_row 0, table_rows vocab).
  virtual Status embedding_forward_impl(Tensor out, const std::int32_t* tokens, ConstTensor wte,
                                        ConstTensor wpe, std::int64_t batch, std::int64_t seq,
                                        std::int64_t embd, std::int64_t vocab,
                                        std::int64_t first_row, std::int64_t table_rows,
                                        gpu::Stream& stream) = 0;
  virtual Status embedding_backward_impl(Tensor dwte, Tensor dwpe, ConstTensor dout,
                                         const std::int32_t* tokens, std::int64_t batch,
                                         std::int64_t seq, std::int64_t embd, std::int64_t vocab,
                                         std::int64_t first_row, std::int64_t table_rows,
                                         gpu::Stream& stream) = 0;
  virtual Status copy_block_impl(Tensor dst, std::int64_t dst_stride, ConstTensor src,
                                 std::int64_t src_stride, std::int64_t rows, std::int64_t cols,
                                 gpu::Stream& stream) = 0;
  virtual Status layernorm_forward_impl(Tensor out, float* mean, float* rstd, ConstTensor x,
                                        ConstTensor weight, ConstTensor bias, std::int64_t rows,
                                        std::int64_t dim, gpu::Stream& stream) = 0;
  virtual Status layernorm_backward_impl(Tensor dx, Accumulate dx_mode, Tensor dweight,
                                         Tensor dbias, ConstTensor dout, ConstTensor x,
                                         ConstTensor weight, const float* mean, const float* rstd,
                                         std::int64_t rows, std::int64_t dim,
                                         gpu::Stream& stream) = 0;
  virtual Status matmul_forward_impl(Tensor out, ConstTensor x, ConstTensor weight,
                                     WeightLayout layout, ConstTensor bias, std::int64_t rows,
                                     std::int64_t in_dim, std::int64_t out_dim,
                                     gpu::Stream& stream) = 0;
  virtual Status matmul_backward_impl(Tensor dx, Accumulate dx_mode, Tensor dweight, Tensor dbias,
                                      ConstTensor dout, ConstTensor x, ConstTensor weight,
                                      WeightLayout layout, std::int64_t rows, std::int64_t in_dim,
                                      std::int64_t out_dim, gpu::Stream& stream) = 0;
  virtual Status gelu_forward_impl(Tensor out, ConstTensor x, std::int64_t n,
                                   gpu::Stream& stream) = 0;
  virtual Status gelu_backward_impl(Tensor dx, Accumulate dx_mode, ConstTensor dout, ConstTensor x,
                                    std::int64_t n, gpu::Stream& stream) = 0;
  virtual Status residual_forward_impl(Tensor out, ConstTensor a, ConstTensor b, std::int64_t n,
                                       gpu::Stream& stream) = 0;
  virtual Status residual_backward_impl(Tensor da, Accumulate da_mode, Tensor db,
                                        Accumulate db_mode, ConstTensor dout, std::int64_t n,
                                        gpu::Stream& stream) = 0;
  virtual Status scale_impl(Tensor out, Accumulate mode, ConstTensor x, const std::uint8_t* keep,
                            float alpha, std::int64_t n, gpu::Stream& stream) = 0;
  virtual Status cross_entropy_forward_impl(float* losses, ConstTensor logits,
                                            const std::int32_t* targets, std::int64_t rows,
                                            std::int64_t vocab, gpu::Stream& stream) = 0;
  virtual Status cross_entropy_backward_impl(Tensor dlogits, float* losses, ConstTensor logits,
                                             const std::int32_t* targets, std::int64_t rows,
                                             std::int64_t vocab, float grad_scale,
                                             gpu::Stream& stream) = 0;
  virtual Result<double> gemm_seconds_impl(std::int64_t m, std::int64_t n, std::int64_t k,
                                           DType dtype, int repeats, gpu::Stream& stream) = 0;
  virtual Status rmsnorm_forward_impl(Tensor out, float* rstd, ConstTensor x, ConstTensor weight,
                                      float eps, std::int64_t rows, std::int64_t dim,
                                      gpu::Stream& stream) = 0;
  virtual Status rmsnorm_backward_impl(Tensor dx, Accumulate dx_mode, Tensor dweight,
                                       ConstTensor dout, ConstTensor x, ConstTensor weight,
                                       const float* rstd, std::int64_t rows, std::int64_t dim,
                                       gpu::Stream& stream) = 0;
  // inverse: the backward's rotation by -angle.
  virtual Status rope_impl(Tensor x, const float* inv_freq, std::int64_t batch, std::int64_t seq,
                           std::int64_t heads, std::int64_t head_dim, std::int64_t row_stride,
                           std::int64_t pos_offset, bool inverse, gpu::Stream& stream) = 0;
  virtual Status swiglu_forward_impl(Tensor out, ConstTensor gate, ConstTensor up,
                                     std::int64_t rows, std::int64_t dim, std::int64_t in_stride,
                                     gpu::Stream& stream) = 0;
  virtual Status swiglu_backward_impl(Tensor dgate, Tensor dup, ConstTensor dout,
                                      ConstTensor gate, ConstTensor up, std::int64_t rows,
                                      std::int64_t dim, std::int64_t in_stride,
                                      gpu::Stream& stream) = 0;
  virtual Status gqa_attention_forward_impl(Tensor out, float* lse, ConstTensor q, ConstTensor k,
                                            ConstTensor v, std::int64_t batch, std::int64_t q_len,
                                            std::int64_t kv_len, std::int64_t q_heads,
                                            std::int64_t kv_heads, std::int64_t head_dim,
                                            std::int64_t q_stride, std::int64_t kv_stride,
                                            float scale, gpu::Stream& stream) = 0;
  virtual Status gqa_attention_backward_impl(
      Tensor dq, Tensor dk, Tensor dv, Accumulate d_mode, float* delta, ConstTensor dout,
      ConstTensor q, ConstTensor k, ConstTensor v, ConstTensor out, const float* lse,
      std::int64_t batch, std::int64_t seq, std::int64_t q_heads, std::int64_t kv_heads,
      std::int64_t head_dim, std::int64_t q_stride, std::int64_t kv_stride, float scale,
      gpu::Stream& stream) = 0;

 private:
  // Every argument check of the public methods, written once for both backends (ops.cc).
  Status check_stream(gpu::Stream& stream);
};

}  // namespace tz::ops
