// What the host offers a run, read in one place: memory (/proc/meminfo: MemTotal, MemAvailable,
// reserved huge pages), the memlock limit (RLIMIT_MEMLOCK), a filesystem's free space (statvfs)
// and the counters of the disk under it (/proc/diskstats). `tierzero info`, `estimate`, the
// data-path report, the NVMe probe, swap-file sizing, the output rule and the step report's swap
// disks all read these through this header, so a field is parsed one way.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tz {

// The fields of /proc/meminfo a run sizes itself by; 0 when the line is absent or unreadable.
struct HostMemory {
  bool known = false;                 // /proc/meminfo was read and had a MemTotal line
  std::uint64_t total_bytes = 0;      // MemTotal
  std::uint64_t available_bytes = 0;  // MemAvailable
  std::uint64_t hugepages_total = 0;  // HugePages_Total: reserved (hugetlbfs) pages
  std::uint64_t hugepages_free = 0;   // HugePages_Free
  std::uint64_t hugepage_bytes = 0;   // Hugepagesize
};

// Parses the text of /proc/meminfo ("Key:   value [kB]" per line; kB values in bytes, counts as
// they are). Lines that do not parse are skipped. Pure: the unit test feeds it hand-written text.
HostMemory parse_meminfo(std::string_view text);
// /proc/meminfo of this host; `known` false (all zeros) when it cannot be read.
HostMemory host_memory();

// CPU seconds (user + system) this process has used so far, every thread of it (getrusage
// RUSAGE_SELF); 0 when the OS cannot tell.
double process_cpu_seconds();

// The soft RLIMIT_MEMLOCK of this process.
struct MemlockLimit {
  bool known = false;      // getrlimit answered
  bool unlimited = false;  // RLIM_INFINITY
  std::uint64_t bytes = 0;  // the limit when known and not unlimited
};
MemlockLimit memlock_limit();
// "unlimited", "unknown" or the limit as format_bytes writes it.
std::string memlock_limit_text(const MemlockLimit& limit);

// A filesystem's space as statvfs reports it to an unprivileged writer.
struct FilesystemSpace {
  std::uint64_t free_bytes = 0;   // f_bavail x f_frsize: what a non-root writer may still use
  std::uint64_t total_bytes = 0;  // f_blocks x f_frsize
};
// statvfs of `path` (any file or folder on the filesystem). Errors: the errno of statvfs, naming
// `path`.
Result<FilesystemSpace> filesystem_space(const std::string& path);

// One block device's cumulative counters in /proc/diskstats (the kernel's
// Documentation/admin-guide/iostats.rst). They count every process's I/O on the device.
struct DiskCounters {
  bool known = false;            // the device's line was found and had the fields below
  std::uint64_t read_bytes = 0;  // sectors read x 512
  std::uint64_t write_bytes = 0;
  std::uint64_t busy_ms = 0;   // io_ticks: milliseconds with at least one request in flight
  std::uint64_t queue_ms = 0;  // time_in_queue: milliseconds weighted by the requests in flight
};
// The line of `device` ("vda", "nvme0n1") in /proc/diskstats text ("major minor name reads
// ..."); `known` false when it is absent or too short. Pure: the unit test feeds it hand-written
// text.
DiskCounters parse_diskstats(std::string_view text, std::string_view device);
// /proc/diskstats's counters for each of `devices`, read once; `known` false for a device whose
// counters cannot be read.
std::vector<DiskCounters> disk_counters(const std::vector<std::string>& devices);
// What a device did between two readings `a` and `b` of its counters. `known` false when either
// is unknown or the sectors went down (the device went away and came back). The times are taken
// modulo 2^32, as the kernel prints them. Pure.
using DiskDelta = DiskCounters;
DiskDelta disk_delta(const DiskCounters& a, const DiskCounters& b);
// The disk a /sys/dev/block/MAJOR:MINOR link names: its last component, or for a partition
// (`partition`: the link's folder has a `partition` file) the disk above it, whose counters
// include every partition's I/O ("../../block/nvme0n1/nvme0n1p2" -> "nvme0n1"). Pure.
std::string block_device_name(const std::string& sysfs_link_target, bool partition);
// The disk that holds the filesystem `path` is on, by the name /proc/diskstats uses (stat's
// st_dev, then /sys/dev/block/MAJOR:MINOR; a partition's disk, a device-mapper or md device as it
// is). Errors: kNotFound when no block device is found (tmpfs, overlayfs, and btrfs and ZFS,
// whose st_dev is anonymous), the errno of stat naming `path`.
Result<std::string> block_device_of(const std::string& path);

}  // namespace tz
