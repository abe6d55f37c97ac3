// IoQueue rules that need no fault injection: O_DIRECT violations rejected with our message before
// anything is submitted, reads past the end reported with file/offset/length, requests cut to the
// block size with the depth bound kept; plus the probe, the engine choice and swap space limits.
#include "nvme/io_queue.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "core/trace.h"
#include "cpu/pinned_pool.h"
#include "nvme/file.h"
#include "nvme/nvme_test_util.h"
#include "nvme/probe.h"
#include "nvme/swap_space.h"
#include "store/pool_registration.h"

namespace tz::nvme {
namespace {

using testing::TempDir;

struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t n) {
    void* p = nullptr;
    EXPECT_EQ(posix_memalign(&p, 4096, n), 0);
    data = static_cast<std::byte*>(p);
    std::memset(data, 0x11, n);
  }
  ~AlignedBuffer() { std::free(data); }
  std::byte* data = nullptr;
};

class QueueByEngine : public ::testing::TestWithParam<IoEngineKind> {};

TEST_P(QueueByEngine, MisalignedDirectRequestsAreRejectedWithOurMessage) {
  TempDir dir;
  auto fq = testing::open_file_queue(dir.path() + "/f", 1 << 20, GetParam(), {}, {},
                                     DirectMode::kRequire);
  ASSERT_TRUE(fq.is_ok()) << fq.status().to_string();
  AlignedBuffer buf(1 << 20);
  const std::uint32_t a = fq->file.align_bytes();
  struct Bad {
    std::byte* buf;
    std::uint64_t offset, len;
    const char* what;
  } bad[] = {{buf.data + 1, 0, 4096, "buffer address"},
             {buf.data, a / 2, 4096, "offset"},
             {buf.data, 0, 4096 + 100, "length"}};
  for (const Bad& b : bad) {
    for (IoOp op : {IoOp::kRead, IoOp::kWrite}) {
      Transfer t{op, fq->id, b.offset, b.buf, b.len};
      Status st = fq->queue.run({&t, 1});
      ASSERT_FALSE(st.is_ok());
      EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(st.message().find("O_DIRECT on " + fq->file.path()), std::string::npos) << st.message();
      EXPECT_NE(st.message().find(b.what), std::string::npos) << st.message();
    }
  }
  EXPECT_EQ(fq->queue.stats().requests, 0u) << "a rejected request reached the kernel";
  // An aligned request on the same queue works.
  Transfer ok{IoOp::kWrite, fq->id, 0, buf.data, 1 << 20};
  EXPECT_TRUE(fq->queue.run({&ok, 1}).is_ok());
}

TEST_P(QueueByEngine, ReadPastEndNamesFileOffsetAndLength) {
  TempDir dir;
  auto fq = testing::open_file_queue(dir.path() + "/short", 64 << 10, GetParam());
  ASSERT_TRUE(fq.is_ok()) << fq.status().to_string();
  AlignedBuffer buf(256 << 10);
  Transfer t{IoOp::kRead, fq->id, 0, buf.data, 256 << 10};
  Status st = fq->queue.run({&t, 1});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find(fq->file.path()), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("offset 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("262144 bytes"), std::string::npos) << st.message();
}

TEST_P(QueueByEngine, TransfersAreCutToBlocksWithinTheDepth) {
  TempDir dir;
  IoEngineOptions eo;
  eo.queue_depth = 8;
  IoQueueOptions qo;
  qo.block_bytes = 64 << 10;
  qo.depth_per_file = 3;
  auto fq = testing::open_file_queue(dir.path() + "/cut", 4 << 20, GetParam(), eo, qo);
  ASSERT_TRUE(fq.is_ok()) << fq.status().to_string();
  AlignedBuffer buf(4 << 20);
  Transfer t{IoOp::kWrite, fq->id, 0, buf.data, 4 << 20};
  ASSERT_TRUE(fq->queue.run({&t, 1}).is_ok());
  EXPECT_EQ(fq->queue.stats().requests, 64u);
  EXPECT_EQ(fq->queue.stats().bytes_written, 4u << 20);
  EXPECT_LE(fq->queue.stats().max_in_flight_bytes, 3u * (64 << 10));
}

TEST_P(QueueByEngine, PollAloneCompletesStartedOperations) {
  // A caller that never blocks in wait() must still see its requests reach the kernel.
  TempDir dir;
  IoEngineOptions eo;
  eo.queue_depth = 4;
  IoQueueOptions qo;
  qo.block_bytes = 64 << 10;
  qo.depth_per_file = 4;
  auto fq = testing::open_file_queue(dir.path() + "/polled", 2 << 20, GetParam(), eo, qo);
  ASSERT_TRUE(fq.is_ok()) << fq.status().to_string();
  AlignedBuffer out(2 << 20), in(2 << 20);
  std::mt19937_64 rng(71);
  std::printf("seed 71\n");
  testing::fill_random(out.data, 2 << 20, rng);
  Transfer w{IoOp::kWrite, fq->id, 0, out.data, 2 << 20};
  auto op = fq->queue.start({&w, 1});
  ASSERT_TRUE(op.is_ok());
  for (int spins = 0; !fq->queue.done(*op); ++spins) {
    ASSERT_TRUE(fq->queue.poll().is_ok());
    ASSERT_LT(spins, 50000000) << "poll() made no progress";
  }
  ASSERT_TRUE(fq->queue.wait(*op).is_ok());
  Transfer r{IoOp::kRead, fq->id, 0, in.data, 2 << 20};
  ASSERT_TRUE(fq->queue.run({&r, 1}).is_ok());
  EXPECT_EQ(std::memcmp(in.data, out.data, 2 << 20), 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, QueueByEngine,
                         ::testing::Values(IoEngineKind::kIoUring, IoEngineKind::kLibaio,
                                           IoEngineKind::kPsync),
                         [](const auto& param_info) {
                           return std::string(io_engine_name(param_info.param));
                         });

TEST(IoQueue, SqpollRingMovesDataExactly) {
  TempDir dir;
  FileOpenOptions fo;
  fo.create = true;
  auto file = IoFileHandle::open(dir.path() + "/sqpoll", fo);
  ASSERT_TRUE(file.is_ok());
  ASSERT_TRUE(file->preallocate(2 << 20).is_ok());
  IoEngineOptions eo;
  eo.queue_depth = 8;
  eo.sqpoll = true;
  auto engine = make_io_engine(IoEngineKind::kIoUring, eo);
  if (!engine.is_ok()) GTEST_SKIP() << "SQPOLL refused: " << engine.status().to_string();
  IoQueueOptions qo;
  qo.block_bytes = 128 << 10;
  auto q = IoQueue::create(std::move(engine).value(), qo);
  ASSERT_TRUE(q.is_ok());
  PinnedPoolOptions po;
  po.budget_bytes = 4 << 20;
  po.slab_bytes = 4 << 20;
  auto pool = PinnedPool::create(po);
  ASSERT_TRUE(pool.is_ok());
  ASSERT_TRUE(store::register_pool_with_queue(*q, *pool).is_ok());
  EXPECT_TRUE(q->engine().buffers_registered());
  auto id = q->add_file(file->io_file());
  ASSERT_TRUE(id.is_ok());
  auto out = pool->allocate(2 << 20);
  auto in = pool->allocate(2 << 20);
  ASSERT_TRUE(out.is_ok() && in.is_ok());
  std::mt19937_64 rng(61);
  std::printf("seed 61\n");
  testing::fill_random(out->data(), out->size(), rng);
  Transfer w{IoOp::kWrite, *id, 0, out->data(), out->size()};
  ASSERT_TRUE(q->run({&w, 1}).is_ok());
  Transfer r{IoOp::kRead, *id, 0, in->data(), in->size()};
  ASSERT_TRUE(q->run({&r, 1}).is_ok());
  EXPECT_EQ(std::memcmp(in->data(), out->data(), out->size()), 0);
}

TEST(IoQueue, OperationsAppearOnTheNvmeTraceTrack) {
  TempDir dir;
  auto fq = testing::open_file_queue(dir.path() + "/traced", 1 << 20, IoEngineKind::kPsync);
  ASSERT_TRUE(fq.is_ok()) << fq.status().to_string();
  AlignedBuffer buf(1 << 20);
  Trace::global().enable();
  const std::size_t before = Trace::global().event_count();
  Transfer t{IoOp::kWrite, fq->id, 0, buf.data, 1 << 20};
  ASSERT_TRUE(fq->queue.run({&t, 1}).is_ok());
  EXPECT_EQ(Trace::global().event_count(), before + 1);
  EXPECT_NE(Trace::global().to_json().find("nvme write"), std::string::npos);
}

TEST(IoQueue, RejectsBadOptions) {
  auto engine = make_io_engine(IoEngineKind::kPsync, IoEngineOptions{});
  ASSERT_TRUE(engine.is_ok());
  IoQueueOptions qo;
  qo.block_bytes = 1000;
  EXPECT_EQ(IoQueue::create(std::move(engine).value(), qo).status().code(),
            ErrorCode::kInvalidArgument);
}

TEST(Probe, ReportsCapabilitiesAndLeavesNothingBehind) {
  TempDir dir;
  const nlohmann::json j = probe_path(dir.path());
  std::printf("%s\n", j.dump().c_str());
  for (const char* key : {"path", "filesystem", "free_bytes", "total_bytes", "o_direct",
                          "logical_block_bytes", "io_uring", "libaio", "recommended_engine"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* key : {"ring", "registered_buffers", "fixed_files"})
    EXPECT_TRUE(j["io_uring"].contains(key)) << key;
  EXPECT_GT(j["total_bytes"].get<std::uint64_t>(), 0u);
  if (j["o_direct"].get<bool>()) {
    const auto lb = j["logical_block_bytes"].get<std::uint32_t>();
    EXPECT_TRUE(lb >= 512 && lb <= 4096 && (lb & (lb - 1)) == 0) << lb;
  }
  EXPECT_EQ(dir.entry_count(), 0u) << "the probe left a file behind";
}

TEST(Probe, NeverFailsOnABadPath) {
  const nlohmann::json j = probe_path("/nonexistent/tierzero/probe");
  EXPECT_TRUE(j.contains("error"));
  EXPECT_EQ(j["recommended_engine"], "psync");
  const nlohmann::json f = probe_path("/proc/self/status");  // not a directory
  EXPECT_TRUE(f.contains("error"));
}

TEST(Probe, FilesystemNames) {
  EXPECT_EQ(filesystem_name(0xEF53), "ext4");
  EXPECT_EQ(filesystem_name(0x01021994), "tmpfs");
  EXPECT_EQ(filesystem_name(0x58465342), "xfs");
  EXPECT_EQ(filesystem_name(0x794c7630), "overlay");
  EXPECT_EQ(filesystem_name(0x12345), "0x12345");
}

TEST(EngineChoice, ForcedAndAuto) {
  TempDir dir;
  auto forced = choose_io_engine("libaio", {dir.path()});
  ASSERT_TRUE(forced.is_ok());
  EXPECT_EQ(forced->kind, IoEngineKind::kLibaio);
  EXPECT_NE(forced->reason.find("forced"), std::string::npos);
  auto automatic = choose_io_engine("auto", {dir.path()});
  ASSERT_TRUE(automatic.is_ok());
  EXPECT_EQ(io_engine_name(automatic->kind), probe_path(dir.path())["recommended_engine"]);
  EXPECT_EQ(choose_io_engine("spdk", {dir.path()}).status().code(), ErrorCode::kInvalidArgument);
}

TEST(SwapSpace, FullSpaceSaysWhatWasAskedAndWhatIsFree) {
  TempDir dir;
  SwapOptions so;
  so.paths = {dir.path()};
  so.bytes_per_path = 1 << 20;
  auto engine = make_io_engine(IoEngineKind::kPsync, IoEngineOptions{});
  ASSERT_TRUE(engine.is_ok());
  auto swap = SwapSpace::create(so, std::move(engine).value(), IoQueueOptions{});
  ASSERT_TRUE(swap.is_ok()) << swap.status().to_string();
  auto a = swap->allocate(768 << 10);
  ASSERT_TRUE(a.is_ok());
  auto b = swap->allocate(512 << 10);
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), ErrorCode::kNoSpace);
  EXPECT_NE(b.status().message().find("asked 512 KiB"), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("256 KiB free"), std::string::npos) << b.status().message();
  // Files are 0600 inside a directory we created.
  for (const std::string& f : swap->file_paths()) {
    struct stat st {};
    ASSERT_EQ(::stat(f.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(st.st_size, 1 << 20);
  }
}

TEST(SwapSpace, KeepFilesLeavesThemAndDefaultRemovesThem) {
  TempDir dir;
  for (bool keep : {false, true}) {
    SwapOptions so;
    so.paths = {dir.path(), dir.path()};
    so.bytes_per_path = 1 << 20;
    so.keep_files = keep;
    auto engine = make_io_engine(IoEngineKind::kPsync, IoEngineOptions{});
    ASSERT_TRUE(engine.is_ok());
    std::vector<std::string> files;
    {
      auto swap = SwapSpace::create(so, std::move(engine).value(), IoQueueOptions{});
      ASSERT_TRUE(swap.is_ok()) << swap.status().to_string();
      files = swap->file_paths();
      EXPECT_EQ(files.size(), 2u);
    }
    for (const std::string& f : files) EXPECT_EQ(std::filesystem::exists(f), keep) << f;
  }
}

// A swap directory left by a killed process is removed at the next start; one whose process
// still runs (here: our parent) or whose name holds no pid is left alone.
TEST(SwapSpace, RemovesSwapDirectoriesOfDeadProcesses) {
  TempDir dir;
  // A pid that cannot be running: past the kernel's pid_max.
  const std::string stale = dir.path() + "/tierzero-swap-2147483646-0";
  const std::string alive = dir.path() + "/tierzero-swap-" + std::to_string(::getppid()) + "-0";
  const std::string other = dir.path() + "/tierzero-swap-notapid";
  for (const std::string& d : {stale, alive, other}) {
    ASSERT_TRUE(std::filesystem::create_directory(d)) << d;
    std::ofstream(d + "/swap.0") << "left behind";
  }
  SwapOptions so;
  so.paths = {dir.path()};
  so.bytes_per_path = 1 << 20;
  auto engine = make_io_engine(IoEngineKind::kPsync, IoEngineOptions{});
  ASSERT_TRUE(engine.is_ok());
  auto swap = SwapSpace::create(so, std::move(engine).value(), IoQueueOptions{});
  ASSERT_TRUE(swap.is_ok()) << swap.status().to_string();
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(alive + "/swap.0"));
  EXPECT_TRUE(std::filesystem::exists(other + "/swap.0"));
}

TEST(SwapSpace, StripingSpreadsAnExtentOverEveryPath) {
  TempDir dir;
  SwapOptions so;
  so.paths = {dir.sub("a"), dir.sub("b"), dir.sub("c")};
  so.bytes_per_path = 1 << 20;
  so.stripe_bytes = 64 << 10;
  auto engine = make_io_engine(IoEngineKind::kPsync, IoEngineOptions{});
  ASSERT_TRUE(engine.is_ok());
  auto swap = SwapSpace::create(so, std::move(engine).value(), IoQueueOptions{});
  ASSERT_TRUE(swap.is_ok());
  auto e = swap->allocate(3 * (64 << 10));
  ASSERT_TRUE(e.is_ok());
  std::byte dummy[1];
  auto t = swap->transfers(IoOp::kRead, *e, 0, dummy, e->bytes);
  ASSERT_EQ(t.size(), 3u);
  // Logical stripe unit u lives on file u % 3 at offset (u / 3) * stripe.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(t[i].file, i);
    EXPECT_EQ(t[i].offset, 0u);
    EXPECT_EQ(t[i].len, 64u << 10);
  }
  auto mid = swap->transfers(IoOp::kRead, *e, 60 << 10, dummy, 8 << 10);
  ASSERT_EQ(mid.size(), 2u);
  EXPECT_EQ(mid[0].offset, 60u << 10);
  EXPECT_EQ(mid[1].file, 1);
  EXPECT_EQ(mid[1].offset, 0u);
}

}  // namespace
}  // namespace tz::nvme
