// core/host_probe.h: /proc/meminfo parsed from hand-written text (units, missing and malformed
// lines), this host's probes against the kernel's own answers read another way (getrlimit,
// statvfs), a filesystem query that fails names the path, /proc/diskstats parsed from
// hand-written text, counter deltas across a wrap and a reset, sysfs names against diskstats'
// and the disk under "/".
#include "core/host_probe.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

TEST(HostProbe, DiskDeltaWrapsTheTimesAndDropsAResetDevice) {
  DiskCounters a;
  a.known = true;
  a.read_bytes = 1000;
  a.write_bytes = 2000;
  a.busy_ms = 0xFFFFFF00u;  // 256 ms before the kernel's 32-bit milliseconds wrap
  a.queue_ms = 0xFFFFFFF0u;
  DiskCounters b = a;
  b.read_bytes = 5096;
  b.write_bytes = 2000;
  b.busy_ms = 0x100;  // wrapped: 512 ms later
  b.queue_ms = 0x10;
  const DiskDelta d = disk_delta(a, b);
  ASSERT_TRUE(d.known);
  EXPECT_EQ(d.read_bytes, 4096u);
  EXPECT_EQ(d.write_bytes, 0u);
  EXPECT_EQ(d.busy_ms, 512u);
  EXPECT_EQ(d.queue_ms, 32u);
  DiskCounters reset = b;
  reset.write_bytes = 10;  // fewer sectors than before: the device came back
  EXPECT_FALSE(disk_delta(a, reset).known);
  EXPECT_FALSE(disk_delta(DiskCounters{}, b).known);
}

TEST(HostProbe, APartitionCountsAsItsDisk) {
  EXPECT_EQ(block_device_name("../../devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p2",
                              true),
            "nvme0n1");
  EXPECT_EQ(block_device_name("../../devices/pci0000:00/0000:00:05.0/virtio2/block/vda", false),
            "vda");
  EXPECT_EQ(block_device_name("../../devices/virtual/block/dm-0", false), "dm-0");
}

// Every block device of this host: the name /sys/dev/block/MAJOR:MINOR gives is the one
// /proc/diskstats writes on that device's line.
TEST(HostProbe, SysfsNamesMatchDiskstatsNames) {
  std::ifstream in("/proc/diskstats");
  std::string line;
  int checked = 0;
  while (std::getline(in, line) && checked < 8) {
    std::istringstream fields(line);
    std::string major, minor, name;
    if (!(fields >> major >> minor >> name)) continue;
    const std::string link = "/sys/dev/block/" + major + ":" + minor;
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(link, ec);
    if (ec) continue;
    const bool partition = std::filesystem::exists(link + "/partition", ec);
    // A partition's own name is the link's last component; block_device_name maps it to its disk.
    EXPECT_EQ(block_device_name(target.string(), false), name) << link;
    if (partition) {
      EXPECT_NE(block_device_name(target.string(), true), name) << link;
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no /proc/diskstats line with a /sys/dev/block link";
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
  const std::vector<DiskCounters> a = disk_counters({*dev, "no-such-disk"});
  ASSERT_EQ(a.size(), 2u);
  ASSERT_TRUE(a[0].known) << *dev << " has no line in /proc/diskstats";
  EXPECT_FALSE(a[1].known);
  // A booted system has read its root filesystem.
  EXPECT_GT(a[0].read_bytes, 0u);
  const std::vector<DiskCounters> b = disk_counters({*dev});
  ASSERT_TRUE(b[0].known);
  EXPECT_TRUE(disk_delta(a[0], b[0]).known);
}

}  // namespace
}  // namespace tz
