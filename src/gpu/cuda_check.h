// TZ_CUDA_CHECK: the one macro around every CUDA runtime call, turning its cudaError_t into a
// Status that names the call (core/check.h). Only for files compiled with TZ_HAVE_CUDA.
#pragma once

#include <cuda_runtime.h>

#include "core/check.h"

namespace tz::gpu {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return check_cuda(static_cast<int>(err), cudaGetErrorName(err), cudaGetErrorString(err), what);
}

}  // namespace tz::gpu

// A Status for the CUDA call `call`, named by its source text.
#define TZ_CUDA_CHECK(call) ::tz::gpu::cuda_status((call), #call)
#define TZ_CUDA_RETURN_IF_ERROR(call) TZ_RETURN_IF_ERROR(TZ_CUDA_CHECK(call))
