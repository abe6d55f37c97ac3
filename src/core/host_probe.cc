// Host probes (host_probe.h): /proc/meminfo, RLIMIT_MEMLOCK, statvfs and /proc/diskstats behind
// one small API.
#include "core/host_probe.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/units.h"

namespace tz {
namespace {

// The next line of `text` (without its newline), which is advanced past it.
std::string_view next_line(std::string_view& text) {
  const std::size_t nl = text.find('\n');
  const std::string_view line = text.substr(0, nl);
  text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
  return line;
}

// The next blank-separated field of `line` (empty at its end), which is advanced past it.
std::string_view next_field(std::string_view& line) {
  const std::size_t b = line.find_first_not_of(" \t");
  if (b == std::string_view::npos) {
    line = {};
    return {};
  }
  line.remove_prefix(b);
  const std::size_t e = std::min(line.find_first_of(" \t"), line.size());
  const std::string_view field = line.substr(0, e);
  line.remove_prefix(e);
  return field;
}

// A /proc file's whole text; empty when it cannot be read.
std::string read_proc_text(const char* path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value of one "Key: value [kB]" line: bytes for kB, the bare number otherwise.
bool parse_meminfo_value(std::string_view rest, std::uint64_t* out) {
  const std::size_t begin = rest.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return false;
  rest.remove_prefix(begin);
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
  if (ec != std::errc()) return false;
  const std::string_view unit(end, static_cast<std::size_t>(rest.data() + rest.size() - end));
  *out = unit.find("kB") != std::string_view::npos ? v * 1024 : v;
  return true;
}

}  // namespace

HostMemory parse_meminfo(std::string_view text) {
  HostMemory m;
  while (!text.empty()) {
    const std::string_view line = next_line(text);
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, colon);
    std::uint64_t v = 0;
    if (!parse_meminfo_value(line.substr(colon + 1), &v)) continue;
    if (key == "MemTotal") {
      m.total_bytes = v;
      m.known = true;
    } else if (key == "MemAvailable") {
      m.available_bytes = v;
    } else if (key == "HugePages_Total") {
      m.hugepages_total = v;
    } else if (key == "HugePages_Free") {
      m.hugepages_free = v;
    } else if (key == "Hugepagesize") {
      m.hugepage_bytes = v;
    }
  }
  return m;
}

double process_cpu_seconds() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

HostMemory host_memory() { return parse_meminfo(read_proc_text("/proc/meminfo")); }

MemlockLimit memlock_limit() {
  MemlockLimit l;
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return l;
  l.known = true;
  l.unlimited = rl.rlim_cur == RLIM_INFINITY;
  if (!l.unlimited) l.bytes = static_cast<std::uint64_t>(rl.rlim_cur);
  return l;
}

std::string memlock_limit_text(const MemlockLimit& limit) {
  if (!limit.known) return "unknown";
  if (limit.unlimited) return "unlimited";
  return format_bytes(static_cast<double>(limit.bytes));
}

Result<FilesystemSpace> filesystem_space(const std::string& path) {
  struct statvfs vfs {};
  if (::statvfs(path.c_str(), &vfs) != 0) return Status::from_errno(errno, "statvfs", path);
  FilesystemSpace s;
  s.free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  s.total_bytes = static_cast<std::uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  return s;
}

DiskCounters parse_diskstats(std::string_view text, std::string_view device) {
  while (!text.empty()) {
    // Fields: major minor name, then the counters (iostats.rst numbers them from 1).
    std::string_view line = next_line(text);
    next_field(line);
    next_field(line);
    if (next_field(line) != device) continue;
    std::uint64_t v[11] = {};
    bool ok = true;
    for (std::size_t i = 0; i < 11 && ok; ++i) {
      const std::string_view f = next_field(line);
      ok = !f.empty() && std::from_chars(f.data(), f.data() + f.size(), v[i]).ec == std::errc();
    }
    if (!ok) continue;
    DiskCounters d;
    d.known = true;
    d.read_bytes = v[2] * 512;   // 3: sectors read
    d.write_bytes = v[6] * 512;  // 7: sectors written
    d.busy_ms = v[9];            // 10: io_ticks
    d.queue_ms = v[10];          // 11: time_in_queue
    return d;
  }
  return DiskCounters{};
}

std::vector<DiskCounters> disk_counters(const std::vector<std::string>& devices) {
  const std::string text = read_proc_text("/proc/diskstats");
  std::vector<DiskCounters> out;
  out.reserve(devices.size());
  for (const std::string& d : devices) out.push_back(parse_diskstats(text, d));
  return out;
}

DiskDelta disk_delta(const DiskCounters& a, const DiskCounters& b) {
  DiskDelta d;
  // Sectors only grow while the device stays; less means it went away and came back.
  if (!a.known || !b.known || b.read_bytes < a.read_bytes || b.write_bytes < a.write_bytes) {
    return d;
  }
  d.known = true;
  d.read_bytes = b.read_bytes - a.read_bytes;
  d.write_bytes = b.write_bytes - a.write_bytes;
  // The kernel prints both times as 32-bit milliseconds: across a wrap the difference modulo
  // 2^32 is the time that passed.
  d.busy_ms = static_cast<std::uint32_t>(b.busy_ms - a.busy_ms);
  d.queue_ms = static_cast<std::uint32_t>(b.queue_ms - a.queue_ms);
  return d;
}

std::string block_device_name(const std::string& sysfs_link_target, bool partition) {
  const std::filesystem::path t(sysfs_link_target);
  return (partition ? t.parent_path().filename() : t.filename()).string();
}

Result<std::string> block_device_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::from_errno(errno, "stat", path);
  const std::string dev = std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  const std::string link = "/sys/dev/block/" + dev;
  std::error_code ec;
  const std::filesystem::path target = std::filesystem::read_symlink(link, ec);
  if (ec) {
    return Status::not_found("no block device found for " + path + " (its filesystem's device " +
                             dev + " has no " + link + ": " + ec.message() + ")");
  }
  const bool partition = std::filesystem::exists(link + "/partition", ec);
  return block_device_name(target.string(), partition);
}

}  // namespace tz
