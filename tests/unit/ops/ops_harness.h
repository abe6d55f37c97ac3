// Test helpers for the kernel layer (ops/ops.h), shared by the CPU unit tests and the CUDA-vs-CPU
// GPU tests: seeded random arrays, rounding a float64 array to a storage dtype (so references see
// exactly the values the kernels see), device upload/download through the Device interface, the
// |a - r| <= atol + rtol |r| comparison, and central finite differences of a float64 function.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/assert.h"
#include "core/dtype.h"
#include "gpu/device.h"
#include "ops/ops.h"

namespace tz::ops::testing {

inline double round_to(double x, DType dt) {
  const float f = static_cast<float>(x);
  switch (dt) {
    case DType::kF32: return f;
    case DType::kBF16: return bf16_to_f32(f32_to_bf16(f));
    case DType::kF16: return fp16_to_f32(f32_to_fp16(f));
  }
  return f;
}
inline void round_to(std::vector<double>& v, DType dt) {
  for (double& x : v) x = round_to(x, dt);
}

inline std::vector<double> random_vector(std::mt19937_64& rng, std::size_t n, double lo,
                                         double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

// Device buffers of one test; everything synchronizes, so results can be read at once.
class DeviceArrays {
 public:
  DeviceArrays(gpu::Device& device, gpu::Stream& stream) : device_(device), stream_(stream) {}

  void* alloc(std::size_t bytes) {
    auto b = device_.allocate(std::max<std::size_t>(bytes, 4));
    TZ_ASSERT(b.is_ok(), "test allocation failed");
    buffers_.push_back(std::move(*b));
    return buffers_.back().data();
  }
  // `v` rounded to `dt` and copied to the device (v itself is rounded too).
  Tensor upload(std::vector<double>& v, DType dt) {
    round_to(v, dt);
    std::vector<std::uint8_t> host(v.size() * dtype_size(dt));
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float f = static_cast<float>(v[i]);
      if (dt == DType::kF32) {
        std::memcpy(host.data() + 4 * i, &f, 4);
      } else {
        const std::uint16_t bits = dt == DType::kBF16 ? f32_to_bf16(f).bits : f32_to_fp16(f).bits;
        std::memcpy(host.data() + 2 * i, &bits, 2);
      }
    }
    void* d = alloc(host.size());
    copy_in(d, host.data(), host.size());
    return Tensor{d, dt};
  }
  float* upload_f32(std::vector<double>& v) { return static_cast<float*>(upload(v, DType::kF32).data); }
  std::int32_t* upload_i32(const std::vector<std::int32_t>& v) {
    void* d = alloc(v.size() * 4);
    copy_in(d, v.data(), v.size() * 4);
    return static_cast<std::int32_t*>(d);
  }
  std::uint8_t* upload_u8(const std::vector<std::uint8_t>& v) {
    void* d = alloc(v.size());
    copy_in(d, v.data(), v.size());
    return static_cast<std::uint8_t*>(d);
  }
  Tensor zeros(std::size_t n, DType dt) {
    std::vector<double> z(n, 0.0);
    return upload(z, dt);
  }
  float* zeros_f32(std::size_t n) { return static_cast<float*>(zeros(n, DType::kF32).data); }

  // n elements of `t` as float64, after the stream's work.
  std::vector<double> download(ConstTensor t, std::size_t n) {
    std::vector<std::uint8_t> host(n * dtype_size(t.dtype));
    EXPECT_TRUE(stream_.synchronize().is_ok());
    EXPECT_TRUE(device_.copy_async(host.data(), t.data, host.size(), gpu::CopyKind::kDeviceToHost,
                                   stream_).is_ok());
    EXPECT_TRUE(stream_.synchronize().is_ok());
    std::vector<double> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (t.dtype == DType::kF32) {
        float f;
        std::memcpy(&f, host.data() + 4 * i, 4);
        out[i] = f;
      } else {
        std::uint16_t bits;
        std::memcpy(&bits, host.data() + 2 * i, 2);
        out[i] = t.dtype == DType::kBF16 ? bf16_to_f32(bf16{bits}) : fp16_to_f32(fp16{bits});
      }
    }
    return out;
  }
  std::vector<double> download_f32(const float* p, std::size_t n) {
    return download(ConstTensor(p, DType::kF32), n);
  }

 private:
  void copy_in(void* d, const void* h, std::size_t bytes) {
    EXPECT_TRUE(device_.copy_async(d, h, bytes, gpu::CopyKind::kHostToDevice, stream_).is_ok());
    EXPECT_TRUE(stream_.synchronize().is_ok());
  }
  gpu::Device& device_;
  gpu::Stream& stream_;
  std::vector<gpu::DeviceBuffer> buffers_;
};

// Tolerances of one comparison: |a - r| <= atol + rtol |r|, with atol relative to the largest
// |r| (so it scales with the data) plus a floor.
struct Tolerance {
  double rtol;
  double atol_rel;  // times max |r|
};
inline Tolerance tolerance_for(DType dt) {
  return dt == DType::kF32 ? Tolerance{1e-4, 2e-5} : Tolerance{1.6e-2, 4e-3};
}

inline void expect_close(const std::vector<double>& got, const std::vector<double>& ref,
                         Tolerance tol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double max_ref = 0;
  for (double r : ref) max_ref = std::max(max_ref, std::abs(r));
  const double atol = tol.atol_rel * max_ref + 1e-7;
  std::size_t bad = 0;
  std::size_t worst = 0;
  double worst_excess = -1;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double lim = atol + tol.rtol * std::abs(ref[i]);
    const double err = std::abs(got[i] - ref[i]);
    if (!(err <= lim)) ++bad;
    if (!(err - lim <= worst_excess)) {
      worst_excess = err - lim;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size()
                     << " elements off; worst at " << worst << ": got " << got[worst] << " want "
                     << ref[worst] << " (atol " << atol << ", rtol " << tol.rtol << ")";
}

// d f / d x[i] for every i by central differences of a float64 function (x is restored).
inline std::vector<double> finite_differences(std::vector<double>& x,
                                              const std::function<double()>& f,
                                              double h = 1e-5) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f();
    x[i] = x0 - h;
    const double fm = f();
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

inline double weighted_sum(const std::vector<double>& a, const std::vector<double>& w) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * w[i];
  return s;
}

inline std::vector<double> plus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> c(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
  return c;
}

}  // namespace tz::ops::testing
