// Unit tests of the store: homes in every tier, round trips through NVMe over every I/O engine,
// registered buffers and grouping, zero-initialised blocks and Store::zero, write-only pins that
// skip the load, budget errors that name the tier, checksum mismatches caught on read (and bytes
// read back unchecked with checksums off), device events, and statistics that add up.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/xxhash.h"
#include "store/store.h"
#include "store_harness.h"

namespace tz::store {
namespace {

using testing::Harness;
using testing::HarnessOptions;

HarnessOptions small_options() {
  HarnessOptions o;
  o.store.device_budget_bytes = 512 << 10;
  o.store.host_budget_bytes = 512 << 10;
  o.store.chunk_bytes = 64 << 10;
  o.store.staging_buffers = 4;
  o.store.max_io_in_flight_bytes = 256 << 10;
  return o;
}

std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

void write_block(Store& s, BlockId id, Tier t, const std::vector<std::byte>& data) {
  auto lease = s.pin(id, t, Access::kWrite);
  ASSERT_TRUE(lease.is_ok()) << lease.status().to_string();
  ASSERT_TRUE(lease->wait().is_ok());
  std::memcpy(lease->data(), data.data(), data.size());
}

std::vector<std::byte> read_block(Store& s, BlockId id, Tier t, std::size_t n) {
  auto lease = s.pin(id, t, Access::kRead);
  EXPECT_TRUE(lease.is_ok()) << lease.status().to_string();
  if (!lease.is_ok()) return {};
  Status st = lease->wait();
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  if (!st.is_ok()) return {};
  std::vector<std::byte> out(n);
  std::memcpy(out.data(), lease->data(), n);
  return out;
}

TEST(Store, NewBlocksReadAsZerosInEveryHome) {
  Harness h;
  h.init(small_options());
  for (Tier home : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    auto id = h.store->create_block(100000, home, std::string("b-") + tier_name(home));
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    for (Tier t : {Tier::kDevice, Tier::kHost}) {
      if (static_cast<int>(t) > static_cast<int>(home)) continue;
      auto data = read_block(*h.store, *id, t, 100000);
      EXPECT_EQ(data, std::vector<std::byte>(100000, std::byte{0}))
          << "home " << tier_name(home) << " pinned in " << tier_name(t);
    }
  }
  h.finish();
}

// Over the I/O matrix (engine x registered buffers x grouping); the combination is the test's
// name and is printed with every failure.
class StoreIo : public ::testing::TestWithParam<testing::IoCase> {};

TEST_P(StoreIo, RoundTripThroughNvmeUnderTinyBudgets) {
  // Six 200 KB blocks on NVMe through a 512 KiB device and host: every read must see its write.
  SCOPED_TRACE("I/O case " + testing::io_case_name(GetParam()));
  Harness h;
  HarnessOptions o = small_options();
  testing::apply_io_case(GetParam(), o);
  h.init(o);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const std::size_t n = 200000;
  std::vector<BlockId> ids;
  for (int i = 0; i < 6; ++i) {
    auto id = h.store->create_block(n, Tier::kNvme, "layer" + std::to_string(i));
    ASSERT_TRUE(id.is_ok());
    ids.push_back(*id);
  }
  for (int i = 0; i < 6; ++i) write_block(*h.store, ids[i], i % 2 ? Tier::kHost : Tier::kDevice,
                                          pattern(n, 100 + i));
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 6; ++i) {
      const Tier t = (i + round) % 2 ? Tier::kDevice : Tier::kHost;
      EXPECT_EQ(read_block(*h.store, ids[i], t, n), pattern(n, 100 + i))
          << "block " << i << " round " << round << " in " << tier_name(t);
    }
  }
  ASSERT_TRUE(h.store->drain().is_ok());
  const StoreStats st = h.store->stats();
  EXPECT_GT(st.nvme_write_bytes(), 0u);
  EXPECT_GT(st.nvme_read_bytes(), 0u);
  EXPECT_LE(st.tier(Tier::kDevice).peak_bytes, 512u << 10);
  EXPECT_LE(st.tier(Tier::kHost).peak_bytes, 512u << 10);
  EXPECT_EQ(st.checksum_failures, 0u);
  h.finish();
}

INSTANTIATE_TEST_SUITE_P(Matrix, StoreIo, ::testing::ValuesIn(testing::io_cases()),
                         testing::io_param_name);

TEST(Store, WriteOnlyPinSkipsTheLoad) {
  Harness h;
  h.init(small_options());
  const std::size_t n = 300000;
  auto a = h.store->create_block(n, Tier::kNvme, "a");
  auto b = h.store->create_block(n, Tier::kNvme, "b");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  write_block(*h.store, *a, Tier::kDevice, pattern(n, 1));
  write_block(*h.store, *b, Tier::kDevice, pattern(n, 2));  // evicts a (written back)
  ASSERT_TRUE(h.store->drain().is_ok());
  const std::uint64_t reads_before = h.store->stats().nvme_read_bytes();
  write_block(*h.store, *a, Tier::kDevice, pattern(n, 3));  // overwrite: no read of a
  ASSERT_TRUE(h.store->drain().is_ok());
  EXPECT_EQ(h.store->stats().nvme_read_bytes(), reads_before);
  EXPECT_EQ(read_block(*h.store, *a, Tier::kHost, n), pattern(n, 3));
  EXPECT_EQ(read_block(*h.store, *b, Tier::kHost, n), pattern(n, 2));
  h.finish();
}

TEST(Store, PinPastTheBudgetNamesTierBudgetAndPins) {
  Harness h;
  h.init(small_options());
  auto a = h.store->create_block(300000, Tier::kNvme, "alpha");
  auto b = h.store->create_block(300000, Tier::kNvme, "beta");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto la = h.store->pin(*a, Tier::kDevice, Access::kRead);
  ASSERT_TRUE(la.is_ok());
  auto lb = h.store->pin(*b, Tier::kDevice, Access::kRead);
  ASSERT_FALSE(lb.is_ok());
  EXPECT_EQ(lb.status().code(), ErrorCode::kOutOfMemory);
  const std::string& msg = lb.status().message();
  EXPECT_NE(msg.find("device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("budget 512"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'alpha'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'beta'"), std::string::npos) << msg;
  la->release();
  auto again = h.store->pin(*b, Tier::kDevice, Access::kRead);
  EXPECT_TRUE(again.is_ok()) << again.status().to_string();
  ASSERT_TRUE(again->wait().is_ok());
  again->release();
  h.finish();
}

// Drops the host tier's clean copies (small_options' 512 KiB) by writing a block that fills it.
void fill_host_tier(Harness& h) {
  auto filler = h.store->create_block(500000, Tier::kNvme, "filler");
  ASSERT_TRUE(filler.is_ok());
  {
    auto l = h.store->pin(*filler, Tier::kHost, Access::kWrite);
    ASSERT_TRUE(l.is_ok());
  }
  ASSERT_TRUE(h.store->drain().is_ok());
}

// Writes `n` bytes of pattern 7 to a new NVMe-homed block "victim" (*out), pushes them to the
// swap file, drops the cached copies, and flips byte 1000 of the block on the disk.
void corrupt_on_disk(Harness& h, std::size_t n, BlockId* out) {
  auto a = h.store->create_block(n, Tier::kNvme, "victim");
  ASSERT_TRUE(a.is_ok());
  *out = *a;
  write_block(*h.store, *a, Tier::kHost, pattern(n, 7));
  // Push it to NVMe with a read pin on the NVMe tier (the write-back), then drop the host copy by
  // filling the host tier with another block.
  {
    auto l = h.store->pin(*a, Tier::kNvme, Access::kRead);
    ASSERT_TRUE(l.is_ok());
    ASSERT_TRUE(l->wait().is_ok());
  }
  ASSERT_NO_FATAL_FAILURE(fill_host_tier(h));
  // Flip one byte of the swap file where the block lives (the first extent, offset 0).
  ASSERT_EQ(h.swap_files.size(), 1u);
  const int fd = ::open(h.swap_files[0].c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, 1000), 1);
  byte ^= 0x5a;
  ASSERT_EQ(::pwrite(fd, &byte, 1, 1000), 1);
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
}

TEST(Store, ChecksumMismatchIsAnErrorNamingTheBlock) {
  Harness h;
  h.init(small_options());
  const std::size_t n = 200000;
  BlockId a = 0;
  ASSERT_NO_FATAL_FAILURE(corrupt_on_disk(h, n, &a));
  auto l = h.store->pin(a, Tier::kDevice, Access::kRead);
  ASSERT_TRUE(l.is_ok());
  // The ready event is never handed out for the bad bytes (the staging buffer is hashed while its
  // copy to the device runs; the load fails before its event is issued).
  auto ev = l->ready_event();
  EXPECT_EQ(ev.status().code(), ErrorCode::kCorrupt) << ev.status().to_string();
  Status st = l->wait();
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
  EXPECT_NE(st.message().find("'victim'"), std::string::npos) << st.to_string();
  l->release();
  EXPECT_EQ(h.store->stats().checksum_failures, 1u);
  // Overwriting the block makes it usable again.
  write_block(*h.store, a, Tier::kDevice, pattern(n, 8));
  EXPECT_EQ(read_block(*h.store, a, Tier::kHost, n), pattern(n, 8));
  h.finish();
}

// tierzero.nvme_checksums false: nothing is hashed, so the disk's bytes come back as they are,
// through the host tier and through staging to the device alike, and no read fails.
TEST(Store, WithoutChecksumsTheDisksBytesComeBackUnchecked) {
  for (Tier t : {Tier::kHost, Tier::kDevice}) {
    SCOPED_TRACE(std::string("read into ") + tier_name(t));
    Harness h;
    HarnessOptions o = small_options();
    o.store.checksums = false;
    h.init(o);
    const std::size_t n = 200000;
    BlockId a = 0;
    ASSERT_NO_FATAL_FAILURE(corrupt_on_disk(h, n, &a));
    std::vector<std::byte> expected = pattern(n, 7);
    expected[1000] ^= std::byte{0x5a};
    EXPECT_EQ(read_block(*h.store, a, t, n), expected);
    EXPECT_EQ(h.store->stats().checksum_failures, 0u);
    h.finish();
  }
}

// The piece sums of `data` in pieces of `piece` bytes (what Lease::release_hashed takes).
std::vector<std::uint64_t> piece_sums(const std::vector<std::byte>& data, std::uint64_t piece) {
  std::vector<std::uint64_t> sums;
  for (std::size_t off = 0; off < data.size(); off += piece) {
    const std::size_t len = std::min<std::size_t>(piece, data.size() - off);
    sums.push_back(XXH3_64bits(data.data() + off, len));
  }
  return sums;
}

// Writes `data` to `id` through a host write pin released with `sums` (Lease::release_hashed).
void write_hashed(Store& s, BlockId id, const std::vector<std::byte>& data,
                  const std::vector<std::uint64_t>& sums) {
  auto lease = s.pin(id, Tier::kHost, Access::kWrite);
  ASSERT_TRUE(lease.is_ok()) << lease.status().to_string();
  ASSERT_TRUE(lease->wait().is_ok());
  std::memcpy(lease->data(), data.data(), data.size());
  lease->release_hashed(sums);
}

// Sends the dirty host copies home (flush) and drops them, so that the next read comes from the
// disk and is checked against the sums the write stored.
void write_home_and_drop(Harness& h) {
  ASSERT_TRUE(h.store->flush().is_ok());
  ASSERT_NO_FATAL_FAILURE(fill_host_tier(h));
}

// A host copy's writer that hashed its bytes hands the sums in; the write-back stores them
// without hashing, and the read back is checked against them: handed-in sums that do not match
// the bytes make that read fail, so they are the ones stored.
TEST(Store, WriteBackUsesTheSumsItsWriterHandedIn) {
  const std::size_t n = 200000;
  const std::vector<std::byte> data = pattern(n, 41);
  for (bool right : {true, false}) {
    SCOPED_TRACE(right ? "the bytes' sums" : "piece 1's sum wrong");
    Harness h;
    h.init(small_options());
    auto a = h.store->create_block(n, Tier::kNvme, "hashed");
    ASSERT_TRUE(a.is_ok());
    const std::uint64_t piece = h.store->hashed_piece_bytes(*a);
    ASSERT_EQ(piece, 64u << 10);
    std::vector<std::uint64_t> sums = piece_sums(data, piece);
    if (!right) sums[1] ^= 1;
    ASSERT_NO_FATAL_FAILURE(write_hashed(*h.store, *a, data, sums));
    ASSERT_NO_FATAL_FAILURE(write_home_and_drop(h));
    EXPECT_EQ(h.store->stats().writer_hashed_bytes, n);
    auto l = h.store->pin(*a, Tier::kHost, Access::kRead);
    ASSERT_TRUE(l.is_ok());
    Status st = l->wait();
    if (right) {
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_EQ(std::memcmp(l->data(), data.data(), n), 0);
      EXPECT_EQ(h.store->stats().checksum_failures, 0u);
    } else {
      EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
      EXPECT_NE(st.message().find("piece 1 "), std::string::npos) << st.to_string();
    }
    l->release();
    h.finish();
  }
}

// Sums describe the bytes only until they change: a later write pin, or a second writer of the
// copy in either order, leaves the write-back to hash the bytes itself. (Wrong sums handed in:
// were they used, the read back would fail.)
TEST(Store, HandedInSumsAreDroppedWhenTheBytesMayHaveChanged) {
  const std::size_t n = 200000;
  const std::vector<std::byte> data = pattern(n, 42);
  std::vector<std::uint64_t> wrong = piece_sums(data, 64 << 10);
  for (std::uint64_t& x : wrong) x ^= 1;
  for (int c = 0; c < 3; ++c) {
    SCOPED_TRACE(c == 0   ? "a later write pin"
                 : c == 1 ? "two writers, the first hands sums in"
                          : "two writers, the second hands sums in after the first left");
    Harness h;
    h.init(small_options());
    auto a = h.store->create_block(n, Tier::kNvme, "rewritten");
    ASSERT_TRUE(a.is_ok());
    if (c == 0) {
      ASSERT_NO_FATAL_FAILURE(write_hashed(*h.store, *a, data, wrong));
      auto l = h.store->pin(*a, Tier::kHost, Access::kReadWrite);
      ASSERT_TRUE(l.is_ok() && l->wait().is_ok());
      l->release();
    } else {
      auto first = h.store->pin(*a, Tier::kHost, Access::kWrite);
      auto second = h.store->pin(*a, Tier::kHost, Access::kWrite);
      ASSERT_TRUE(first.is_ok() && second.is_ok());
      ASSERT_TRUE(first->wait().is_ok() && second->wait().is_ok());
      if (c == 1) {
        std::memcpy(second->data(), data.data(), n);
        first->release_hashed(wrong);
        second->release();
      } else {
        std::memcpy(first->data(), data.data(), n);
        first->release();
        second->release_hashed(wrong);
      }
    }
    ASSERT_NO_FATAL_FAILURE(write_home_and_drop(h));
    EXPECT_EQ(h.store->stats().writer_hashed_bytes, 0u);
    EXPECT_EQ(read_block(*h.store, *a, Tier::kHost, n), data);
    EXPECT_EQ(h.store->stats().checksum_failures, 0u);
    h.finish();
  }
}

TEST(Store, NothingToHashWithoutNvmeOrChecksums) {
  Harness h;
  HarnessOptions o = small_options();
  h.init(o);
  auto host = h.store->create_block(1000, Tier::kHost, "host-homed");
  ASSERT_TRUE(host.is_ok());
  EXPECT_EQ(h.store->hashed_piece_bytes(*host), 0u);
  h.finish();
  Harness off;
  o.store.checksums = false;
  off.init(o);
  auto a = off.store->create_block(1000, Tier::kNvme, "unchecked");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(off.store->hashed_piece_bytes(*a), 0u);
  off.finish();
}

TEST(Store, FlushWritesDirtyCopiesHomeAndKeepsThemCached) {
  Harness h;
  h.init(small_options());
  const std::size_t n = 200000;
  auto a = h.store->create_block(n, Tier::kNvme, "on-nvme");
  auto b = h.store->create_block(n, Tier::kHost, "on-host");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  write_block(*h.store, *a, Tier::kDevice, pattern(n, 21));
  write_block(*h.store, *b, Tier::kDevice, pattern(n, 22));
  ASSERT_TRUE(h.store->drain().is_ok());
  EXPECT_EQ(h.store->stats().nvme_write_bytes(), 0u);  // both dirty on the device
  ASSERT_TRUE(h.store->flush().is_ok());
  StoreStats st = h.store->stats();
  EXPECT_EQ(st.nvme_write_bytes(), n);
  EXPECT_EQ(st.link(Link::kDeviceToHost).bytes, n);  // b's home is the host tier
  // The NVMe block's bytes are in the swap file (its only extent starts at offset 0).
  ASSERT_EQ(h.swap_files.size(), 1u);
  const int fd = ::open(h.swap_files[0].c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::vector<std::byte> on_disk(n);
  ASSERT_EQ(::pread(fd, on_disk.data(), n, 0), static_cast<ssize_t>(n));
  ::close(fd);
  EXPECT_EQ(on_disk, pattern(n, 21));
  // Nothing is dirty any more, and the copies stayed cached: no second write, no read.
  ASSERT_TRUE(h.store->flush().is_ok());
  EXPECT_EQ(read_block(*h.store, *a, Tier::kDevice, n), pattern(n, 21));
  EXPECT_EQ(read_block(*h.store, *b, Tier::kHost, n), pattern(n, 22));
  ASSERT_TRUE(h.store->drain().is_ok());
  st = h.store->stats();
  EXPECT_EQ(st.nvme_write_bytes(), n);
  EXPECT_EQ(st.nvme_read_bytes(), 0u);
  h.finish();
}

// Store::zero: the copies are zeroed where they are and none is dirty, so the zeros never go
// to the disk, and a load from the NVMe home after the copies were evicted reads nothing.
TEST(Store, ZeroMovesNoBytesAndTheBlockReadsAsZerosEverywhere) {
  Harness h;
  h.init(small_options());
  const std::size_t n = 200000;
  const std::vector<std::byte> zeros(n, std::byte{0});
  auto a = h.store->create_block(n, Tier::kNvme, "accumulator");
  auto f1 = h.store->create_block(n, Tier::kNvme, "filler-1");
  auto f2 = h.store->create_block(n, Tier::kNvme, "filler-2");
  ASSERT_TRUE(a.is_ok() && f1.is_ok() && f2.is_ok());
  // Written home once (the extent holds data), then dirty again in the host tier and loaded
  // into the device too.
  write_block(*h.store, *a, Tier::kHost, pattern(n, 31));
  ASSERT_TRUE(h.store->flush().is_ok());
  write_block(*h.store, *a, Tier::kHost, pattern(n, 32));
  EXPECT_EQ(read_block(*h.store, *a, Tier::kDevice, n), pattern(n, 32));
  ASSERT_TRUE(h.store->drain().is_ok());
  h.store->reset_stats();

  ASSERT_TRUE(h.store->zero(*a).is_ok());
  EXPECT_EQ(read_block(*h.store, *a, Tier::kDevice, n), zeros);
  EXPECT_EQ(read_block(*h.store, *a, Tier::kHost, n), zeros);
  ASSERT_TRUE(h.store->flush().is_ok());  // nothing dirty: no write
  EXPECT_EQ(h.store->stats().nvme_write_bytes(), 0u);

  // Each upper tier (512 KiB) holds two of the three blocks: pinning both fillers in the device
  // tier, then in the host tier, evicts both zeroed copies, clean, with no write-back; the next
  // load can only come from the NVMe home, and is a zero fill.
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    auto l1 = h.store->pin(*f1, t, Access::kWrite);
    auto l2 = h.store->pin(*f2, t, Access::kWrite);
    ASSERT_TRUE(l1.is_ok() && l2.is_ok()) << tier_name(t);
    ASSERT_TRUE(l1->wait().is_ok() && l2->wait().is_ok()) << tier_name(t);
  }
  ASSERT_TRUE(h.store->drain().is_ok());
  EXPECT_EQ(h.store->stats().nvme_write_bytes(), 0u);
  EXPECT_EQ(read_block(*h.store, *a, Tier::kHost, n), zeros);
  ASSERT_TRUE(h.store->drain().is_ok());
  EXPECT_EQ(h.store->stats().nvme_read_bytes(), 0u);
  EXPECT_EQ(h.store->stats().link(Link::kDeviceToHost).bytes, 0u);  // not from a device copy
  EXPECT_TRUE(h.store->check_invariants().is_ok());

  // Written again after the zero, the block's bytes go home and come back as written.
  write_block(*h.store, *a, Tier::kHost, pattern(n, 35));
  ASSERT_TRUE(h.store->flush().is_ok());
  EXPECT_EQ(read_block(*h.store, *a, Tier::kDevice, n), pattern(n, 35));

  // A pinned block cannot be zeroed; an unknown one is named.
  {
    auto lease = h.store->pin(*a, Tier::kHost, Access::kRead);
    ASSERT_TRUE(lease.is_ok());
    EXPECT_EQ(h.store->zero(*a).code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(h.store->zero(9999).code(), ErrorCode::kInvalidArgument);
  h.finish();
}

TEST(Store, FlushSkipsBlocksPinnedForWriting) {
  Harness h;
  h.init(small_options());
  const std::size_t n = 100000;
  auto a = h.store->create_block(n, Tier::kNvme, "busy");
  ASSERT_TRUE(a.is_ok());
  auto lease = h.store->pin(*a, Tier::kHost, Access::kWrite);
  ASSERT_TRUE(lease.is_ok());
  ASSERT_TRUE(lease->wait().is_ok());
  ASSERT_TRUE(h.store->flush().is_ok());
  EXPECT_EQ(h.store->stats().nvme_write_bytes(), 0u);
  lease->release();
  ASSERT_TRUE(h.store->flush().is_ok());
  EXPECT_EQ(h.store->stats().nvme_write_bytes(), n);
  h.finish();
}

TEST(Store, FlushReportsAFailedWriteNamingTheBlock) {
  Harness h;
  HarnessOptions o = small_options();
  nvme::FaultOptions f;
  f.eio_on_request = 1;  // the first request the disk sees: the flush's write
  o.faults = f;
  h.init(o);
  const std::size_t n = 100000;
  auto a = h.store->create_block(n, Tier::kNvme, "doomed");
  ASSERT_TRUE(a.is_ok());
  write_block(*h.store, *a, Tier::kHost, pattern(n, 5));
  Status st = h.store->flush();
  EXPECT_EQ(st.code(), ErrorCode::kIoError) << st.to_string();
  EXPECT_NE(st.message().find("'doomed'"), std::string::npos) << st.to_string();
  // The block lost its bytes: the next flush says so again, and read pins fail.
  EXPECT_FALSE(h.store->flush().is_ok());
  auto l = h.store->pin(*a, Tier::kHost, Access::kRead);
  EXPECT_FALSE(l.is_ok());
  h.finish();
}

TEST(Store, DevicePinExposesAnEventAStreamCanWaitOn) {
  Harness h;
  h.init(small_options());
  const std::size_t n = 250000;
  auto a = h.store->create_block(n, Tier::kNvme, "a");
  ASSERT_TRUE(a.is_ok());
  write_block(*h.store, *a, Tier::kHost, pattern(n, 11));
  auto l = h.store->pin(*a, Tier::kDevice, Access::kRead);
  ASSERT_TRUE(l.is_ok());
  auto ev = l->ready_event();
  ASSERT_TRUE(ev.is_ok()) << ev.status().to_string();
  // Copy the pinned bytes on the compute stream after the event; the result must be the data.
  auto out = h.device->allocate(n);
  ASSERT_TRUE(out.is_ok());
  gpu::Stream& cs = h.device->compute_stream();
  ASSERT_TRUE(cs.wait(**ev).is_ok());
  void* src = l->data();
  ASSERT_TRUE(h.device->copy_async(out->data(), src, n, gpu::CopyKind::kDeviceToDevice, cs).is_ok());
  l->release(&cs);
  ASSERT_TRUE(cs.synchronize().is_ok());
  std::vector<std::byte> got(n);
  std::memcpy(got.data(), out->data(), n);
  EXPECT_EQ(got, pattern(n, 11));
  out->reset();
  h.finish();
}

TEST(Store, StatisticsExportJson) {
  Harness h;
  h.init(small_options());
  auto a = h.store->create_block(100000, Tier::kNvme, "a");
  ASSERT_TRUE(a.is_ok());
  write_block(*h.store, *a, Tier::kHost, pattern(100000, 3));
  (void)read_block(*h.store, *a, Tier::kHost, 100000);
  const StoreStats st = h.store->stats();
  EXPECT_EQ(st.tier(Tier::kHost).misses, 1u);
  EXPECT_EQ(st.tier(Tier::kHost).hits, 1u);
  const std::string j = st.to_json();
  EXPECT_NE(j.find("\"nvme_read_bytes\""), std::string::npos);
  EXPECT_NE(j.find("\"host_to_device\""), std::string::npos);
  h.finish();
}

// Per-block counters: a block only read after the counters are reset is never written to its
// home, however often it is loaded and evicted; a block written three times reaches its home
// once, at the flush (LRU keeps evicted device copies in the host tier, which holds both blocks,
// and each new write pin drops the stale host copy); and the blocks' counters add up to the
// tiers'. The device holds one block: each pin evicts the other.
TEST(Store, BlockCountersShowWhatWasWrittenHome) {
  HarnessOptions o = small_options();
  o.store.policy = Policy::kLru;
  o.store.host_budget_bytes = 1 << 20;
  Harness h;
  h.init(o);
  constexpr std::uint64_t kBytes = 300000;  // one fits the 512 KiB device budget, two the host
  auto a = h.store->create_block(kBytes, Tier::kNvme, "frozen");
  auto b = h.store->create_block(kBytes, Tier::kNvme, "trained");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  write_block(*h.store, *a, Tier::kDevice, pattern(kBytes, 5));
  ASSERT_TRUE(h.store->flush().is_ok());
  auto written = h.store->block_stats(*a);
  ASSERT_TRUE(written.is_ok());
  EXPECT_EQ(written->tier_bytes_in(Tier::kNvme), kBytes);  // the flush wrote it home
  EXPECT_EQ(written->tier_bytes_in(Tier::kDevice), 0u);    // a write pin loads nothing
  h.store->reset_stats();
  EXPECT_EQ(h.store->block_stats(*a)->tier_bytes_in(Tier::kNvme), 0u);
  for (int i = 0; i < 3; ++i) {
    (void)read_block(*h.store, *a, Tier::kDevice, kBytes);
    write_block(*h.store, *b, Tier::kDevice, pattern(kBytes, 10 + static_cast<std::uint64_t>(i)));
  }
  ASSERT_TRUE(h.store->flush().is_ok());
  const BlockStats frozen = h.store->block_stats(*a).value();
  const BlockStats trained = h.store->block_stats(*b).value();
  EXPECT_EQ(frozen.tier_bytes_in(Tier::kNvme), 0u);
  // Loaded from its host copy in rounds 2 and 3 (round 1 found the flushed device copy).
  EXPECT_EQ(frozen.tier_bytes_in(Tier::kDevice), 2 * kBytes);
  EXPECT_EQ(trained.tier_bytes_in(Tier::kNvme), kBytes);
  const StoreStats st = h.store->stats();
  for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    EXPECT_EQ(frozen.tier_bytes_in(t) + trained.tier_bytes_in(t), st.tier(t).bytes_in)
        << tier_name(t);
  }
  EXPECT_EQ(h.store->block_stats(999).status().code(), ErrorCode::kInvalidArgument);
  h.finish();
}

TEST(Store, BadArgumentsAreRejected) {
  Harness h;
  h.init(small_options());
  EXPECT_EQ(h.store->create_block(0, Tier::kHost, "z").status().code(),
            ErrorCode::kInvalidArgument);
  auto d = h.store->create_block(1000, Tier::kDevice, "d");
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(h.store->pin(*d, Tier::kHost, Access::kRead).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(h.store->pin(999, Tier::kHost, Access::kRead).status().code(),
            ErrorCode::kInvalidArgument);
  auto l = h.store->pin(*d, Tier::kDevice, Access::kRead);
  ASSERT_TRUE(l.is_ok());
  EXPECT_EQ(h.store->destroy_block(*d).code(), ErrorCode::kInvalidArgument);
  l->release();
  EXPECT_TRUE(h.store->destroy_block(*d).is_ok());
  h.finish();
}

}  // namespace
}  // namespace tz::store
