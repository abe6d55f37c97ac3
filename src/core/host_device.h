// TZ_HOST_DEVICE marks functions compiled for both the CPU and, under nvcc, the GPU, so that
// element-wise math shared by CPU code and CUDA kernels is written and tested once.
#pragma once

#if defined(__CUDACC__)
#define TZ_HOST_DEVICE __host__ __device__
#else
#define TZ_HOST_DEVICE
#endif
