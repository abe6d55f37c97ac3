// A real full filesystem: a size-limited tmpfs (or, where tmpfs cannot be mounted, a file-backed
// ext4 loop device) fills up under psync writes; the error is ENOSPC naming the file and offset,
// and everything written before it reads back intact. Skipped with the reason when neither
// filesystem can be mounted (not root, no loop devices).
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "nvme/file.h"
#include "nvme/io_queue.h"
#include "nvme/nvme_test_util.h"
#include "nvme/swap_space.h"

namespace tz::nvme {
namespace {

using testing::TempDir;

// Mounts a tiny filesystem on a fresh directory; unmounts in the destructor.
class TinyFilesystem {
 public:
  explicit TinyFilesystem(const std::string& base) : mnt_(base + "/mnt") {
    std::filesystem::create_directories(mnt_);
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=8m,mode=0700") == 0) {
      kind_ = "tmpfs";
      return;
    }
    reason_ = std::string("mount tmpfs: ") + std::strerror(errno);
    // File-backed ext4 through a loop device.
    const std::string image = base + "/fs.img";
    const std::string cmd = "truncate -s 16M " + image + " && mkfs.ext4 -q -F " + image +
                            " >/dev/null 2>&1 && mount -o loop " + image + " " + mnt_ +
                            " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) {
      kind_ = "ext4-loop";
      return;
    }
    reason_ += "; loop-mounted ext4 also failed (needs root and loop devices)";
  }
  ~TinyFilesystem() {
    if (!kind_.empty() && ::umount2(mnt_.c_str(), MNT_DETACH) != 0) {
      std::fprintf(stderr, "umount %s: %s\n", mnt_.c_str(), std::strerror(errno));
    }
  }
  bool mounted() const { return !kind_.empty(); }
  const std::string& kind() const { return kind_; }
  const std::string& reason() const { return reason_; }
  const std::string& path() const { return mnt_; }

 private:
  std::string mnt_;
  std::string kind_;
  std::string reason_;
};

TEST(Enospc, FullFilesystemReportsNoSpaceAndKeepsEarlierData) {
  TempDir dir;
  TinyFilesystem fs(dir.path());
  if (!fs.mounted()) GTEST_SKIP() << fs.reason();
  std::printf("filesystem %s at %s\n", fs.kind().c_str(), fs.path().c_str());
  IoQueueOptions qo;
  qo.block_bytes = 256 << 10;
  qo.depth_per_file = 4;
  // psync through the page cache, as on a tmpfs swap path; no preallocation, so writes fill it.
  auto fq = testing::open_file_queue(fs.path() + "/swap.0", 0, IoEngineKind::kPsync, {}, qo,
                                     DirectMode::kOff);
  ASSERT_TRUE(fq.is_ok()) << fq.status().to_string();

  const std::uint64_t seed = 51;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const std::uint64_t chunk = 1 << 20;
  std::vector<std::vector<std::byte>> ok;
  Status failure;
  for (std::uint64_t i = 0; i < 32; ++i) {  // 32 MiB > the filesystem
    std::vector<std::byte> data(chunk);
    testing::fill_random(data.data(), data.size(), rng);
    Transfer t{IoOp::kWrite, fq->id, i * chunk, data.data(), chunk};
    Status st = fq->queue.run({&t, 1});
    if (!st.is_ok()) {
      failure = std::move(st);
      break;
    }
    ok.push_back(std::move(data));
  }
  ASSERT_FALSE(failure.is_ok()) << "32 MiB fit on a 16 MiB filesystem?";
  std::printf("after %zu MiB: %s\n", ok.size(), failure.to_string().c_str());
  EXPECT_EQ(failure.code(), ErrorCode::kNoSpace);
  EXPECT_EQ(failure.sys_code(), ENOSPC);
  EXPECT_NE(failure.message().find(fq->file.path()), std::string::npos);
  // The error names one of the failing chunk's blocks: its four blocks are in flight at once
  // (depth 4) and the first of them to complete with an error is the one named.
  bool names_a_block_of_the_chunk = false;
  for (std::uint64_t off = ok.size() * chunk; off < (ok.size() + 1) * chunk;
       off += qo.block_bytes) {
    if (failure.message().find("at offset " + std::to_string(off) + " ") != std::string::npos) {
      names_a_block_of_the_chunk = true;
    }
  }
  EXPECT_TRUE(names_a_block_of_the_chunk) << failure.message();
  ASSERT_GT(ok.size(), 2u);
  std::vector<std::byte> back(chunk);
  for (std::size_t i = 0; i < ok.size(); ++i) {
    Transfer t{IoOp::kRead, fq->id, i * chunk, back.data(), chunk};
    ASSERT_TRUE(fq->queue.run({&t, 1}).is_ok());
    ASSERT_EQ(std::memcmp(back.data(), ok[i].data(), chunk), 0) << "chunk " << i << " corrupted";
  }
}

TEST(Enospc, SwapSpaceLargerThanTheFilesystemFailsAtCreation) {
  TempDir dir;
  TinyFilesystem fs(dir.path());
  if (!fs.mounted()) GTEST_SKIP() << fs.reason();
  SwapOptions so;
  so.paths = {fs.path()};
  so.bytes_per_path = 64 << 20;
  so.direct = DirectMode::kPrefer;
  auto engine = make_io_engine(IoEngineKind::kPsync, IoEngineOptions{});
  ASSERT_TRUE(engine.is_ok());
  auto swap = SwapSpace::create(so, std::move(engine).value(), IoQueueOptions{});
  ASSERT_FALSE(swap.is_ok());
  const Status& st = swap.status();
  std::printf("%s\n", st.to_string().c_str());
  EXPECT_EQ(st.code(), ErrorCode::kNoSpace);
  EXPECT_NE(st.message().find("asked for 64.0 MiB"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("free"), std::string::npos) << st.message();
  // Nothing is left behind on the full filesystem.
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(fs.path())) {
    if (e.path().filename() != "lost+found") ++entries;
  }
  EXPECT_EQ(entries, 0u);
}

}  // namespace
}  // namespace tz::nvme
