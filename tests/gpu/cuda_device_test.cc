// CudaDevice on a real GPU: the Device conformance checks (budget, copies, typed kernels against
// references, the optimizer kernel bit-for-bit against cpu/optimizer_math.h, event ordering).
// Skips with the reason when no GPU can be used.
#include <gtest/gtest.h>

#include <cstring>

#if TZ_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "device_conformance.h"
#include "gpu/pinned_registration.h"
#include "gpu/probe.h"
#include "gpu/select.h"

namespace tz::gpu {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = create_cuda_device(0, budget_bytes());
    if (!d.is_ok()) GTEST_SKIP() << "skipped: " << d.status().message();
    device_ = std::move(*d);
  }
  void TearDown() override {
    if (device_) {
      EXPECT_TRUE(device_->synchronize().is_ok());
    }
    device_.reset();
  }
  virtual std::uint64_t budget_bytes() const { return 256ull << 20; }
  std::unique_ptr<Device> device_;
};

class CudaSmallBudget : public CudaDeviceTest {
  std::uint64_t budget_bytes() const override { return 8ull << 20; }
};

TEST_F(CudaSmallBudget, BudgetIsExactAndNeverExceeded) { testing::check_budget_exact(*device_); }
TEST_F(CudaDeviceTest, Copies) { testing::check_copies(*device_); }
TEST_F(CudaDeviceTest, FillKernel) { testing::check_fill(*device_); }
TEST_F(CudaDeviceTest, CastKernel) { testing::check_cast(*device_); }
TEST_F(CudaDeviceTest, ScaleKernel) { testing::check_scale(*device_); }
TEST_F(CudaDeviceTest, SumSquaresKernel) { testing::check_sum_squares(*device_); }
// Bit for bit the host's fixed order: the gradient norm does not depend on where shards live.
TEST_F(CudaDeviceTest, SumSquaresKernelsMatchTheHostBitForBit) {
  testing::check_sum_squares_fixed_order(*device_);
}
TEST_F(CudaDeviceTest, OptimizerKernelMatchesSharedFunctors) {
  testing::check_optimizer_step_matches_shared_functors(*device_);
}
TEST_F(CudaDeviceTest, EventOrdering) { testing::check_event_ordering(*device_); }
TEST_F(CudaDeviceTest, CallbackOrder) { testing::check_callback_order(*device_); }

TEST_F(CudaDeviceTest, IdentifiesItself) {
  EXPECT_EQ(device_->kind(), DeviceKind::kCuda);
  EXPECT_FALSE(device_->host_accessible());
  EXPECT_EQ(device_->cuda_ordinal(), 0);
  const nlohmann::json j = probe_gpus();
  ASSERT_FALSE(j["gpus"].empty()) << j.dump();
  EXPECT_FALSE(j.contains("error"));
  std::printf("probe_gpus: %s\n", j.dump().c_str());
}

TEST_F(CudaDeviceTest, PinnedPoolSlabsAreRegistered) {
  PinnedPoolOptions o;
  o.budget_bytes = 8ull << 20;
  o.slab_bytes = 4ull << 20;
  o.lock = MemlockPolicy::kOff;
  auto pool = PinnedPool::create(o);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  ASSERT_TRUE(register_pinned_pool(*device_, *pool).is_ok());
  auto pinned = pool->allocate(1 << 20);
  auto dev = device_->allocate(1 << 20);
  ASSERT_TRUE(pinned.is_ok() && dev.is_ok());
#if TZ_HAVE_CUDA
  // The slab is page-locked with the CUDA driver: the runtime sees registered host memory.
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, pinned->data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
#endif
  std::memset(pinned->data(), 0x42, 1 << 20);
  ASSERT_TRUE(device_->copy_async(dev->data(), pinned->data(), 1 << 20, CopyKind::kHostToDevice,
                                  device_->h2d_stream()).is_ok());
  // Not before the copy is known complete: from registered memory the copy is a DMA that reads
  // the buffer after copy_async returns (the first GPU run of this test cleared it too early and
  // copied zeros).
  ASSERT_TRUE(device_->h2d_stream().synchronize().is_ok());
  std::memset(pinned->data(), 0, 1 << 20);
  ASSERT_TRUE(device_->copy_async(pinned->data(), dev->data(), 1 << 20, CopyKind::kDeviceToHost,
                                  device_->d2h_stream()).is_ok());
  ASSERT_TRUE(device_->d2h_stream().synchronize().is_ok());
  EXPECT_EQ(static_cast<unsigned char>(pinned->data()[(1 << 20) - 1]), 0x42);
}

TEST_F(CudaDeviceTest, OutOfBudgetIsAnErrorNotAnAllocation) {
  auto big = device_->allocate(budget_bytes() + 1);
  ASSERT_FALSE(big.is_ok());
  EXPECT_EQ(big.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(device_->memory_stats().in_use_bytes, 0u);
}

}  // namespace
}  // namespace tz::gpu
