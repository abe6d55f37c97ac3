// Random offsets and sizes written and read back byte-exact through every backend, with 1, 2 and
// 3 striped paths, from pinned (registered) buffers on 2 MiB pages and on 4 KiB pages (the path
// of hosts without huge pages: one registered bvec per page); the reference is a plain in-memory
// copy.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "cpu/pinned_pool.h"
#include "nvme/io_queue.h"
#include "nvme/nvme_test_util.h"
#include "nvme/swap_space.h"
#include "store/pool_registration.h"

namespace tz::nvme {
namespace {

using testing::TempDir;

struct Case {
  IoEngineKind engine;
  int paths;
  DirectMode direct;
  bool huge_pages = true;  // false: the staging pool stays on 4 KiB pages
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(io_engine_name(info.param.engine)) + "_" + std::to_string(info.param.paths) +
         "paths" + (info.param.direct == DirectMode::kOff ? "_buffered" : "_direct") +
         (info.param.huge_pages ? "" : "_4kpages");
}

class Roundtrip : public ::testing::TestWithParam<Case> {};

TEST_P(Roundtrip, RandomExtentsAndRangesAreByteExact) {
  const Case c = GetParam();
  TempDir dir;
  SwapOptions so;
  for (int i = 0; i < c.paths; ++i) so.paths.push_back(dir.sub("drive" + std::to_string(i)));
  so.bytes_per_path = 12 << 20;
  so.stripe_bytes = 64 << 10;
  so.direct = c.direct;
  IoEngineOptions eo;
  eo.queue_depth = 16;
  auto engine = make_io_engine(c.engine, eo);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  IoQueueOptions qo;
  qo.block_bytes = 128 << 10;  // small blocks so transfers are cut into many requests
  qo.depth_per_file = 8;
  auto swap = SwapSpace::create(so, std::move(engine).value(), qo);
  ASSERT_TRUE(swap.is_ok()) << swap.status().to_string();
  EXPECT_EQ(swap->direct(), c.direct != DirectMode::kOff);

  PinnedPoolOptions po;
  po.budget_bytes = 4 << 20;
  po.slab_bytes = 4 << 20;
  po.huge_pages = c.huge_pages;
  auto pool = PinnedPool::create(po);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  if (!c.huge_pages) {
    EXPECT_EQ(pool->stats().huge_bytes, 0u);
  }
  ASSERT_TRUE(store::register_pool_with_queue(swap->queue(), *pool).is_ok());
  if (c.engine == IoEngineKind::kIoUring) {
    EXPECT_TRUE(swap->queue().engine().buffers_registered());
  }
  auto buf = pool->allocate(2 << 20);
  ASSERT_TRUE(buf.is_ok());

  const std::uint64_t seed =
      1000 + static_cast<std::uint64_t>(c.engine) * 10 + c.paths + (c.huge_pages ? 0 : 100);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  // Unaligned byte ranges are legal only on buffered files.
  const std::uint64_t grain = c.direct == DirectMode::kOff ? 1 : 4096;
  struct Live {
    SwapExtent extent;
    std::vector<std::byte> ref;
  };
  std::vector<Live> live;
  for (int step = 0; step < 150; ++step) {
    const int action = static_cast<int>(rng() % 10);
    if (live.empty() || action < 3) {
      auto e = swap->allocate(4096 + rng() % (1536 << 10));
      if (!e.is_ok()) {
        EXPECT_EQ(e.status().code(), ErrorCode::kNoSpace);
        continue;
      }
      Live l{*e, std::vector<std::byte>(e->bytes)};
      testing::fill_random(l.ref.data(), l.ref.size(), rng);
      std::memcpy(buf->data(), l.ref.data(), l.ref.size());
      ASSERT_TRUE(swap->write(l.extent, 0, buf->data(), l.extent.bytes).is_ok());
      live.push_back(std::move(l));
    } else if (action < 6) {
      Live& l = live[rng() % live.size()];
      const std::uint64_t units = l.extent.bytes / grain;
      const std::uint64_t off = (rng() % units) * grain;
      const std::uint64_t len = (1 + rng() % ((l.extent.bytes - off) / grain)) * grain;
      testing::fill_random(l.ref.data() + off, len, rng);
      std::memcpy(buf->data(), l.ref.data() + off, len);
      Status st = swap->write(l.extent, off, buf->data(), len);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
    } else if (action < 9) {
      Live& l = live[rng() % live.size()];
      const std::uint64_t units = l.extent.bytes / grain;
      const std::uint64_t off = (rng() % units) * grain;
      const std::uint64_t len = (1 + rng() % ((l.extent.bytes - off) / grain)) * grain;
      std::memset(buf->data(), 0xee, len);
      Status st = swap->read(l.extent, off, buf->data(), len);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      ASSERT_EQ(std::memcmp(buf->data(), l.ref.data() + off, len), 0)
          << "mismatch reading " << len << " bytes at " << off << " of extent " << l.extent.offset;
    } else {
      const std::size_t i = rng() % live.size();
      swap->free(live[i].extent);
      live.erase(live.begin() + static_cast<long>(i));
    }
  }
  // Every live extent reads back whole.
  for (const Live& l : live) {
    std::memset(buf->data(), 0, l.extent.bytes);
    ASSERT_TRUE(swap->read(l.extent, 0, buf->data(), l.extent.bytes).is_ok());
    ASSERT_EQ(std::memcmp(buf->data(), l.ref.data(), l.ref.size()), 0);
  }
  EXPECT_GT(swap->queue().stats().requests, 0u);
  EXPECT_EQ(swap->queue().engine().in_flight(), 0u);
  buf->reset();
  const auto files = swap->file_paths();
  swap = Status::internal("released");  // destroys the swap space: files and directories go
  for (const std::string& f : files) EXPECT_FALSE(std::filesystem::exists(f)) << f;
}

INSTANTIATE_TEST_SUITE_P(
    Engines, Roundtrip,
    ::testing::Values(Case{IoEngineKind::kIoUring, 1, DirectMode::kRequire},
                      Case{IoEngineKind::kIoUring, 2, DirectMode::kRequire},
                      Case{IoEngineKind::kIoUring, 3, DirectMode::kRequire},
                      Case{IoEngineKind::kLibaio, 1, DirectMode::kRequire},
                      Case{IoEngineKind::kLibaio, 2, DirectMode::kRequire},
                      Case{IoEngineKind::kLibaio, 3, DirectMode::kRequire},
                      Case{IoEngineKind::kPsync, 1, DirectMode::kRequire},
                      Case{IoEngineKind::kPsync, 2, DirectMode::kRequire},
                      Case{IoEngineKind::kPsync, 3, DirectMode::kRequire},
                      Case{IoEngineKind::kPsync, 2, DirectMode::kOff},
                      Case{IoEngineKind::kIoUring, 2, DirectMode::kOff},
                      Case{IoEngineKind::kIoUring, 1, DirectMode::kRequire, false},
                      Case{IoEngineKind::kIoUring, 2, DirectMode::kRequire, false},
                      Case{IoEngineKind::kLibaio, 2, DirectMode::kRequire, false},
                      Case{IoEngineKind::kPsync, 2, DirectMode::kRequire, false}),
    case_name);

}  // namespace
}  // namespace tz::nvme
