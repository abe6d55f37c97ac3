// Launchers of the CUDA kernels behind CudaDevice's typed operations (kernels.cu). Plain C++
// declarations, so cuda_device.cc (host code, g++) calls them without CUDA headers. Each enqueues
// one kernel on `stream` (a cudaStream_t) and returns the cudaError_t of cudaGetLastError after the
// launch (0 on success); n == 0 launches nothing. The per-element math is gpu/elementwise.h.
#pragma once

#include <cstddef>

#include "core/dtype.h"
#include "gpu/device.h"
#include "gpu/elementwise.h"

namespace tz::gpu::kernels {

int fill(void* dst, DType dtype, std::size_t n, float value, void* stream);
int cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
         void* stream);
int scale(void* data, DType dtype, std::size_t n, float factor, void* stream);
// Bytes of device scratch sum_squares needs for n elements: one fp64 sum and one count per chunk
// of gpu/elementwise.h's fixed order.
inline std::size_t sum_squares_scratch_bytes(std::size_t n) {
  return (n + kNormChunk - 1) / kNormChunk * (sizeof(double) + sizeof(unsigned long long));
}
// `scratch` holds sum_squares_scratch_bytes(n) bytes of device memory, free for this call's use
// until the stream has run it.
int sum_squares(const void* src, DType dtype, std::size_t n, NormAccumulator* acc, void* scratch,
                void* stream);
int optimizer_step(const OptimizerStepArgs& args, void* stream);

}  // namespace tz::gpu::kernels
