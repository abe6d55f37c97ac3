// LocalComm: every collective for 1, 2, 3, 4 and 8 ranks (threads), sizes that do not divide
// evenly, in place and out of place, all dtypes; byte counters against the ring formulas; and
// stream semantics (asynchronous enqueue, ordering through events).
#include "comm/local_comm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "collective_checks.h"
#include "comm/launch_env.h"
#include "comm/probe.h"
#include "comm/select.h"
#include "gpu/host_device.h"

namespace tz::comm {
namespace {

std::uint32_t seed() {
  static const std::uint32_t s = [] {
    const auto v = static_cast<std::uint32_t>(std::random_device{}());
    std::printf("local comm seed: %u\n", v);
    return v;
  }();
  return s;
}

std::unique_ptr<gpu::HostDevice> make_device() {
  auto d = gpu::HostDevice::create(2ull << 30);
  TZ_ASSERT(d.is_ok());
  return std::move(*d);
}

// Runs fn(rank, comm, stream) on one thread per rank, each with its own stream.
template <typename Fn>
void run_ranks(gpu::Device& device, std::vector<std::unique_ptr<Comm>>& comms, Fn fn) {
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      auto stream = device.create_stream("rank" + std::to_string(r));
      ASSERT_TRUE(stream.is_ok());
      fn(static_cast<int>(r), *comms[r], **stream);
      ASSERT_TRUE((*stream)->synchronize().is_ok());
    });
  }
  for (auto& t : threads) t.join();
}

class LocalCommWorld : public ::testing::TestWithParam<int> {};

TEST_P(LocalCommWorld, AllCollectivesMatchReferenceAndRingBytes) {
  const int world = GetParam();
  auto device = make_device();
  auto comms = LocalComm::create_group(world);
  ASSERT_TRUE(comms.is_ok());
  std::vector<testing::RankTotals> totals(static_cast<std::size_t>(world));
  run_ranks(*device, *comms, [&](int r, Comm& comm, gpu::Stream& stream) {
    EXPECT_EQ(comm.rank(), r);
    EXPECT_EQ(comm.world_size(), world);
    EXPECT_EQ(comm.backend(), "local");
    testing::Harness h{comm, *device, stream, seed()};
    totals[static_cast<std::size_t>(r)] = testing::run_all_checks(h);
  });
  testing::RankTotals sum;
  for (const auto& t : totals) {
    sum.all_reduce_sent += t.all_reduce_sent;
    sum.all_reduce_received += t.all_reduce_received;
    sum.broadcast_sent += t.broadcast_sent;
  }
  const testing::RankTotals want = testing::expected_totals(world);
  EXPECT_EQ(sum.all_reduce_sent, want.all_reduce_sent);
  EXPECT_EQ(sum.all_reduce_received, want.all_reduce_received);
  EXPECT_EQ(sum.broadcast_sent, want.broadcast_sent);
  for (const auto& comm : *comms) {
    EXPECT_EQ(comm->counters()[CollectiveOp::kBarrier].calls, 1u);
  }
}

TEST_P(LocalCommWorld, PipelinedRandomSequence) {
  const int world = GetParam();
  auto device = make_device();
  auto comms = LocalComm::create_group(world);
  ASSERT_TRUE(comms.is_ok());
  run_ranks(*device, *comms, [&](int, Comm& comm, gpu::Stream& stream) {
    testing::Harness h{comm, *device, stream, seed()};
    testing::check_pipelined_sequence(h, seed(), 40);
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, LocalCommWorld, ::testing::Values(1, 2, 3, 4, 8));

// ring_bytes, which NcclComm reports, against the closed forms of DESIGN.md.
TEST(RingBytes, MatchDesignFormulas) {
  for (int n : {1, 2, 3, 4, 8}) {
    const auto un = static_cast<std::uint64_t>(n);
    for (std::size_t count : {0ul, 1ul, 5ul, 64ul, 1000ul, 1003ul}) {
      std::uint64_t ar_sent = 0;
      std::uint64_t ar_recv = 0;
      std::uint64_t bc_sent = 0;
      std::uint64_t bc_recv = 0;
      for (int r = 0; r < n; ++r) {
        const OpCounters ag = ring_bytes(CollectiveOp::kAllGather, n, r, count, 2);
        EXPECT_EQ(ag.bytes_sent, (un - 1) * count * 2);
        const OpCounters ar = ring_bytes(CollectiveOp::kAllReduce, n, r, count, 4);
        if (count % un == 0) {
          EXPECT_EQ(ar.bytes_sent, 2 * (un - 1) * count / un * 4);
        }
        ar_sent += ar.bytes_sent;
        ar_recv += ar.bytes_received;
        const OpCounters bc = ring_bytes(CollectiveOp::kBroadcast, n, r, count, 4, n - 1);
        bc_sent += bc.bytes_sent;
        bc_recv += bc.bytes_received;
      }
      EXPECT_EQ(ar_sent, 2 * (un - 1) * count * 4);
      EXPECT_EQ(ar_recv, 2 * (un - 1) * count * 4);
      EXPECT_EQ(bc_sent, (un - 1) * count * 4);
      EXPECT_EQ(bc_recv, (un - 1) * count * 4);
    }
  }
}

// The per-rank all_reduce counters of a real run equal ring_bytes for uneven sizes too.
TEST(LocalComm, AllReduceCountersEqualRingBytesPerRank) {
  constexpr int kWorld = 3;
  constexpr std::size_t kCount = 1000;  // not divisible by 3
  auto device = make_device();
  auto comms = LocalComm::create_group(kWorld);
  ASSERT_TRUE(comms.is_ok());
  run_ranks(*device, *comms, [&](int r, Comm& comm, gpu::Stream& stream) {
    auto buf = device->allocate(kCount * 4);
    ASSERT_TRUE(buf.is_ok());
    ASSERT_TRUE(device->fill(buf->data(), DType::kF32, kCount, 1.0f, stream).is_ok());
    ASSERT_TRUE(comm.all_reduce(buf->data(), buf->data(), kCount, DType::kF32, ReduceOp::kSum,
                                stream).is_ok());
    ASSERT_TRUE(stream.synchronize().is_ok());
    EXPECT_EQ(buf->as<float>()[kCount - 1], 3.0f);
    const OpCounters want = ring_bytes(CollectiveOp::kAllReduce, kWorld, r, kCount, 4);
    EXPECT_EQ(comm.counters()[CollectiveOp::kAllReduce].bytes_sent, want.bytes_sent) << "rank " << r;
    EXPECT_EQ(comm.counters()[CollectiveOp::kAllReduce].bytes_received, want.bytes_received);
    comm.reset_counters();
    EXPECT_EQ(comm.counters().total().calls, 0u);
  });
}

// Enqueueing returns at once: rank 0's all_reduce cannot finish before rank 1 has even called,
// and an event recorded after it stays incomplete until then.
TEST(LocalComm, EnqueueIsAsynchronous) {
  auto device = make_device();
  auto comms = LocalComm::create_group(2);
  ASSERT_TRUE(comms.is_ok());
  std::atomic<bool> rank0_checked{false};
  run_ranks(*device, *comms, [&](int r, Comm& comm, gpu::Stream& stream) {
    auto buf = device->allocate(64 * 4);
    ASSERT_TRUE(buf.is_ok());
    ASSERT_TRUE(device->fill(buf->data(), DType::kF32, 64, static_cast<float>(r + 1), stream).is_ok());
    if (r == 1) {
      while (!rank0_checked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    auto ev = device->create_event();
    ASSERT_TRUE(ev.is_ok());
    ASSERT_TRUE(comm.all_reduce(buf->data(), buf->data(), 64, DType::kF32, ReduceOp::kSum, stream).is_ok());
    ASSERT_TRUE((*ev)->record(stream).is_ok());
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      EXPECT_FALSE(*(*ev)->query()) << "all_reduce completed without its peer";
      rank0_checked.store(true);
    }
    ASSERT_TRUE((*ev)->synchronize().is_ok());
    EXPECT_EQ(buf->as<float>()[63], 3.0f);
  });
}

// A collective ordered behind an event on another stream sees that stream's writes.
TEST(LocalComm, OrderedThroughEvents) {
  auto device = make_device();
  auto comms = LocalComm::create_group(2);
  ASSERT_TRUE(comms.is_ok());
  run_ranks(*device, *comms, [&](int r, Comm& comm, gpu::Stream& stream) {
    auto producer = device->create_stream("producer" + std::to_string(r));
    auto ev = device->create_event();
    auto buf = device->allocate(1000 * 4);
    ASSERT_TRUE(producer.is_ok() && ev.is_ok() && buf.is_ok());
    ASSERT_TRUE(device->host_callback(**producer, [] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }).is_ok());
    ASSERT_TRUE(device->fill(buf->data(), DType::kF32, 1000, 2.0f, **producer).is_ok());
    ASSERT_TRUE((*ev)->record(**producer).is_ok());
    ASSERT_TRUE(stream.wait(**ev).is_ok());
    ASSERT_TRUE(comm.all_reduce(buf->data(), buf->data(), 1000, DType::kF32, ReduceOp::kAvg,
                                stream).is_ok());
    ASSERT_TRUE(stream.synchronize().is_ok());
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(buf->as<float>()[i], 2.0f);
    ASSERT_TRUE((*producer)->synchronize().is_ok());
  });
}

TEST(LocalComm, BadArguments) {
  EXPECT_FALSE(LocalComm::create_group(0).is_ok());
  auto device = make_device();
  auto comms = LocalComm::create_group(1);
  ASSERT_TRUE(comms.is_ok());
  float x = 0;
  EXPECT_EQ((*comms)[0]->broadcast(&x, 1, DType::kF32, 1, device->compute_stream()).code(),
            ErrorCode::kInvalidArgument);
}

TEST(CommSelect, SingleProcessIsLocal) {
  auto device = make_device();
  auto comm = open_comm(*device, CommBackend::kLocal);
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  EXPECT_EQ((*comm)->world_size(), 1);
  EXPECT_FALSE(parse_comm_backend("gloo").is_ok());
  EXPECT_EQ(*parse_comm_backend("mpi"), CommBackend::kMpi);
  auto nccl = open_comm(*device, CommBackend::kNccl);
  EXPECT_FALSE(nccl.is_ok()) << "NCCL accepted a host device";
}

// One rank needs no transport: on a device without host access (a HostDevice claiming none, as a
// GPU does) every collective is a copy on the stream, in place or not, and nothing is sent; two
// ranks on such a device are refused with a message that names the device.
TEST(LocalCommSingleRank, RunsOnADeviceWithoutHostAccess) {
  auto device = make_device();
  device->claim_no_host_access();
  ASSERT_FALSE(device->host_accessible());
  auto comms = LocalComm::create_group(1);
  ASSERT_TRUE(comms.is_ok());
  Comm& comm = *comms->front();
  gpu::Stream& stream = device->compute_stream();
  std::mt19937 rng(seed());
  const std::size_t n = 1001;
  std::vector<float> values(n);
  for (float& v : values) v = static_cast<float>(rng() % 20001) / 100.0f - 100.0f;
  auto send = device->allocate(n * sizeof(float));
  auto recv = device->allocate(n * sizeof(float));
  ASSERT_TRUE(send.is_ok() && recv.is_ok());
  auto upload = [&] {
    ASSERT_TRUE(device->copy_async(send->data(), values.data(), n * sizeof(float),
                                   gpu::CopyKind::kHostToDevice, stream).is_ok());
    ASSERT_TRUE(device->memset_async(recv->data(), 0, n * sizeof(float), stream).is_ok());
  };
  auto download = [&](const gpu::DeviceBuffer& b) {
    std::vector<float> out(n, -1.0f);
    EXPECT_TRUE(device->copy_async(out.data(), b.data(), n * sizeof(float),
                                   gpu::CopyKind::kDeviceToHost, stream).is_ok());
    EXPECT_TRUE(stream.synchronize().is_ok());
    return out;
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    upload();
    ASSERT_TRUE(comm.all_reduce(send->data(), recv->data(), n, DType::kF32, op, stream).is_ok());
    EXPECT_EQ(download(*recv), values);
    upload();
    ASSERT_TRUE(comm.reduce_scatter(send->data(), recv->data(), n, DType::kF32, op, stream).is_ok());
    EXPECT_EQ(download(*recv), values);
    upload();  // in place
    ASSERT_TRUE(comm.all_reduce(send->data(), send->data(), n, DType::kF32, op, stream).is_ok());
    EXPECT_EQ(download(*send), values);
  }
  upload();
  ASSERT_TRUE(comm.all_gather(send->data(), recv->data(), n, DType::kF32, stream).is_ok());
  EXPECT_EQ(download(*recv), values);
  upload();
  ASSERT_TRUE(comm.broadcast(send->data(), n, DType::kF32, 0, stream).is_ok());
  EXPECT_EQ(download(*send), values);
  EXPECT_FALSE(comm.broadcast(send->data(), n, DType::kF32, 1, stream).is_ok());
  ASSERT_TRUE(comm.barrier(stream).is_ok());
  ASSERT_TRUE(stream.synchronize().is_ok());
  EXPECT_TRUE(comm.async_error().is_ok());
  const CommCounters c = comm.counters();
  EXPECT_EQ(c[CollectiveOp::kAllReduce].calls, 4u);
  EXPECT_EQ(c[CollectiveOp::kReduceScatter].calls, 2u);
  EXPECT_EQ(c[CollectiveOp::kAllGather].calls, 1u);
  EXPECT_EQ(c[CollectiveOp::kBroadcast].calls, 1u);
  EXPECT_EQ(c[CollectiveOp::kBarrier].calls, 1u);
  EXPECT_EQ(c.total().bytes_sent, 0u);
  EXPECT_EQ(c.total().bytes_received, 0u);

  auto pair = LocalComm::create_group(2);
  ASSERT_TRUE(pair.is_ok());
  const Status refused = (*pair)[0]->all_reduce(send->data(), recv->data(), n, DType::kF32,
                                                ReduceOp::kSum, stream);
  EXPECT_EQ(refused.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.message().find(device->name()), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("2 ranks"), std::string::npos) << refused.message();
}

// open_comm on a single process picks a backend that trains on the device it is given: on a
// device without host access and without NCCL in the build, the one-rank LocalComm.
TEST(LocalCommSingleRank, OpenCommGivesAWorkingCommForOneRank) {
  auto device = make_device();
  device->claim_no_host_access();
  if (detect_launch_env().world_size > 1) GTEST_SKIP() << "running under a launcher";
  auto comm = open_comm(*device, CommBackend::kAuto);
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  EXPECT_EQ((*comm)->backend(), "local");
  auto buf = device->allocate(64 * sizeof(float));
  ASSERT_TRUE(buf.is_ok());
  gpu::Stream& stream = device->compute_stream();
  ASSERT_TRUE(device->fill(buf->data(), DType::kF32, 64, 2.5f, stream).is_ok());
  ASSERT_TRUE((*comm)->all_reduce(buf->data(), buf->data(), 64, DType::kF32, ReduceOp::kAvg,
                                  stream).is_ok());
  std::vector<float> out(64);
  ASSERT_TRUE(device->copy_async(out.data(), buf->data(), 64 * sizeof(float),
                                 gpu::CopyKind::kDeviceToHost, stream).is_ok());
  ASSERT_TRUE(stream.synchronize().is_ok());
  EXPECT_EQ(out, std::vector<float>(64, 2.5f));
}

TEST(LaunchEnv, ReadsTorchrunStyleVariables) {
  // Only when no real launcher variables are set (ctest runs this outside mpirun).
  if (std::getenv("OMPI_COMM_WORLD_RANK") || std::getenv("PMI_RANK") || std::getenv("SLURM_PROCID")) {
    GTEST_SKIP() << "running under a launcher";
  }
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_RANK", "1", 1);
  const LaunchEnv env = detect_launch_env();
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  setenv("RANK", "9", 1);  // rank >= world size is ignored
  setenv("WORLD_SIZE", "8", 1);
  EXPECT_EQ(detect_launch_env().launcher, "none");
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
}

TEST(CommProbe, Reports) {
  const nlohmann::json j = probe_comm();
  for (const char* key : {"nccl_built", "nccl_version", "mpi_built", "mpi_library_version"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  std::printf("probe_comm: %s\n", j.dump().c_str());
}

}  // namespace
}  // namespace tz::comm
