// Seeded fault injection under every backend: transient faults (short transfers, EINTR/EAGAIN,
// delayed and reordered completions) are absorbed so every operation succeeds byte-exact; EIO and
// ENOSPC surface as errors naming the file, offset and length, and everything that was reported
// written reads back intact (checked against an in-memory copy after faults are switched off).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "nvme/fault_engine.h"
#include "nvme/nvme_test_util.h"
#include "nvme/swap_space.h"

namespace tz::nvme {
namespace {

using testing::TempDir;

struct Harness {
  TempDir dir;
  FaultEngine* faults = nullptr;  // owned by swap's queue
  std::unique_ptr<SwapSpace> swap;

  Status open(IoEngineKind kind, int paths, const FaultOptions& fo) {
    SwapOptions so;
    for (int i = 0; i < paths; ++i) so.paths.push_back(dir.sub("p" + std::to_string(i)));
    so.bytes_per_path = 16 << 20;
    so.stripe_bytes = 128 << 10;
    IoEngineOptions eo;
    eo.queue_depth = 16;
    TZ_ASSIGN_OR_RETURN(auto inner, make_io_engine(kind, eo));
    auto wrapped = std::make_unique<FaultEngine>(std::move(inner), fo);
    faults = wrapped.get();
    IoQueueOptions qo;
    qo.block_bytes = 64 << 10;
    qo.depth_per_file = 6;
    TZ_ASSIGN_OR_RETURN(SwapSpace s, SwapSpace::create(so, std::move(wrapped), qo));
    swap = std::make_unique<SwapSpace>(std::move(s));
    return Status::ok();
  }
};

struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t n) : size(n) {
    void* p = nullptr;
    EXPECT_EQ(posix_memalign(&p, 4096, n), 0);
    data = static_cast<std::byte*>(p);
  }
  ~AlignedBuffer() { std::free(data); }
  std::byte* data = nullptr;
  std::size_t size;
};

struct Written {
  SwapExtent extent;
  std::vector<std::byte> ref;
};

// Writes `ops` random extents; returns the ones reported written and counts failures. Every
// failure's message must name a swap file, an offset and a length.
std::vector<Written> write_workload(Harness& h, std::mt19937_64& rng, int ops, int* failures,
                                    ErrorCode* first_error) {
  std::vector<Written> ok;
  AlignedBuffer buf(2 << 20);
  for (int i = 0; i < ops; ++i) {
    auto e = h.swap->allocate(4096 * (1 + rng() % 400));
    if (!e.is_ok()) break;
    Written w{*e, std::vector<std::byte>(e->bytes)};
    testing::fill_random(w.ref.data(), w.ref.size(), rng);
    std::memcpy(buf.data, w.ref.data(), w.ref.size());
    Status st = h.swap->write(w.extent, 0, buf.data, w.extent.bytes);
    if (st.is_ok()) {
      ok.push_back(std::move(w));
      continue;
    }
    if (*failures == 0) *first_error = st.code();
    ++*failures;
    EXPECT_NE(st.message().find("/swap."), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("at offset"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(" bytes"), std::string::npos) << st.message();
    h.swap->free(w.extent);  // its content is undefined now; nobody relies on it
  }
  return ok;
}

void verify_all(Harness& h, const std::vector<Written>& written) {
  AlignedBuffer buf(2 << 20);
  for (const Written& w : written) {
    std::memset(buf.data, 0, w.extent.bytes);
    Status st = h.swap->read(w.extent, 0, buf.data, w.extent.bytes);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(std::memcmp(buf.data, w.ref.data(), w.ref.size()), 0)
        << "extent at " << w.extent.offset << " corrupted";
  }
}

class Faults : public ::testing::TestWithParam<IoEngineKind> {};

TEST_P(Faults, TransientFaultsAreAbsorbed) {
  for (std::uint64_t seed : {11ull, 12ull}) {
    std::printf("engine %s seed %llu\n", io_engine_name(GetParam()),
                static_cast<unsigned long long>(seed));
    FaultOptions fo;
    fo.seed = seed;
    fo.short_rate = 0.3;
    fo.transient_rate = 0.2;
    fo.delay_rate = 0.3;
    fo.reorder = true;
    Harness h;
    ASSERT_TRUE(h.open(GetParam(), 2, fo).is_ok());
    std::mt19937_64 rng(seed);
    int failures = 0;
    ErrorCode first = ErrorCode::kOk;
    auto written = write_workload(h, rng, 30, &failures, &first);
    EXPECT_EQ(failures, 0);
    ASSERT_EQ(written.size(), 30u);
    // Reads under the same faults must also come back exact.
    ASSERT_NO_FATAL_FAILURE(verify_all(h, written));
    const FaultCounts& c = h.faults->counts();
    EXPECT_GT(c.short_transfers, 0u);
    EXPECT_GT(c.transient, 0u);
    EXPECT_GT(h.swap->queue().stats().transient_retries, 0u);
    EXPECT_GT(h.swap->queue().stats().short_transfers, 0u);
  }
}

TEST_P(Faults, EioSurfacesAndNothingReportedWrittenIsLost) {
  for (std::uint64_t seed : {21ull, 22ull, 23ull}) {
    std::printf("engine %s seed %llu\n", io_engine_name(GetParam()),
                static_cast<unsigned long long>(seed));
    FaultOptions fo;
    fo.seed = seed;
    fo.eio_rate = 0.02;
    fo.short_rate = 0.2;
    fo.transient_rate = 0.05;
    fo.delay_rate = 0.2;
    fo.reorder = true;
    Harness h;
    ASSERT_TRUE(h.open(GetParam(), 3, fo).is_ok());
    std::mt19937_64 rng(seed);
    int failures = 0;
    ErrorCode first = ErrorCode::kOk;
    auto written = write_workload(h, rng, 40, &failures, &first);
    EXPECT_GT(failures, 0) << "the workload should hit at least one EIO";
    EXPECT_EQ(first, ErrorCode::kIoError);
    EXPECT_EQ(written.size() + static_cast<std::size_t>(failures), 40u);
    h.faults->set_options(FaultOptions{});
    ASSERT_NO_FATAL_FAILURE(verify_all(h, written));
  }
}

TEST_P(Faults, EioOnTheKthRequestFailsExactlyThatOperation) {
  for (std::uint64_t k : {1ull, 5ull, 37ull}) {
    std::printf("engine %s eio_on_request %llu\n", io_engine_name(GetParam()),
                static_cast<unsigned long long>(k));
    FaultOptions fo;
    fo.seed = k;
    fo.eio_on_request = k;
    Harness h;
    ASSERT_TRUE(h.open(GetParam(), 1, fo).is_ok());
    std::mt19937_64 rng(k);
    int failures = 0;
    ErrorCode first = ErrorCode::kOk;
    auto written = write_workload(h, rng, 20, &failures, &first);
    EXPECT_EQ(failures, 1);
    EXPECT_EQ(first, ErrorCode::kIoError);
    EXPECT_EQ(h.faults->counts().eio, 1u);
    h.faults->set_options(FaultOptions{});
    ASSERT_NO_FATAL_FAILURE(verify_all(h, written));
  }
}

TEST_P(Faults, EnospcSurfacesAndEarlierWritesStayIntact) {
  const std::uint64_t seed = 31;
  std::printf("engine %s seed %llu\n", io_engine_name(GetParam()),
              static_cast<unsigned long long>(seed));
  FaultOptions fo;
  fo.seed = seed;
  fo.enospc_after_write_bytes = (5 << 20) + 12345;  // fills up inside some request
  fo.short_rate = 0.1;
  Harness h;
  ASSERT_TRUE(h.open(GetParam(), 2, fo).is_ok());
  std::mt19937_64 rng(seed);
  int failures = 0;
  ErrorCode first = ErrorCode::kOk;
  auto written = write_workload(h, rng, 40, &failures, &first);
  EXPECT_GT(failures, 0);
  EXPECT_EQ(first, ErrorCode::kNoSpace);
  std::uint64_t ok_bytes = 0;
  for (const Written& w : written) ok_bytes += w.extent.bytes;
  EXPECT_LE(ok_bytes, fo.enospc_after_write_bytes);
  EXPECT_GT(h.faults->counts().enospc, 0u);
  h.faults->set_options(FaultOptions{});
  ASSERT_NO_FATAL_FAILURE(verify_all(h, written));
}

TEST_P(Faults, ReadFaultsNeverReturnWrongBytes) {
  const std::uint64_t seed = 41;
  std::printf("engine %s seed %llu\n", io_engine_name(GetParam()),
              static_cast<unsigned long long>(seed));
  Harness h;
  ASSERT_TRUE(h.open(GetParam(), 2, FaultOptions{}).is_ok());
  std::mt19937_64 rng(seed);
  int failures = 0;
  ErrorCode first = ErrorCode::kOk;
  auto written = write_workload(h, rng, 20, &failures, &first);
  ASSERT_EQ(failures, 0);
  FaultOptions fo;
  fo.seed = seed;
  fo.eio_rate = 0.05;
  fo.short_rate = 0.3;
  fo.transient_rate = 0.1;
  fo.delay_rate = 0.3;
  fo.reorder = true;
  h.faults->set_options(fo);
  AlignedBuffer buf(2 << 20);
  int read_errors = 0;
  for (int round = 0; round < 3; ++round) {
    for (const Written& w : written) {
      std::memset(buf.data, 0, w.extent.bytes);
      Status st = h.swap->read(w.extent, 0, buf.data, w.extent.bytes);
      if (!st.is_ok()) {
        ++read_errors;
        EXPECT_EQ(st.code(), ErrorCode::kIoError);
        EXPECT_NE(st.message().find("read of"), std::string::npos) << st.message();
        continue;
      }
      ASSERT_EQ(std::memcmp(buf.data, w.ref.data(), w.ref.size()), 0);
    }
  }
  EXPECT_GT(read_errors, 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, Faults,
                         ::testing::Values(IoEngineKind::kIoUring, IoEngineKind::kLibaio,
                                           IoEngineKind::kPsync),
                         [](const auto& param_info) {
                           return std::string(io_engine_name(param_info.param));
                         });

}  // namespace
}  // namespace tz::nvme
