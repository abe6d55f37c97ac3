// The multi-rank engine bodies (engine_bodies.h) with ranks as processes: run by mpirun -np N
// (tests zero.mpi.np2 and zero.mpi.np4), each process one rank on its own HostDevice with
// MpiComm from comm::open_comm. The same checks as the LocalComm program: stages and placements
// bit-identical, the float64 reference tracked, accumulation, overflow skipped on every rank, and
// the overlap modes against their references.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "comm/select.h"
#include "engine_bodies.h"
#include "gpu/host_device.h"
#include "zero/engine.h"

namespace tz::zero {
namespace {

// This process's rank of the mpirun job, on a fresh HostDevice and communicator per run (the
// communicator is destroyed before its device).
Status launch_mpi(int ranks, std::uint64_t device_budget_bytes, const RankFn& fn) {
  TZ_ASSIGN_OR_RETURN(auto device, gpu::HostDevice::create(device_budget_bytes));
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<comm::Comm> comm,
                      comm::open_comm(*device, comm::CommBackend::kMpi));
  if (comm->world_size() != ranks) {
    return Status::invalid_argument("launch_mpi: the body wants " + std::to_string(ranks) +
                                    " ranks, mpirun started " +
                                    std::to_string(comm->world_size()));
  }
  Status s = fn(comm->rank(), *device, *comm);
  if (!s.is_ok()) s = std::move(s).with_context("rank " + std::to_string(comm->rank()));
  comm.reset();
  return s;
}

int world() {
  auto device = gpu::HostDevice::create(1u << 20);
  if (!device.is_ok()) return 0;
  auto comm = comm::open_comm(**device, comm::CommBackend::kMpi);
  return comm.is_ok() ? (*comm)->world_size() : 0;
}

TEST(ZeroEngineMpi, RunsUnderMpirun) {
  auto device = gpu::HostDevice::create(1u << 20);
  ASSERT_TRUE(device.is_ok());
  auto comm = comm::open_comm(**device, comm::CommBackend::kMpi);
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  EXPECT_EQ((*comm)->backend(), "mpi");
  EXPECT_GE((*comm)->world_size(), 2) << "run this program with mpirun -np N, N >= 2";
}

TEST(ZeroEngineMpi, StagesAndPlacementsBitIdenticalBf16) {
  testing::expect_bit_identical(launch_mpi, world(), "bf16", 1);
}
TEST(ZeroEngineMpi, StagesAndPlacementsBitIdenticalFp16Accumulation) {
  testing::expect_bit_identical(launch_mpi, world(), "fp16", 2);
}
TEST(ZeroEngineMpi, TracksFloat64ReferenceStage3) {
  testing::expect_tracks_reference(launch_mpi, world(), 3, "none");
}
TEST(ZeroEngineMpi, TracksFloat64ReferenceStage2Cpu) {
  testing::expect_tracks_reference(launch_mpi, world(), 2, "cpu");
}
TEST(ZeroEngineMpi, AccumulationEqualsLargerBatch) {
  testing::expect_accumulation_equals_larger_batch(launch_mpi, world());
}
TEST(ZeroEngineMpi, Fp16OverflowSkipsEveryRankAndHalvesScale) {
  testing::expect_overflow_skips_every_rank(launch_mpi, world());
}
TEST(ZeroEngineMpi, DelayedEqualsOneStepLateReference) {
  testing::expect_delayed_equals_stale_reference(launch_mpi, world(), "bf16", 3, "nvme", "cpu");
  testing::expect_delayed_equals_stale_reference(launch_mpi, world(), "fp16", 2, "cpu", "none",
                                                 {2});
}
TEST(ZeroEngineMpi, EagerEqualsExactAndAfterRollbacks) {
  testing::RunSpec r;
  r.ranks = world();
  r.stage = 3;
  r.offload_optimizer = "cpu";
  r.dtype = "bf16";
  r.clip = 0;
  r.persistence = 0;
  testing::expect_eager_equals_exact(launch_mpi, r, /*expect_rollbacks=*/false);
  r.clip = 1e-3;
  testing::expect_eager_equals_exact(launch_mpi, r, /*expect_rollbacks=*/true);
  r.dtype = "fp16";
  r.clip = 1e6;
  testing::expect_eager_equals_exact(launch_mpi, r, /*expect_rollbacks=*/false, {2});
}

}  // namespace
}  // namespace tz::zero
