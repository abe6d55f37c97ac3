// core/host_probe.h: /proc/meminfo parsed from hand-written text (units, missing and malformed
// lines), this host's probes against the kernel's own answers read another way (getrlimit,
// statvfs), a filesystem query that fails names the path, and /proc/diskstats parsed from
// hand-written text and read for the block device under "/".
#include "core/host_probe.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <cstdint>
#include <string>

namespace tz {
namespace {

TEST(HostProbe, ParsesMeminfoFieldsInBytesAndCounts) {
  const HostMemory m = parse_meminfo(
      "MemTotal:       16318480 kB\n"
      "MemFree:         1000000 kB\n"
      "MemAvailable:    8159240 kB\n"
      "HugePages_Total:      12\n"
      "HugePages_Free:        5\n"
      "HugePages_Rsvd:        1\n"
      "Hugepagesize:       2048 kB\n"
      "Hugetlb:           24576 kB\n");
  EXPECT_TRUE(m.known);
  EXPECT_EQ(m.total_bytes, 16318480ull * 1024);
  EXPECT_EQ(m.available_bytes, 8159240ull * 1024);
  EXPECT_EQ(m.hugepages_total, 12u);  // a count: no kB, no scaling
  EXPECT_EQ(m.hugepages_free, 5u);
  EXPECT_EQ(m.hugepage_bytes, 2ull << 20);
}

TEST(HostProbe, MissingAndMalformedLinesLeaveZeros) {
  // No MemTotal: not known; a malformed value and a line without a colon are skipped; a key that
  // only starts like a known one ("MemAvailableX") is not taken for it; no trailing newline.
  const HostMemory m = parse_meminfo(
      "MemAvailable: lots kB\n"
      "garbage line\n"
      "MemAvailableX: 7 kB\n"
      "HugePages_Free: 3");
  EXPECT_FALSE(m.known);
  EXPECT_EQ(m.total_bytes, 0u);
  EXPECT_EQ(m.available_bytes, 0u);
  EXPECT_EQ(m.hugepages_free, 3u);
  EXPECT_EQ(m.hugepages_total, 0u);
  EXPECT_FALSE(parse_meminfo("").known);
}

TEST(HostProbe, ThisHostsMemoryIsConsistent) {
  const HostMemory m = host_memory();
  ASSERT_TRUE(m.known) << "/proc/meminfo has no MemTotal line";
  EXPECT_GT(m.total_bytes, 0u);
  EXPECT_LE(m.available_bytes, m.total_bytes);
  EXPECT_LE(m.hugepages_free, m.hugepages_total);
}

TEST(HostProbe, MemlockLimitMatchesGetrlimit) {
  rlimit rl{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
  const MemlockLimit l = memlock_limit();
  ASSERT_TRUE(l.known);
  EXPECT_EQ(l.unlimited, rl.rlim_cur == RLIM_INFINITY);
  EXPECT_EQ(l.bytes, l.unlimited ? 0u : static_cast<std::uint64_t>(rl.rlim_cur));
  EXPECT_EQ(memlock_limit_text(MemlockLimit{}), "unknown");
  EXPECT_EQ(memlock_limit_text(MemlockLimit{true, true, 0}), "unlimited");
  EXPECT_EQ(memlock_limit_text(MemlockLimit{true, false, 64ull << 20}), "64.0 MiB");
}

TEST(HostProbe, FilesystemSpaceMatchesStatvfsAndNamesAMissingPath) {
  struct statvfs vfs {};
  ASSERT_EQ(statvfs("/", &vfs), 0);
  const Result<FilesystemSpace> s = filesystem_space("/");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->total_bytes, static_cast<std::uint64_t>(vfs.f_blocks) * vfs.f_frsize);
  EXPECT_LE(s->free_bytes, s->total_bytes);
  const std::string missing = "/nonexistent-tierzero-host-probe/dir";
  const Result<FilesystemSpace> bad = filesystem_space(missing);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find(missing), std::string::npos) << bad.status().to_string();
}

// /proc/diskstats as Linux 6.x writes it (17 counters after the name; older kernels 11 or 15).
TEST(HostProbe, ParsesTheDevicesDiskstatsLine) {
  const std::string text =
      "   7       0 loop0 5 0 10 1 0 0 0 0 0 2 1 0 0 0 0 0 0\n"
      " 254       0 vda 1000 20 400000 900 2000 30 800000 1500 3 4100 2400 0 0 0 0 7 8\n"
      " 254       1 vda1 900 20 300000 800 1900 30 700000 1400 0 4000 2200 0 0 0 0 0 0\n"
      " 259       0 short 1 2 3\n";
  const DiskCounters d = parse_diskstats(text, "vda");
  ASSERT_TRUE(d.known);
  EXPECT_EQ(d.read_bytes, 400000ull * 512);
  EXPECT_EQ(d.write_bytes, 800000ull * 512);
  EXPECT_EQ(d.busy_ms, 4100u);
  EXPECT_EQ(d.queue_ms, 2400u);
  const DiskCounters part = parse_diskstats(text, "vda1");  // a partition is its own line
  ASSERT_TRUE(part.known);
  EXPECT_EQ(part.busy_ms, 4000u);
  EXPECT_FALSE(parse_diskstats(text, "short").known);  // too few fields
  EXPECT_FALSE(parse_diskstats(text, "vd").known);     // names match whole
  EXPECT_FALSE(parse_diskstats("", "vda").known);
  // 11 counters (before Linux 4.18) are enough.
  const DiskCounters old = parse_diskstats("8 0 sda 1 0 16 1 2 0 32 2 0 5 6\n", "sda");
  ASSERT_TRUE(old.known);
  EXPECT_EQ(old.write_bytes, 32u * 512);
  EXPECT_EQ(old.queue_ms, 6u);
}

TEST(HostProbe, BlockDeviceOfAPseudoFilesystemIsNotFound) {
  const Result<std::string> proc = block_device_of("/proc");
  ASSERT_FALSE(proc.is_ok());
  EXPECT_EQ(proc.status().code(), ErrorCode::kNotFound) << proc.status().to_string();
  EXPECT_NE(proc.status().message().find("/proc"), std::string::npos);
  const std::string missing = "/nonexistent-tierzero-host-probe/dir";
  const Result<std::string> bad = block_device_of(missing);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find(missing), std::string::npos) << bad.status().to_string();
}

// The device under "/" has counters in /proc/diskstats, and they only grow.
TEST(HostProbe, TheRootFilesystemsDeviceHasCounters) {
  const Result<std::string> dev = block_device_of("/");
  if (!dev.is_ok()) GTEST_SKIP() << "no block device under /: " << dev.status().to_string();
  const DiskCounters a = disk_counters(*dev);
  ASSERT_TRUE(a.known) << *dev << " has no line in /proc/diskstats";
  const DiskCounters b = disk_counters(*dev);
  ASSERT_TRUE(b.known);
  EXPECT_GE(b.read_bytes, a.read_bytes);
  EXPECT_GE(b.busy_ms, a.busy_ms);
}

}  // namespace
}  // namespace tz
