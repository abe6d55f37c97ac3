// MpiComm under `mpirun -np N`: the same per-rank collective checks as LocalComm, with ranks as
// processes; the byte counters summed over ranks (MPI_Allreduce) must match the ring formulas.
#include "comm/mpi_comm.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

#include "collective_checks.h"
#include "gpu/host_device.h"

namespace tz::comm {
namespace {

// Every rank must use the same seed: TZ_TEST_SEED or a fixed default, printed by rank 0.
std::uint32_t seed() {
  const char* env = std::getenv("TZ_TEST_SEED");
  return env ? static_cast<std::uint32_t>(std::strtoul(env, nullptr, 10)) : 20261129u;
}

TEST(MpiComm, AllCollectivesMatchReferenceAndRingBytes) {
  auto comm = MpiComm::create();
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  auto device = gpu::HostDevice::create(1ull << 30);
  ASSERT_TRUE(device.is_ok());
  auto stream = (*device)->create_stream("comm");
  ASSERT_TRUE(stream.is_ok());
  if ((*comm)->rank() == 0) {
    std::printf("MpiComm world=%d seed=%u (set TZ_TEST_SEED to replay)\n", (*comm)->world_size(),
                seed());
  }
  EXPECT_EQ((*comm)->backend(), "mpi");
  testing::Harness h{**comm, **device, **stream, seed()};
  const testing::RankTotals mine = testing::run_all_checks(h);
  std::uint64_t local[3] = {mine.all_reduce_sent, mine.all_reduce_received, mine.broadcast_sent};
  std::uint64_t sum[3] = {0, 0, 0};
  ASSERT_EQ(MPI_Allreduce(local, sum, 3, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
  const testing::RankTotals want = testing::expected_totals((*comm)->world_size());
  EXPECT_EQ(sum[0], want.all_reduce_sent);
  EXPECT_EQ(sum[1], want.all_reduce_received);
  EXPECT_EQ(sum[2], want.broadcast_sent);
  // Per-rank all_reduce bytes equal ring_bytes for an uneven size.
  (*comm)->reset_counters();
  const std::size_t count = 1001;
  auto buf = (*device)->allocate(count * 4);
  ASSERT_TRUE(buf.is_ok());
  ASSERT_TRUE((*device)->fill(buf->data(), DType::kF32, count, 1.0f, **stream).is_ok());
  ASSERT_TRUE((*comm)->all_reduce(buf->data(), buf->data(), count, DType::kF32, ReduceOp::kSum,
                                  **stream).is_ok());
  ASSERT_TRUE((*stream)->synchronize().is_ok());
  EXPECT_EQ(buf->as<float>()[count - 1], static_cast<float>((*comm)->world_size()));
  const OpCounters ring = ring_bytes(CollectiveOp::kAllReduce, (*comm)->world_size(),
                                     (*comm)->rank(), count, 4);
  EXPECT_EQ((*comm)->counters()[CollectiveOp::kAllReduce].bytes_sent, ring.bytes_sent);
  EXPECT_EQ((*comm)->counters()[CollectiveOp::kAllReduce].bytes_received, ring.bytes_received);
  ASSERT_TRUE((*comm)->barrier(**stream).is_ok());
  ASSERT_TRUE((*stream)->synchronize().is_ok());
  buf->reset();
}

TEST(MpiComm, PipelinedRandomSequence) {
  auto comm = MpiComm::create();
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  auto device = gpu::HostDevice::create(1ull << 30);
  ASSERT_TRUE(device.is_ok());
  auto stream = (*device)->create_stream("pipelined");
  ASSERT_TRUE(stream.is_ok());
  testing::Harness h{**comm, **device, **stream, seed()};
  testing::check_pipelined_sequence(h, seed(), 40);
}

}  // namespace
}  // namespace tz::comm
