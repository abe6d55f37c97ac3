// Launch-error handling (gpu/launch_check.h) through a fake CUDA error source: an error left by an
// earlier call is cleared before the launch and never blamed on the kernel; a sticky one stops the
// launch, named as earlier; the launch's own error names the kernel. Also the compute-capability
// refusal and the default CUDA budget (gpu/select.h), which need no GPU.
#include "gpu/launch_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/select.h"

namespace tz::gpu {
namespace {

// The runtime's per-thread last error: raise() sets it (as a failing call or launch does), take()
// reads and clears it unless it is sticky. Every event is logged in order.
class FakeErrors final : public LaunchErrors {
 public:
  int take() override {
    log.push_back("take");
    const int code = pending;
    if (!sticky) pending = 0;
    return code;
  }
  std::string describe(int code) const override {
    return "fakeError" + std::to_string(code) + " (code " + std::to_string(code) + ")";
  }
  void raise(int code) {
    if (pending == 0) pending = code;
  }
  int pending = 0;
  bool sticky = false;
  std::vector<std::string> log;
};

// A launcher as cuda_kernels.h's: enqueues, then returns the error read right after.
auto launcher(FakeErrors& errors, int fails_with, int& launches) {
  return [&errors, fails_with, &launches] {
    errors.log.push_back("launch");
    ++launches;
    if (fails_with != 0) errors.raise(fails_with);
    return errors.take();
  };
}

TEST(LaunchCheck, CleanLaunchIsOk) {
  FakeErrors errors;
  int launches = 0;
  EXPECT_TRUE(checked_launch(errors, "fill kernel", launcher(errors, 0, launches)).is_ok());
  EXPECT_EQ(launches, 1);
}

TEST(LaunchCheck, AnEarlierErrorIsClearedBeforeTheLaunchAndNotBlamedOnIt) {
  FakeErrors errors;
  errors.raise(2);  // e.g. a cudaMalloc that failed and was reported by its own check
  int launches = 0;
  const Status st = checked_launch(errors, "scale kernel", launcher(errors, 0, launches));
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(launches, 1);
  ASSERT_GE(errors.log.size(), 2u);
  EXPECT_EQ(errors.log.front(), "take") << "the pending error must be read before the launch";
  EXPECT_EQ(errors.pending, 0);
}

TEST(LaunchCheck, TheLaunchsOwnErrorNamesTheKernelNotTheEarlierOne) {
  FakeErrors errors;
  errors.raise(2);
  int launches = 0;
  const Status st = checked_launch(errors, "cast kernel", launcher(errors, 9, launches));
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kDeviceError);
  EXPECT_EQ(st.sys_code(), 9);
  EXPECT_NE(st.message().find("cast kernel: launch failed: fakeError9"), std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find("fakeError2"), std::string::npos) << st.message();
}

TEST(LaunchCheck, AStickyEarlierErrorStopsTheLaunchNamedAsEarlier) {
  FakeErrors errors;
  errors.raise(700);  // an illegal address in an earlier kernel: the context is lost
  errors.sticky = true;
  int launches = 0;
  const Status st = checked_launch(errors, "optimizer_step kernel", launcher(errors, 0, launches));
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(launches, 0);
  EXPECT_EQ(st.sys_code(), 700);
  EXPECT_NE(st.message().find("optimizer_step kernel not launched"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("earlier"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("fakeError700"), std::string::npos) << st.message();
}

TEST(LaunchCheck, ResultOfALaunchWithoutAPendingError) {
  FakeErrors errors;
  EXPECT_TRUE(launch_result(errors, 0, "x").is_ok());
  const Status st = launch_result(errors, 98, "attention_forward");
  EXPECT_EQ(st.code(), ErrorCode::kDeviceError);
  EXPECT_EQ(st.message(), "attention_forward: launch failed: fakeError98 (code 98)");
}

TEST(ComputeCapability, RefusesGpusOlderThanTheBuildNamingBoth) {
  EXPECT_TRUE(check_compute_capability("NVIDIA H200", 0, 9, 0, 80).is_ok());
  EXPECT_TRUE(check_compute_capability("NVIDIA H200", 0, 9, 0, 90).is_ok());
  EXPECT_TRUE(check_compute_capability("NVIDIA L40S", 0, 8, 9, 80).is_ok());
  EXPECT_TRUE(check_compute_capability("any", 0, 3, 0, 0).is_ok()) << "0: unknown, accept";
  const Status st = check_compute_capability("Tesla T4", 1, 7, 5, 80);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kUnavailable);
  EXPECT_EQ(st.message(),
            "no GPU: Tesla T4 (cuda:1) has compute capability 7.5, below 8.0, the oldest this "
            "build has kernels for (CMAKE_CUDA_ARCHITECTURES)");
  EXPECT_FALSE(check_compute_capability("NVIDIA A100", 0, 8, 0, 90).is_ok());
#if defined(TZ_HAVE_CUDA)
  EXPECT_GT(build_min_compute_capability(), 0) << "a CUDA build knows its oldest target";
#else
  EXPECT_EQ(build_min_compute_capability(), 0);
#endif
}

TEST(CudaBudget, DefaultLeavesTheLibrariesReserve) {
  const std::uint64_t gib = 1ull << 30;
  const std::uint64_t free = 140 * gib;
  EXPECT_EQ(default_cuda_budget_bytes(free), free / 100 * 95 - kCudaLibraryReserveBytes);
  // A small GPU keeps a quarter of its 95% rather than nothing.
  const std::uint64_t small = gib;
  EXPECT_EQ(default_cuda_budget_bytes(small), small / 100 * 95 / 4);
  EXPECT_EQ(default_cuda_budget_bytes(0), 0u);
}

}  // namespace
}  // namespace tz::gpu
