// The fixture of the CPU backend's unit tests (ops_test.cc for GPT-2's ops, llama_ops_test.cc for
// the Llama family's): a HostDevice, the Ops on it with two threads, the test's device arrays, a
// seeded generator that prints its seed, and the storage dtypes every op runs in.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gpu/host_device.h"
#include "ops/ops.h"
#include "ops_harness.h"

namespace tz::ops::testing {

// Activations' and parameters' storage dtypes of one instantiation.
struct Dtypes {
  DType act;
  DType param;
};
inline std::string dtypes_name(const ::testing::TestParamInfo<Dtypes>& info) {
  return std::string(dtype_name(info.param.act)) + "_" + std::string(dtype_name(info.param.param));
}
// fp32 throughout, bf16 parameters on fp32 activations, bf16 and fp16 throughout.
inline std::vector<Dtypes> storage_dtypes() {
  return {{DType::kF32, DType::kF32},
          {DType::kF32, DType::kBF16},
          {DType::kBF16, DType::kBF16},
          {DType::kF16, DType::kF16}};
}

class OpsCpuFixture : public ::testing::TestWithParam<Dtypes> {
 protected:
  // Each file's seeds start at its own base, so their streams differ.
  explicit OpsCpuFixture(std::uint64_t seed_base) : seed_base_(seed_base) {}

  void SetUp() override {
    auto d = gpu::HostDevice::create(1ull << 30);
    ASSERT_TRUE(d.is_ok());
    device_ = std::move(*d);
    auto o = Ops::create(*device_, OpsOptions{2});
    ASSERT_TRUE(o.is_ok()) << o.status().message();
    ops_ = std::move(*o);
    arrays_ = std::make_unique<DeviceArrays>(*device_, stream());
  }
  void TearDown() override {
    if (device_) {
      EXPECT_TRUE(device_->synchronize().is_ok());
    }
    arrays_.reset();
    ops_.reset();
  }
  gpu::Stream& stream() { return device_->compute_stream(); }
  std::mt19937_64 rng(std::uint64_t salt) {
    const std::uint64_t seed = seed_base_ + salt;
    std::cout << "[ seed ] " << seed << "\n";
    return std::mt19937_64(seed);
  }
  DType act() const { return GetParam().act; }
  DType param() const { return GetParam().param; }

  std::unique_ptr<gpu::HostDevice> device_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<DeviceArrays> arrays_;

 private:
  std::uint64_t seed_base_;
};

}  // namespace tz::ops::testing
