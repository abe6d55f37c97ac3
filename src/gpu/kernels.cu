// CUDA kernels of CudaDevice's typed operations: grid-stride loops over the per-element functors
// of gpu/elementwise.h (shared with HostDevice, so the CPU tests cover their math), and the sum of
// squares in the fixed order of gpu/elementwise.h (per-chunk blocks, then one block over the chunk
// sums; no atomics, so it is bit-identical to HostDevice's and from run to run). Built for sm_80 and sm_90 (CMAKE_CUDA_ARCHITECTURES).
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/cuda_kernels.h"
#include "gpu/elementwise.h"

namespace tz::gpu::kernels {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

unsigned grid_for(std::size_t n) {
  std::size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks);
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

template <typename T>
__global__ void fill_kernel(T* dst, std::size_t n, FillOp<T> op) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    op(dst, i);
  }
}

template <typename S, typename D>
__global__ void cast_kernel(const S* src, D* dst, std::size_t n) {
  const CastOp<S, D> op;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    op(src, dst, i);
  }
}

template <typename T>
__global__ void scale_kernel(T* data, std::size_t n, ScaleOp<T> op) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    op(data, i);
  }
}

// Step 1 of the fixed-order sum of squares (gpu/elementwise.h): block b sums chunk b, thread l
// being lane l, and writes the chunk's sum and Inf/NaN count to partials[b] / counts[b].
template <typename T>
__global__ void chunk_sum_squares_kernel(const T* src, std::size_t n, double* partials,
                                         unsigned long long* counts) {
  static_assert(kThreads == kNormLanes, "one thread per lane");
  __shared__ double lanes[kNormLanes];
  __shared__ unsigned long long bad[kNormLanes];
  const SumSquaresOp<T> op;
  const std::size_t begin = blockIdx.x * kNormChunk;
  double sum = 0;
  std::uint64_t nonfinite = 0;
  for (std::size_t j = 0; j < kNormChunk / kNormLanes; ++j) {
    const std::size_t i = begin + threadIdx.x + j * kNormLanes;
    if (i < n) op(src, i, sum, nonfinite);
  }
  lanes[threadIdx.x] = sum;
  bad[threadIdx.x] = nonfinite;
  __syncthreads();
  for (unsigned s = kNormLanes / 2; s > 0; s /= 2) {  // norm_lane_tree, one addition per thread
    if (threadIdx.x < s) {
      lanes[threadIdx.x] += lanes[threadIdx.x + s];
      bad[threadIdx.x] += bad[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = lanes[0];
    counts[blockIdx.x] = bad[0];
  }
}

// Step 2: one block adds the `chunks` chunk sums (lane l takes l, l + kNormLanes, ...; then the
// tree) and adds the total to the accumulator. No atomics: the order is fixed.
__global__ void total_sum_squares_kernel(const double* partials, const unsigned long long* counts,
                                         std::size_t chunks, NormAccumulator* acc) {
  __shared__ double lanes[kNormLanes];
  __shared__ unsigned long long bad[kNormLanes];
  double sum = 0;
  unsigned long long nonfinite = 0;
  for (std::size_t c = threadIdx.x; c < chunks; c += kNormLanes) {
    sum += partials[c];
    nonfinite += counts[c];
  }
  lanes[threadIdx.x] = sum;
  bad[threadIdx.x] = nonfinite;
  __syncthreads();
  for (unsigned s = kNormLanes / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      lanes[threadIdx.x] += lanes[threadIdx.x + s];
      bad[threadIdx.x] += bad[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    acc->sum_squares += lanes[0];
    acc->nonfinite_count += bad[0];
  }
}

template <typename G, typename C>
__global__ void optimizer_step_kernel(OptimizerStepArgs args) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < args.n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    optimizer_element<G, C>(args, i);
  }
}

}  // namespace

int fill(void* dst, DType dtype, std::size_t n, float value, void* stream) {
  if (n == 0) return 0;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    fill_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(static_cast<T*>(dst), n,
                                                                     FillOp<T>(value));
  });
  return static_cast<int>(cudaGetLastError());
}

int cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
         void* stream) {
  if (n == 0) return 0;
  dispatch_dtype(src_dtype, [&](auto src_tag) {
    dispatch_dtype(dst_dtype, [&](auto dst_tag) {
      using S = decltype(src_tag);
      using D = decltype(dst_tag);
      cast_kernel<S, D><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
          static_cast<const S*>(src), static_cast<D*>(dst), n);
    });
  });
  return static_cast<int>(cudaGetLastError());
}

int scale(void* data, DType dtype, std::size_t n, float factor, void* stream) {
  if (n == 0) return 0;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(static_cast<T*>(data), n,
                                                                      ScaleOp<T>{factor});
  });
  return static_cast<int>(cudaGetLastError());
}

int sum_squares(const void* src, DType dtype, std::size_t n, NormAccumulator* acc, void* scratch,
                void* stream) {
  if (n == 0) return 0;
  const std::size_t chunks = (n + kNormChunk - 1) / kNormChunk;
  auto* partials = static_cast<double*>(scratch);
  auto* counts = reinterpret_cast<unsigned long long*>(partials + chunks);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    chunk_sum_squares_kernel<T><<<static_cast<unsigned>(chunks), kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(src), n, partials, counts);
  });
  total_sum_squares_kernel<<<1, kThreads, 0, as_stream(stream)>>>(partials, counts, chunks, acc);
  return static_cast<int>(cudaGetLastError());
}

int optimizer_step(const OptimizerStepArgs& args, void* stream) {
  if (args.n == 0) return 0;
  dispatch_dtype(args.grad_dtype, [&](auto grad_tag) {
    dispatch_dtype(args.param_copy != nullptr ? args.copy_dtype : DType::kF32, [&](auto copy_tag) {
      using G = decltype(grad_tag);
      using C = decltype(copy_tag);
      optimizer_step_kernel<G, C><<<grid_for(args.n), kThreads, 0, as_stream(stream)>>>(args);
    });
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace tz::gpu::kernels
