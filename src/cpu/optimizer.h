// The CPU optimizer: one fused pass per shard that reads the gradient (fp32, bf16 or fp16),
// applies the gradient multiplier (loss unscale x clip coefficient), updates fp32 master
// parameters and optimizer states in place and optionally writes a 16-bit copy of the new
// parameters, all in the same pass. Work is split into cache-sized tiles run on a pinned oneTBB
// arena; the SIMD code is chosen at run time (cpu/simd.h). The per-element math lives in
// cpu/optimizer_math.h, shared with the GPU kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"
#include "core/dtype.h"
#include "core/status.h"
#include "cpu/optimizer_math.h"

namespace tz::cpu {

using optim::OptimizerKind;

std::string_view optimizer_kind_name(OptimizerKind kind);

// Hyperparameters. Fields that an optimizer does not use are ignored.
struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kAdam;
  double lr = 1e-3;
  double beta1 = 0.9;    // Adam, Lion
  double beta2 = 0.999;  // Adam, Lion (Lion's default is 0.99)
  double eps = 1e-8;     // Adam, Adagrad
  double weight_decay = 0.0;
  // Adam only: true = AdamW (decoupled decay, p *= 1 - lr*wd); false = L2 decay added to g.
  // Lion's decay is always decoupled; SGD's and Adagrad's always L2.
  bool decoupled_weight_decay = true;
  bool bias_correction = true;  // Adam
  double momentum = 0.0;        // SGD
  double dampening = 0.0;       // SGD
  bool nesterov = false;        // SGD (needs momentum > 0 and dampening == 0)
  double lr_decay = 0.0;        // Adagrad
  // Adam only: kBF16 stores m and v as bf16 (round to nearest even after each update). Halves
  // state traffic; see docs/optimizers.md for the accuracy trade-off.
  DType state_dtype = DType::kF32;

  // AdamW with PyTorch's defaults, and the other optimizers with theirs.
  static OptimizerSpec adamw(double lr = 1e-3, double weight_decay = 1e-2);
  static OptimizerSpec adam(double lr = 1e-3, double l2_weight_decay = 0.0);
  static OptimizerSpec sgd(double lr, double momentum = 0.0, bool nesterov = false);
  static OptimizerSpec lion(double lr = 1e-4, double weight_decay = 0.0);
  static OptimizerSpec adagrad(double lr = 1e-2, double lr_decay = 0.0);
};

// Maps the DeepSpeed-style `optimizer` section of the training config (and
// `tierzero.state_dtype`); unknown types come back as kInvalidArgument naming the key.
Result<OptimizerSpec> spec_from_config(const Config& config);

// Number of per-element state arrays the optimizer keeps: Adam 2 (m, v), SGD 1 when momentum
// is non-zero else 0, Lion 1 (m), Adagrad 1 (sum of squares).
int state_count(const OptimizerSpec& spec);

// Piece checksums of an array step() writes, taken while each tile's bytes are still in cache
// (the store's checksums of a block written to NVMe: store::Lease::release_hashed). The array is
// the start of a block of `block_bytes` (at least the shard's n elements; bytes past them are
// hashed as they are); sums[k] receives XXH3-64 of bytes [k * piece_bytes, min((k + 1) *
// piece_bytes, block_bytes)). piece_bytes is a positive multiple of the element size. Null sums:
// the array is not hashed.
struct PieceSums {
  std::uint64_t* sums = nullptr;
  std::size_t block_bytes = 0;
  std::size_t piece_bytes = 0;
};

// One contiguous shard of a parameter group. The caller owns every buffer; they must hold `n`
// elements, must not overlap each other, and stay valid for the duration of step(). States are
// state_dtype (fp32 unless an Adam spec says bf16) and must start zeroed (Adagrad: the initial
// accumulator value). `param_copy` may be null (no 16-bit copy). The *_sums ask step() for the
// piece checksums of what it writes (stream() and reference_step() ignore them).
struct Shard {
  float* param = nullptr;
  const void* grad = nullptr;  // StepArgs::grad_dtype
  void* state[2] = {nullptr, nullptr};
  void* param_copy = nullptr;  // StepArgs::copy_dtype
  std::size_t n = 0;
  PieceSums param_sums;
  PieceSums state_sums[2];
  PieceSums copy_sums;
};

struct StepArgs {
  std::int64_t step = 1;     // 1-based step count of this update (bias correction, SGD init)
  float grad_multiplier = 1.0f;  // applied to every gradient element: unscale x clip coefficient
  DType grad_dtype = DType::kF32;
  DType copy_dtype = DType::kBF16;  // used for shards whose param_copy is set; kBF16 or kF16
  double lr_override = -1.0;  // >= 0 replaces spec.lr for this step (schedules)
};

struct OptimizerOptions {
  int threads = 0;              // 0 = one per core of the arena's cpuset
  bool pin_threads = true;      // bind each worker to one core with hwloc
  int numa_node = -1;           // >= 0: run on that node's cores (memory is usually there)
  std::size_t tile_elems = 16384;  // elements per tile (x 28 bytes of traffic per element)
};

// Owns a pinned thread arena and the per-step scratch; move-only.
class CpuOptimizer {
 public:
  // Fails with kInvalidArgument on bad hyperparameters or options, and with the topology's error
  // when the arena cannot be created.
  static Result<CpuOptimizer> create(const OptimizerSpec& spec, const OptimizerOptions& options);

  CpuOptimizer(CpuOptimizer&&) noexcept;
  CpuOptimizer& operator=(CpuOptimizer&&) noexcept;
  ~CpuOptimizer();

  // Updates every shard in one parallel pass. Validates the arguments (kInvalidArgument names
  // the offending shard), then cannot fail. Results do not depend on the thread count or the
  // tiling: the update is element-wise. Blocking; one step at a time per optimizer (the tile
  // list is reused), so callers that overlap shards use one optimizer per pipeline stage.
  Status step(std::span<const Shard> shards, const StepArgs& args);

  // The bandwidth ceiling for benchmarks: the same tiling, threads, loads and stores as step()
  // (grad read; param and each state read and written; the copy written), with trivial math
  // (every stream += grad). Overwrites the buffers; same validation as step().
  Status stream(std::span<const Shard> shards, const StepArgs& args);

  const OptimizerSpec& spec() const;
  int threads() const;

  struct Impl;  // opaque; named here so optimizer.cc's helpers can take it

 private:
  explicit CpuOptimizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The per-step coefficients of an update (learning rate after lr_override, bias corrections,
// decay, the gradient multiplier), computed once in double and rounded to float. Every backend
// applies these same floats (the CPU kernels, HostDevice and the CUDA kernel through
// gpu::OptimizerStepArgs), which is what makes their updates bit-identical.
struct StepCoeffs {
  optim::AdamCoeffs adam{};
  optim::SgdCoeffs sgd{};
  optim::LionCoeffs lion{};
  optim::AdagradCoeffs adagrad{};
};
StepCoeffs step_coeffs(const OptimizerSpec& spec, const StepArgs& args);

// Single-threaded, non-SIMD reference of the same update (the scalar path of the functors in
// optimizer_math.h), for tests and for machines where the SIMD table is forced off. Same
// contract as CpuOptimizer::step.
Status reference_step(const OptimizerSpec& spec, std::span<const Shard> shards,
                      const StepArgs& args);

// Bytes of memory traffic one element of an update moves (reads + writes), as the bench reports.
std::size_t traffic_bytes_per_element(const OptimizerSpec& spec, DType grad_dtype,
                                      bool has_copy, DType copy_dtype);

}  // namespace tz::cpu
