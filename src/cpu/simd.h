// Which SIMD code the CPU optimizers run. The kernels are compiled for several Highway targets
// in one binary (EMU128 scalar baseline, SSE4, AVX2, AVX3 = AVX-512 F/VL/DQ/BW) and the best
// one the CPU supports is chosen at run time; `tierzero info` reports both lists.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace tz::cpu {

// Highway target names this CPU supports (all that Highway knows, whether compiled in or not),
// best first, e.g. {"AVX3_DL", "AVX3", "AVX2", "SSE4", "SSSE3", "EMU128"}.
std::vector<std::string> simd_targets_supported();
// Targets the optimizer kernels were compiled for, best first, plus "reference" (scalar loops).
std::vector<std::string> simd_targets_compiled();
// The target the optimizer dispatch uses now: the best compiled target the CPU supports, or the
// one forced with set_simd_target.
std::string simd_dispatch_target();
// Forces the optimizer kernels to `name` (a compiled target the CPU supports, or "reference");
// "auto" or "" restores the automatic choice. kInvalidArgument names the accepted values.
// Process-wide; meant for tests, benchmarks and `--simd` flags, not for use while steps run.
Status set_simd_target(std::string_view name);

// Round-to-nearest-even conversions with the active SIMD target, bit-identical to
// core/dtype.h's f32_to_bf16 / f32_to_fp16 (NaN stays NaN, fp16 subnormals, overflow to Inf).
// `out_dtype` / `in_dtype` must be kBF16 or kF16.
void convert_f32_to_16(const float* in, void* out, DType out_dtype, std::size_t n);
void convert_16_to_f32(const void* in, DType in_dtype, float* out, std::size_t n);

}  // namespace tz::cpu
