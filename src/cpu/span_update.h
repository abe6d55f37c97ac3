// One optimizer update of a contiguous fp32 span with the CPU optimizer's SIMD kernels, for
// callers outside cpu/: HostDevice's device optimizer step (gpu/host_device.cc), which otherwise
// looped over optimizer_math.h's scalar functors. The kernels give those functors' bits (the
// SIMD-vs-reference tests), so the span's result is the scalar loop's and the CUDA kernel's.
#pragma once

#include <cstddef>

#include "core/dtype.h"
#include "cpu/optimizer_math.h"

namespace tz::cpu {

// `n` elements from each pointer; they must not overlap. The coefficient struct of `kind` is
// used. States are fp32: Adam m and v; SGD the momentum buffer (only with momentum); Lion m;
// Adagrad the sum of squares; unused entries may be null. `param_copy`, when not null, receives
// the new parameters in copy_dtype (bf16 or fp16). gpu::OptimizerStepArgs is this struct.
struct SpanUpdate {
  optim::OptimizerKind kind = optim::OptimizerKind::kAdam;
  optim::AdamCoeffs adam{};
  optim::SgdCoeffs sgd{};
  optim::LionCoeffs lion{};
  optim::AdagradCoeffs adagrad{};
  float* param = nullptr;  // fp32 master parameters, updated in place
  const void* grad = nullptr;
  DType grad_dtype = DType::kF32;
  float* state[2] = {nullptr, nullptr};
  void* param_copy = nullptr;
  DType copy_dtype = DType::kBF16;
  std::size_t n = 0;
};

// Updates the span on the calling thread with the active SIMD table (cpu/simd.h).
void update_span(const SpanUpdate& u);

}  // namespace tz::cpu
