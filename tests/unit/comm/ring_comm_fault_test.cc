// RingComm's error path with a substituted transport (seastar-style): a loopback "peer" that
// mirrors this rank, failing on the Nth message. The failure must surface from async_error()
// with the operation named, and every later operation must be skipped, never half-run.
#include "comm/ring_comm.h"

#include <gtest/gtest.h>

#include <cstring>

#include "gpu/host_device.h"

namespace tz::comm {
namespace {

// Rank 0 of 2 whose neighbour sends back exactly what it receives; message `fail_at` (1-based)
// fails with a comm error.
class MirrorTransport final : public Transport {
 public:
  explicit MirrorTransport(int fail_at) : fail_at_(fail_at) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status sendrecv(const void* send, std::size_t send_bytes, void* recv,
                  std::size_t recv_bytes) override {
    if (++messages_ == fail_at_) return {ErrorCode::kCommError, 5, "injected link failure"};
    TZ_ASSERT(send_bytes == recv_bytes || send_bytes == 0 || recv_bytes == 0);
    if (recv_bytes > 0 && send_bytes > 0) std::memmove(recv, send, recv_bytes);
    return Status::ok();
  }
  Status barrier() override { return Status::ok(); }
  int messages() const { return messages_; }

 private:
  int fail_at_;
  int messages_ = 0;
};

TEST(RingCommFault, MirrorPeerGivesDoubledSum) {
  auto device = gpu::HostDevice::create(1 << 20).value();
  RingComm comm(std::make_unique<MirrorTransport>(0), "mirror", 0);
  std::vector<float> x(10, 1.5f);
  ASSERT_TRUE(comm.all_reduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::kSum,
                              device->compute_stream()).is_ok());
  ASSERT_TRUE(device->compute_stream().synchronize().is_ok());
  ASSERT_TRUE(comm.async_error().is_ok());
  for (float v : x) EXPECT_EQ(v, 3.0f);
}

TEST(RingCommFault, FailureSurfacesAndLaterOperationsAreSkipped) {
  for (int fail_at = 1; fail_at <= 3; ++fail_at) {
    auto device = gpu::HostDevice::create(1 << 20).value();
    auto* transport = new MirrorTransport(fail_at);
    RingComm comm(std::unique_ptr<Transport>(transport), "mirror", 0);
    std::vector<float> a(8, 1.0f);
    std::vector<float> b(8, 2.0f);
    std::vector<float> gathered(16, 0.0f);
    gpu::Stream& s = device->compute_stream();
    // all_reduce sends 2 messages (reduce-scatter, all-gather), all_gather 1, the last one 2.
    ASSERT_TRUE(comm.all_reduce(a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kSum, s).is_ok());
    ASSERT_TRUE(comm.all_gather(b.data(), gathered.data(), b.size(), DType::kF32, s).is_ok());
    ASSERT_TRUE(comm.all_reduce(b.data(), b.data(), b.size(), DType::kF32, ReduceOp::kSum, s).is_ok());
    ASSERT_TRUE(s.synchronize().is_ok());
    const Status err = comm.async_error();
    ASSERT_FALSE(err.is_ok()) << "fail_at " << fail_at;
    EXPECT_EQ(err.code(), ErrorCode::kCommError);
    EXPECT_NE(err.message().find("injected link failure"), std::string::npos) << err.message();
    const char* op = fail_at <= 2 ? "mirror all_reduce" : "mirror all_gather";
    EXPECT_NE(err.message().find(op), std::string::npos) << err.message();
    EXPECT_EQ(transport->messages(), fail_at) << "operations ran after the failure";
    // The operations after the failing one never touched their buffers.
    EXPECT_EQ(b, std::vector<float>(8, 2.0f));
    if (fail_at <= 2) {
      EXPECT_EQ(gathered, std::vector<float>(16, 0.0f));
    }
    // Counters count only completed operations.
    EXPECT_EQ(comm.counters().total().calls, fail_at <= 2 ? 0u : 1u);
  }
}

TEST(RingCommFault, BadRootIsRefusedAtEnqueue) {
  auto device = gpu::HostDevice::create(1 << 20).value();
  RingComm comm(std::make_unique<MirrorTransport>(0), "mirror", 0);
  EXPECT_EQ(comm.broadcast(nullptr, 0, DType::kF32, 5, device->compute_stream()).code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace tz::comm
