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
    const std::size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
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

HostMemory host_memory() {
  std::ifstream in("/proc/meminfo");
  if (!in) return HostMemory{};
  std::ostringstream text;
  text << in.rdbuf();
  return parse_meminfo(text.str());
}

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
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    // Fields: major minor name, then the counters (iostats.rst numbers them from 1).
    std::vector<std::string_view> fields;
    while (!line.empty()) {
      const std::size_t b = line.find_first_not_of(" \t");
      if (b == std::string_view::npos) break;
      line.remove_prefix(b);
      const std::size_t e = std::min(line.find_first_of(" \t"), line.size());
      fields.push_back(line.substr(0, e));
      line.remove_prefix(e);
    }
    if (fields.size() < 14 || fields[2] != device) continue;
    std::uint64_t v[11] = {};
    bool ok = true;
    for (std::size_t i = 0; i < 11 && ok; ++i) {
      const std::string_view f = fields[3 + i];
      ok = std::from_chars(f.data(), f.data() + f.size(), v[i]).ec == std::errc();
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

DiskCounters disk_counters(const std::string& device) {
  std::ifstream in("/proc/diskstats");
  if (!in) return DiskCounters{};
  std::ostringstream text;
  text << in.rdbuf();
  return parse_diskstats(text.str(), device);
}

Result<std::string> block_device_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::from_errno(errno, "stat", path);
  const std::string link = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" +
                           std::to_string(minor(st.st_dev));
  std::error_code ec;
  const std::filesystem::path target = std::filesystem::read_symlink(link, ec);
  if (ec) {
    return Status(ErrorCode::kNotFound, 0,
                  path + " is on no block device (" + link + ": " + ec.message() + ")");
  }
  return target.filename().string();
}

}  // namespace tz
