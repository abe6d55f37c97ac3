// Internal to cpu/: the table of tile kernels one SIMD target (or the scalar reference)
// provides, the per-step arguments they take, and the dtype dispatch shared by all tables. The
// optimizer splits a step into tiles and calls the active table's `update` on runs of them.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "cpu/optimizer_math.h"

namespace tz::cpu::detail {

// One tile: `n` consecutive elements of one shard. Null state/copy pointers mean "absent".
struct Tile {
  float* param = nullptr;
  const void* grad = nullptr;
  void* state[2] = {nullptr, nullptr};
  void* copy = nullptr;
  std::size_t n = 0;
};

// Uniform over a step: which update, the element types and the coefficients.
struct StepKernel {
  optim::OptimizerKind kind = optim::OptimizerKind::kAdam;
  DType grad_dtype = DType::kF32;
  DType state_dtype = DType::kF32;
  DType copy_dtype = DType::kBF16;
  optim::AdamCoeffs adam;
  optim::SgdCoeffs sgd;
  optim::LionCoeffs lion;
  optim::AdagradCoeffs adagrad;
};

// The bandwidth ceiling: a kernel with the same loads and stores as an update (the grad, each
// present state read and written, param read and written, the copy written) and trivial math.
struct StreamKernel {
  DType grad_dtype = DType::kF32;
  DType state_dtype = DType::kF32;
  DType copy_dtype = DType::kBF16;
};

struct KernelTable {
  const char* name = "";  // Highway target name ("AVX3", "AVX2", ...) or "reference"
  // Update (or stream) `count` consecutive tiles; one call per run of tiles amortizes the dtype
  // dispatch and the coefficient setup over many small tensors.
  void (*update)(const StepKernel& k, const Tile* tiles, std::size_t count) = nullptr;
  void (*stream)(const StreamKernel& k, const Tile* tiles, std::size_t count) = nullptr;
  // Round-to-nearest-even conversions, bit-identical to core/dtype.h's.
  void (*f32_to_16)(const float* in, void* out, DType out_dtype, std::size_t n) = nullptr;
  void (*from_16)(const void* in, DType in_dtype, float* out, std::size_t n) = nullptr;
};

// The scalar reference table (optimizer_scalar.cc).
const KernelTable& reference_kernels();
// Highway tables compiled into this binary that the CPU supports, best first (simd.cc).
std::vector<const KernelTable*> supported_simd_kernels();
// The table steps use: the forced one (simd.h, set_simd_target) or the best supported.
const KernelTable& active_kernels();

// Marker for "no 16-bit copy" in the typed dispatch below.
struct NoCopy {};

// Calls f(GradT{}) with the C++ type of `t`.
template <class F>
inline void with_value_type(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f(float{}); return;
    case DType::kBF16: f(bf16{}); return;
    case DType::kF16: f(fp16{}); return;
  }
}

// Calls f(CopyT{}) with NoCopy when `copy` is null, else the 16-bit type of `t`.
template <class F>
inline void with_copy_type(const void* copy, DType t, F&& f) {
  if (copy == nullptr) {
    f(NoCopy{});
  } else if (t == DType::kF16) {
    f(fp16{});
  } else {
    f(bf16{});
  }
}

}  // namespace tz::cpu::detail
