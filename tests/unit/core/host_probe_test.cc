// core/host_probe.h: /proc/meminfo parsed from hand-written text (units, missing and malformed
// lines), this host's probes against the kernel's own answers read another way (getrlimit,
// statvfs), and a filesystem query that fails names the path.
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

}  // namespace
}  // namespace tz
