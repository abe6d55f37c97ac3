// The device optimizer step on HostDevice: bit-identical to cpu/optimizer_math.h's functors
// (shared conformance check), and close to an independent float64 Adam / SGD reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "device_conformance.h"
#include "gpu/host_device.h"

namespace tz::gpu {
namespace {

std::unique_ptr<HostDevice> make_device() { return std::move(HostDevice::create(64ull << 20).value()); }

TEST(HostDeviceOptimizer, MatchesSharedFunctorsBitForBit) {
  testing::check_optimizer_step_matches_shared_functors(*make_device());
}

// Shards of several 64Ki-element chunks, the last one ragged: HostDevice splits them over the
// stream thread's OpenMP team, and the bits stay the functors'.
TEST(HostDeviceOptimizer, ChunkedOverThreadsMatchesSharedFunctorsBitForBit) {
  testing::check_optimizer_step_matches_shared_functors(*make_device(), 3 * 65536 + 7);
}

// AdamW for 10 steps against float64 math written from the paper (Loshchilov & Hutter).
TEST(HostDeviceOptimizer, AdamWTracksFloat64Reference) {
  auto device = make_device();
  const std::size_t n = 1000;
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  std::mt19937 rng(testing::test_seed() + 11);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> p64(n), m64(n, 0), v64(n, 0);
  std::vector<float> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<float>(p64[i] = normal(rng));
  for (std::size_t i = 0; i < n; ++i) p64[i] = p[i];
  auto dp = device->allocate(n * 4), dg = device->allocate(n * 4), dm = device->allocate(n * 4),
       dv = device->allocate(n * 4);
  ASSERT_TRUE(dp.is_ok() && dg.is_ok() && dm.is_ok() && dv.is_ok());
  std::copy(p.begin(), p.end(), dp->as<float>());
  std::fill_n(dm->as<float>(), n, 0.0f);
  std::fill_n(dv->as<float>(), n, 0.0f);
  for (int t = 1; t <= 10; ++t) {
    std::vector<float> g(n);
    for (auto& x : g) x = static_cast<float>(normal(rng) * 0.1);
    std::copy(g.begin(), g.end(), dg->as<float>());
    OptimizerStepArgs a;
    a.kind = optim::OptimizerKind::kAdam;
    a.adam.beta1 = static_cast<float>(b1);
    a.adam.one_minus_beta1 = static_cast<float>(1 - b1);
    a.adam.beta2 = static_cast<float>(b2);
    a.adam.one_minus_beta2 = static_cast<float>(1 - b2);
    a.adam.eps = static_cast<float>(eps);
    a.adam.step_size = static_cast<float>(lr / (1 - std::pow(b1, t)));
    a.adam.sqrt_bias_correction2 = static_cast<float>(std::sqrt(1 - std::pow(b2, t)));
    a.adam.param_scale = static_cast<float>(1 - lr * wd);
    a.param = dp->as<float>();
    a.grad = dg->data();
    a.state[0] = dm->as<float>();
    a.state[1] = dv->as<float>();
    a.n = n;
    ASSERT_TRUE(device->optimizer_step(a, device->compute_stream()).is_ok());
    ASSERT_TRUE(device->compute_stream().synchronize().is_ok());
    for (std::size_t i = 0; i < n; ++i) {
      const double gi = g[i];
      m64[i] = b1 * m64[i] + (1 - b1) * gi;
      v64[i] = b2 * v64[i] + (1 - b2) * gi * gi;
      const double mhat = m64[i] / (1 - std::pow(b1, t));
      const double vhat = v64[i] / (1 - std::pow(b2, t));
      p64[i] = p64[i] * (1 - lr * wd) - lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(dp->as<float>()[i], p64[i], 1e-5 + 1e-5 * std::fabs(p64[i]))
        << "i=" << i << " seed " << testing::test_seed();
  }
}

// The CUDA kernel's per-element loop (optimizer_element) against HostDevice's SIMD span update,
// bit for bit, for each optimizer with a bf16 copy and Inf/NaN gradients among normal ones: the
// CPU tests keep checking the code the GPU runs.
TEST(HostDeviceOptimizer, ElementLoopMatchesTheSpanUpdate) {
  auto device = make_device();
  const std::size_t n = 2 * 65536 + 333;
  std::mt19937 rng(testing::test_seed() + 29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto kind : {optim::OptimizerKind::kAdam, optim::OptimizerKind::kSgd,
                    optim::OptimizerKind::kLion, optim::OptimizerKind::kAdagrad}) {
    SCOPED_TRACE(static_cast<int>(kind));
    std::vector<float> p(n), g(n), s0(n), s1(n);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = normal(rng);
      g[i] = i % 997 == 3 ? std::numeric_limits<float>::infinity()
             : i % 991 == 5 ? std::numeric_limits<float>::quiet_NaN()
                            : normal(rng) * 0.1f;
      s0[i] = normal(rng) * 0.01f;
      s1[i] = std::fabs(normal(rng)) * 1e-4f;
    }
    OptimizerStepArgs a;
    a.kind = kind;
    a.adam.sqrt_bias_correction2 = 0.0316f;
    a.adam.step_size = 1e-3f;
    a.adam.param_scale = 0.9999f;
    a.sgd.momentum = 0.9f;
    a.sgd.first_step = false;
    a.lion.param_scale = 0.999f;
    a.copy_dtype = DType::kBF16;
    a.n = n;
    // The element loop on host vectors.
    std::vector<float> ep = p, es0 = s0, es1 = s1;
    std::vector<std::uint16_t> ecopy(n);
    OptimizerStepArgs e = a;
    e.param = ep.data();
    e.grad = g.data();
    e.state[0] = es0.data();
    e.state[1] = es1.data();
    e.param_copy = ecopy.data();
    for (std::size_t i = 0; i < n; ++i) optimizer_element<float, bf16>(e, i);
    // HostDevice on device buffers.
    auto dp = device->allocate(n * 4), dg = device->allocate(n * 4), d0 = device->allocate(n * 4),
         d1 = device->allocate(n * 4), dc = device->allocate(n * 2);
    ASSERT_TRUE(dp.is_ok() && dg.is_ok() && d0.is_ok() && d1.is_ok() && dc.is_ok());
    std::copy(p.begin(), p.end(), dp->as<float>());
    std::copy(g.begin(), g.end(), dg->as<float>());
    std::copy(s0.begin(), s0.end(), d0->as<float>());
    std::copy(s1.begin(), s1.end(), d1->as<float>());
    a.param = dp->as<float>();
    a.grad = dg->data();
    a.state[0] = d0->as<float>();
    a.state[1] = d1->as<float>();
    a.param_copy = dc->data();
    ASSERT_TRUE(device->optimizer_step(a, device->compute_stream()).is_ok());
    ASSERT_TRUE(device->compute_stream().synchronize().is_ok());
    EXPECT_EQ(0, std::memcmp(ep.data(), dp->data(), n * 4)) << "param";
    EXPECT_EQ(0, std::memcmp(es0.data(), d0->data(), n * 4)) << "state 0";
    if (kind == optim::OptimizerKind::kAdam) {
      EXPECT_EQ(0, std::memcmp(es1.data(), d1->data(), n * 4)) << "state 1";
    }
    EXPECT_EQ(0, std::memcmp(ecopy.data(), dc->data(), n * 2)) << "copy";
  }
}

// A parameter copy must be 16-bit: an fp32 one would be the parameters themselves, and the SIMD
// kernels write only bf16 or fp16.
TEST(HostDeviceOptimizer, RejectsAnFp32Copy) {
  auto device = make_device();
  auto dp = device->allocate(64 * 4), dg = device->allocate(64 * 4), dm = device->allocate(64 * 4),
       dv = device->allocate(64 * 4), dc = device->allocate(64 * 4);
  ASSERT_TRUE(dp.is_ok() && dg.is_ok() && dm.is_ok() && dv.is_ok() && dc.is_ok());
  OptimizerStepArgs a;
  a.param = dp->as<float>();
  a.grad = dg->data();
  a.state[0] = dm->as<float>();
  a.state[1] = dv->as<float>();
  a.param_copy = dc->data();
  a.copy_dtype = DType::kF32;
  a.n = 64;
  const Status st = device->optimizer_step(a, device->compute_stream());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.message();
  a.copy_dtype = DType::kF16;
  EXPECT_TRUE(device->optimizer_step(a, device->compute_stream()).is_ok());
  EXPECT_TRUE(device->compute_stream().synchronize().is_ok());
}

}  // namespace
}  // namespace tz::gpu
