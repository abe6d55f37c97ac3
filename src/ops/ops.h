// The model's kernels behind one interface (DESIGN.md, "ops/"): forward and backward of the token
// and position embedding, layernorm, matmul with bias, causal self-attention, gelu, residual add and
// the fused softmax + cross-entropy. Two backends, chosen by the device's kind: the CPU backend
// (kHost: BLAS for the matmuls, Highway + oneTBB for the rest) and the CUDA backend (kCuda: cuBLAS,
// .cu kernels). The per-element math both share is ops/ops_math.h.
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
//   kInvalidArgument naming the op and the argument, and nothing is enqueued. Once enqueued an op
//   cannot fail on the CPU backend; the CUDA backend returns kDeviceError when a launch fails.
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
  // wpe: param (>= seq, embd) (only its first seq rows are read).
  virtual Status embedding_forward(Tensor out, const std::int32_t* tokens, ConstTensor wte,
                                   ConstTensor wpe, std::int64_t batch, std::int64_t seq,
                                   std::int64_t embd, std::int64_t vocab, gpu::Stream& stream) = 0;
  // dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum over b of dout[b,t,:]. Either gradient
  // may be null (not wanted). Deterministic: the same inputs give the same bits (no atomics).
  virtual Status embedding_backward(Tensor dwte, Tensor dwpe, ConstTensor dout,
                                    const std::int32_t* tokens, std::int64_t batch,
                                    std::int64_t seq, std::int64_t embd, std::int64_t vocab,
                                    gpu::Stream& stream) = 0;

  // --- LayerNorm (eps 1e-5, biased variance, as torch.nn.LayerNorm) -------------------------
  // out = (x - mean) * rstd * weight + bias, per row. out, x: act (rows, dim); weight, bias:
  // param (dim); mean, rstd: fp32 (rows), written (saved for backward). out may not alias x.
  virtual Status layernorm_forward(Tensor out, float* mean, float* rstd, ConstTensor x,
                                   ConstTensor weight, ConstTensor bias, std::int64_t rows,
                                   std::int64_t dim, gpu::Stream& stream) = 0;
  // From the forward's x, mean and rstd: dx (overwrite or add), dweight += , dbias += .
  // dweight or dbias may be null; dx may not alias dout.
  virtual Status layernorm_backward(Tensor dx, Accumulate dx_mode, Tensor dweight, Tensor dbias,
                                    ConstTensor dout, ConstTensor x, ConstTensor weight,
                                    const float* mean, const float* rstd, std::int64_t rows,
                                    std::int64_t dim, gpu::Stream& stream) = 0;

  // --- Matmul with bias -----------------------------------------------------------------------
  // out = x W + b. out: act (rows, out_dim); x: act (rows, in_dim); weight: param (in_dim, out_dim)
  // for kInOut or (out_dim, in_dim) for kOutIn; bias: param (out_dim) or null (no bias).
  virtual Status matmul_forward(Tensor out, ConstTensor x, ConstTensor weight, WeightLayout layout,
                                ConstTensor bias, std::int64_t rows, std::int64_t in_dim,
                                std::int64_t out_dim, gpu::Stream& stream) = 0;
  // dx = dout W^T (overwrite or add; null: not wanted), dweight += x^T dout (in the weight's own
  // layout; null: not wanted), dbias += column sums of dout (null: not wanted).
  virtual Status matmul_backward(Tensor dx, Accumulate dx_mode, Tensor dweight, Tensor dbias,
                                 ConstTensor dout, ConstTensor x, ConstTensor weight,
                                 WeightLayout layout, std::int64_t rows, std::int64_t in_dim,
                                 std::int64_t out_dim, gpu::Stream& stream) = 0;

  // --- Causal self-attention over fused qkv ---------------------------------------------------
  // qkv: act (batch, seq, 3*embd), each row [q | k | v], each of those split into `heads` heads of
  // head_dim = embd / heads (HF GPT-2's split). out: act (batch, seq, embd), heads concatenated:
  // out_h[t] = sum_{s<=t} softmax_s(q_h[t].k_h[s] / sqrt(head_dim)) v_h[s].
  // lse: fp32 (batch, heads, seq), written: the log-sum-exp of each row's scaled scores, saved for
  // backward. Blocked online softmax: memory beyond the tensors is O(block * head_dim) per thread,
  // never seq x seq. embd % heads must be 0.
  virtual Status attention_forward(Tensor out, float* lse, ConstTensor qkv, std::int64_t batch,
                                   std::int64_t seq, std::int64_t embd, std::int64_t heads,
                                   gpu::Stream& stream) = 0;
  // dqkv: act (batch, seq, 3*embd), overwrite or add. From the forward's qkv, out and lse and the
  // gradient dout of out. delta: fp32 scratch (batch, heads, seq), overwritten (rowsum(dout*out)).
  virtual Status attention_backward(Tensor dqkv, Accumulate dqkv_mode, float* delta,
                                    ConstTensor dout, ConstTensor qkv, ConstTensor out,
                                    const float* lse, std::int64_t batch, std::int64_t seq,
                                    std::int64_t embd, std::int64_t heads, gpu::Stream& stream) = 0;

  // --- GELU, tanh approximation (HF "gelu_new") -----------------------------------------------
  // out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), n elements of act. out may alias x.
  virtual Status gelu_forward(Tensor out, ConstTensor x, std::int64_t n, gpu::Stream& stream) = 0;
  // dx = dout * gelu'(x) (overwrite or add). dx may alias dout when dx_mode is kOverwrite.
  virtual Status gelu_backward(Tensor dx, Accumulate dx_mode, ConstTensor dout, ConstTensor x,
                               std::int64_t n, gpu::Stream& stream) = 0;

  // --- Residual add ----------------------------------------------------------------------------
  // out = a + b, n elements of act. out may alias a or b.
  virtual Status residual_forward(Tensor out, ConstTensor a, ConstTensor b, std::int64_t n,
                                  gpu::Stream& stream) = 0;
  // The gradient of a + b reaches both: da and db each receive dout (overwrite or add, each by
  // its mode); either may be null; neither may alias dout. (The skip path of a pre-LN block needs
  // no call: the residual stream's gradient already is dout.)
  virtual Status residual_backward(Tensor da, Accumulate da_mode, Tensor db, Accumulate db_mode,
                                   ConstTensor dout, std::int64_t n, gpu::Stream& stream) = 0;

  // --- Fused softmax + cross-entropy ----------------------------------------------------------
  // losses[i] = logsumexp(logits[i,:]) - logits[i, targets[i]] for i < rows. logits: act
  // (rows, vocab); targets: int32 (rows); losses: fp32 (rows), written. The mean loss is the sum
  // of losses over the positions divided by their count (the caller's reduction).
  virtual Status cross_entropy_forward(float* losses, ConstTensor logits,
                                       const std::int32_t* targets, std::int64_t rows,
                                       std::int64_t vocab, gpu::Stream& stream) = 0;
  // dlogits[i,:] = (softmax(logits[i,:]) - onehot(targets[i])) * grad_scale, with grad_scale =
  // dloss / N for a mean over N positions (times the loss scale under fp16). One pass over each
  // row's logits; dlogits may alias logits (in place, so only one micro-batch's logits ever
  // exist). losses: as the forward's, written in the same pass when non-null (the fused path).
  virtual Status cross_entropy_backward(Tensor dlogits, float* losses, ConstTensor logits,
                                        const std::int32_t* targets, std::int64_t rows,
                                        std::int64_t vocab, float grad_scale,
                                        gpu::Stream& stream) = 0;

  // --- The same-run ceiling of `tierzero bench ops` ------------------------------------------
  // The backend's GEMM alone, C (m, n) = A (m, k) B (k, n), row-major, fp32 accumulation: oneDNN
  // sgemm on the CPU (always fp32 there: the CPU backend widens 16-bit tensors; ops/gemm.h),
  // cublasGemmEx with `dtype` storage on CUDA. Operands are allocated here and filled with a
  // constant; one warm-up, then the median seconds of `repeats` runs. Synchronizes `stream`.
  // kOutOfMemory when the operands do not fit; kInvalidArgument for a size <= 0 or repeats < 1.
  virtual Result<double> gemm_seconds(std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                                      int repeats, gpu::Stream& stream) = 0;

 protected:
  Ops() = default;
};

}  // namespace tz::ops
