// Per-element math of the device's typed operations (fill, cast, scale, sum of squares), written
// once as TZ_HOST_DEVICE functions: HostDevice's loops and the CUDA kernels both call these, so
// the CPU tests of HostDevice test the kernels' math too. Arithmetic is fp32 (fp64 for the sum of
// squares); 16-bit results round to nearest even (core/dtype.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/host_device.h"

namespace tz::gpu {

// True for +-Inf and NaN (exponent bits all ones), without <cmath>, so it is the same on host and
// device and unaffected by -ffast-math.
TZ_HOST_DEVICE inline bool is_nonfinite(float x) {
  return (f32_bits(x) & 0x7f800000u) == 0x7f800000u;
}

template <typename T>
struct FillOp {
  T value;
  TZ_HOST_DEVICE explicit FillOp(float v) : value(from_f32<T>(v)) {}
  TZ_HOST_DEVICE void operator()(T* dst, std::size_t i) const { dst[i] = value; }
};

template <typename Src, typename Dst>
struct CastOp {
  TZ_HOST_DEVICE void operator()(const Src* src, Dst* dst, std::size_t i) const {
    dst[i] = from_f32<Dst>(to_f32(src[i]));
  }
};

template <typename T>
struct ScaleOp {
  float factor;
  TZ_HOST_DEVICE void operator()(T* data, std::size_t i) const {
    data[i] = from_f32<T>(to_f32(data[i]) * factor);
  }
};

// Adds element i's square to `sum` (fp64) when it is finite, otherwise counts it.
template <typename T>
struct SumSquaresOp {
  TZ_HOST_DEVICE void operator()(const T* src, std::size_t i, double& sum,
                                 std::uint64_t& nonfinite) const {
    const float x = to_f32(src[i]);
    if (is_nonfinite(x)) {
      ++nonfinite;
    } else {
      sum += static_cast<double>(x) * static_cast<double>(x);
    }
  }
};

// The sum of squares in one fixed order, the same on every backend and for every launch
// configuration, so a gradient norm is bit-identical run to run and between HostDevice and
// CudaDevice (fp64 addition is exact IEEE arithmetic on both; a float's square is exact in fp64):
//  1. the elements are cut into chunks of kNormChunk; in a chunk, lane l of kNormLanes adds the
//     squares of elements l, l + kNormLanes, l + 2 kNormLanes, ... in that order, then the lanes
//     are added as a tree: for s = kNormLanes/2, ..., 1, lane l += lane l + s (l < s);
//  2. the chunk sums are added the same way in one group of kNormLanes lanes (lane l takes chunk
//     sums l, l + kNormLanes, ...; then the tree), and the total is added to the accumulator.
// The CUDA backend runs one thread block per chunk and one block for step 2 (gpu/kernels.cu);
// norm_lane_tree and sum_squares_fixed_order (gpu/host_device.cc) are the host's form.
inline constexpr std::size_t kNormLanes = 256;
inline constexpr std::size_t kNormChunk = kNormLanes * 16;

// Step 1's and step 2's tree over kNormLanes lane sums; the result is lanes[0].
TZ_HOST_DEVICE inline double norm_lane_tree(double* lanes) {
  for (std::size_t s = kNormLanes / 2; s > 0; s /= 2) {
    for (std::size_t l = 0; l < s; ++l) lanes[l] += lanes[l + s];
  }
  return lanes[0];
}

struct NormAccumulator;  // gpu/device.h

// The host's form of Device::sum_squares (gpu/host_device.cc), for data in host memory, in the same
// fixed order, so its sum is bit-identical to every device's: acc.sum_squares += the sum,
// acc.nonfinite_count += the Inf/NaN count.
void sum_squares_fixed_order(const void* src, DType dtype, std::size_t n, NormAccumulator& acc);

// Calls f(T{}) with T the C++ type of `dtype` (float, bf16 or fp16).
template <typename F>
inline void dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(float{});
      return;
    case DType::kBF16:
      f(bf16{});
      return;
    case DType::kF16:
      f(fp16{});
      return;
  }
}

}  // namespace tz::gpu
