// NcclComm on a real GPU (one rank per process, each on its local rank's GPU; run under mpirun for
// more): the collective checks LocalComm passes, on CUDA device buffers. Skips without a GPU or
// without NCCL.
#include <gtest/gtest.h>

#include "collective_checks.h"
#include "comm/nccl_comm.h"
#include "gpu/probe.h"
#include "gpu/select.h"

namespace tz::comm {
namespace {

TEST(NcclComm, AllCollectivesMatchReference) {
  if (!nccl_built()) GTEST_SKIP() << "skipped: built without NCCL (TZ_NCCL=OFF)";
  auto device = gpu::create_cuda_device(-1, 1ull << 30);
  if (!device.is_ok()) GTEST_SKIP() << "skipped: " << device.status().message();
  auto comm = NcclComm::create(**device);
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  // Each rank on its own GPU: the local rank's (the one reading of the launcher's variables).
  const auto gpus = static_cast<int>(gpu::probe_gpus()["gpus"].size());
  ASSERT_GT(gpus, 0);
  EXPECT_EQ((*device)->cuda_ordinal(), (*comm)->local_rank() % gpus);
  auto stream = (*device)->create_stream("nccl");
  ASSERT_TRUE(stream.is_ok());
  testing::Harness h{**comm, **device, **stream, 20261129u};
  const testing::RankTotals mine = testing::run_all_checks(h);
  if ((*comm)->world_size() == 1) {
    const testing::RankTotals want = testing::expected_totals(1);
    EXPECT_EQ(mine.all_reduce_sent, want.all_reduce_sent);
    EXPECT_EQ(mine.broadcast_sent, want.broadcast_sent);
  }
  EXPECT_TRUE((*comm)->async_error().is_ok());
  comm->reset();
}

TEST(NcclComm, RefusesHostDevice) {
  auto host = gpu::open_device({.choice = gpu::DeviceChoice::kHost, .budget_bytes = 1 << 20});
  ASSERT_TRUE(host.is_ok());
  auto comm = NcclComm::create(**host);
  EXPECT_FALSE(comm.is_ok());
}

}  // namespace
}  // namespace tz::comm
