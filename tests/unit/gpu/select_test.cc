// Device selection (TZ_DEVICE, fallback) and the GPU probe on a machine without a usable GPU.
#include "gpu/select.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "gpu/launch_env.h"
#include "gpu/probe.h"

namespace tz::gpu {
namespace {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1); else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1); else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

bool cuda_usable() { return create_cuda_device(0, 1 << 20).is_ok(); }

TEST(DeviceSelect, ParseChoice) {
  EXPECT_EQ(*parse_device_choice("host"), DeviceChoice::kHost);
  EXPECT_EQ(*parse_device_choice("cuda"), DeviceChoice::kCuda);
  EXPECT_EQ(*parse_device_choice("auto"), DeviceChoice::kAuto);
  auto bad = parse_device_choice("tpu");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("auto, host, cuda"), std::string::npos);
}

TEST(DeviceSelect, ForcedHost) {
  ScopedEnv env("TZ_DEVICE", "host");
  auto d = open_device({.budget_bytes = 1 << 20});
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ((*d)->kind(), DeviceKind::kHost);
  EXPECT_EQ((*d)->memory_stats().budget_bytes, 1u << 20);
}

TEST(DeviceSelect, ForcedCudaFailsClearlyWithoutGpu) {
  if (cuda_usable()) GTEST_SKIP() << "a GPU is present; this test is for machines without one";
  ScopedEnv env("TZ_DEVICE", "cuda");
  auto d = open_device({});
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kUnavailable);
  EXPECT_NE(d.status().message().find("TZ_DEVICE=cuda"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find("no GPU: "), std::string::npos) << d.status().message();
}

TEST(DeviceSelect, OptionOverridesEnvironment) {
  ScopedEnv env("TZ_DEVICE", "cuda");
  auto d = open_device({.choice = DeviceChoice::kHost, .budget_bytes = 1 << 20});
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ((*d)->kind(), DeviceKind::kHost);
}

TEST(DeviceSelect, BadEnvironmentValueIsAnError) {
  ScopedEnv env("TZ_DEVICE", "gpu0");
  auto d = open_device({});
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("TZ_DEVICE"), std::string::npos);
}

TEST(DeviceSelect, AutoFallsBackToHost) {
  ScopedEnv env("TZ_DEVICE", nullptr);
  auto d = open_device({.budget_bytes = 1 << 20});
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ((*d)->kind(), cuda_usable() ? DeviceKind::kCuda : DeviceKind::kHost);
}

TEST(GpuProbe, ReportsWithoutCrashing) {
  const nlohmann::json j = probe_gpus();
  ASSERT_TRUE(j.contains("cuda_built"));
  ASSERT_TRUE(j.contains("driver_version"));
  ASSERT_TRUE(j.contains("runtime_version"));
  ASSERT_TRUE(j["gpus"].is_array());
  if (j["gpus"].empty()) {
    ASSERT_TRUE(j.contains("error"));
    EXPECT_EQ(j["error"].get<std::string>().rfind("no GPU: ", 0), 0u) << j.dump();
  }
  std::printf("probe_gpus: %s\n", j.dump().c_str());
}

// The GPU a process opens is its local rank as the launcher scheme that names its rank says, the
// same reading the communicators use: under Open MPI a stray LOCAL_RANK (torchrun's) must not
// win over OMPI_COMM_WORLD_LOCAL_RANK, and outside any launcher the ordinal is 0.
TEST(DeviceSelect, LocalRankIsTheLaunchersOne) {
  if (getenv("OMPI_COMM_WORLD_RANK") || getenv("PMI_RANK") || getenv("SLURM_PROCID") ||
      getenv("RANK")) {
    GTEST_SKIP() << "running under a launcher";
  }
  {
    ScopedEnv local("LOCAL_RANK", "5");  // alone (no RANK/WORLD_SIZE): not a launch
    EXPECT_EQ(default_cuda_ordinal(), 0);
  }
  ScopedEnv rank("OMPI_COMM_WORLD_RANK", "3");
  ScopedEnv size("OMPI_COMM_WORLD_SIZE", "4");
  ScopedEnv ompi_local("OMPI_COMM_WORLD_LOCAL_RANK", "2");
  ScopedEnv torch_local("LOCAL_RANK", "1");
  const LaunchEnv env = detect_launch_env();
  EXPECT_EQ(env.launcher, "openmpi");
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(default_cuda_ordinal(), 2);
  {
    ScopedEnv torch_rank("RANK", "1");
    ScopedEnv torch_size("WORLD_SIZE", "2");
    EXPECT_EQ(default_cuda_ordinal(), 2) << "Open MPI's scheme comes first, as for the comm";
  }
}

}  // namespace
}  // namespace tz::gpu
