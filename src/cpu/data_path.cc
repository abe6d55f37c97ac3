// The host's data path (data_path.h): SIMD dispatch, huge pages for pinned staging, memlock.
#include "cpu/data_path.h"


#include <fstream>
#include <sstream>

#include "core/host_probe.h"
#include "core/units.h"
#include "cpu/pinned_pool.h"
#include "cpu/simd.h"

namespace tz::cpu {

namespace {

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return "";
  return line;
}

// "always [madvise] never" -> "madvise"; "" when the file is absent.
std::string bracketed(const std::string& line) {
  const auto a = line.find('['), b = line.find(']');
  if (a == std::string::npos || b == std::string::npos || b < a) return line;
  return line.substr(a + 1, b - a - 1);
}

// CAP_IPC_LOCK (bit 14) in the effective set of /proc/self/status.
bool has_cap_ipc_lock() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      std::uint64_t caps = 0;
      std::istringstream(line.substr(7)) >> std::hex >> caps;
      return (caps >> 14) & 1u;
    }
  }
  return false;
}

}  // namespace

DataPathReport data_path_report() {
  DataPathReport r;
  r.simd_target = simd_dispatch_target();
  const std::vector<std::string> compiled = simd_targets_compiled();
  const std::vector<std::string> supported = simd_targets_supported();
  for (const std::string& c : compiled) {
    bool ok = c == "reference";
    for (const std::string& s : supported) ok = ok || s == c;
    if (ok) {
      r.best_simd_target = c;
      break;
    }
  }
  const std::string thp = first_line("/sys/kernel/mm/transparent_hugepage/enabled");
  r.thp_mode = thp.empty() ? "absent" : bracketed(thp);
  const std::string defrag = first_line("/sys/kernel/mm/transparent_hugepage/defrag");
  r.thp_defrag = defrag.empty() ? "absent" : bracketed(defrag);
  const HostMemory mem = host_memory();
  r.hugepages_total = mem.hugepages_total;
  r.hugepages_free = mem.hugepages_free;
  const MemlockLimit memlock = memlock_limit();
  if (memlock.known) {
    r.memlock_unlimited = memlock.unlimited;
    r.memlock_limit_bytes = memlock.bytes;
  }
  r.cap_ipc_lock = has_cap_ipc_lock();

  // Measure rather than infer: the pool's own mapping path (MAP_HUGETLB, MADV_HUGEPAGE, then
  // MADV_COLLAPSE) on one 2 MiB slab.
  PinnedPoolOptions po;
  po.budget_bytes = 2ull << 20;
  po.slab_bytes = 2ull << 20;
  po.lock = MemlockPolicy::kOff;
  auto probe = PinnedPool::create(po);
  if (probe.is_ok()) {
    const std::vector<PinnedSlab> slabs = probe->slabs();
    r.staging_huge_pages = !slabs.empty() && slabs[0].huge_bytes == slabs[0].bytes;
    r.staging_source = !r.staging_huge_pages ? "none"
                       : slabs[0].hugetlb    ? "reserved huge pages"
                                             : "transparent huge pages";
  } else {
    r.staging_source = "none (" + probe.status().to_string() + ")";
  }

  if (r.simd_target != r.best_simd_target) {
    r.warnings.push_back("the CPU optimizer runs the " + r.simd_target + " kernels although " +
                         r.best_simd_target +
                         " is available: drop --simd (or set it to auto) for the fast path");
  } else if (r.simd_target != "AVX3" && r.simd_target != "AVX2") {
    r.warnings.push_back("the CPU optimizer runs the " + r.simd_target +
                         " kernels (this CPU has no AVX2/F16C): expect several times lower "
                         "update throughput than on an AVX2 or AVX-512 CPU");
  }
  if (!r.staging_huge_pages) {
    r.warnings.push_back(
        "pinned staging gets 4 KiB pages (THP " + r.thp_mode + ", " +
        std::to_string(r.hugepages_free) +
        " reserved huge pages free): registered NVMe requests are cut at the device's segment "
        "limit (about 1 MiB each) and staging costs more to fault in; reserve pages with "
        "`sysctl vm.nr_hugepages=<2 MiB pages>` or set "
        "`echo madvise > /sys/kernel/mm/transparent_hugepage/enabled`");
  }
  if (!r.memlock_unlimited && !r.cap_ipc_lock && r.memlock_limit_bytes < (1ull << 30)) {
    r.warnings.push_back("the memlock limit is " +
                         format_bytes(static_cast<double>(r.memlock_limit_bytes)) +
                         ": pinned staging above it stays unlocked (pages may move while I/O and "
                         "device copies use them); raise it with `ulimit -l unlimited`, "
                         "LimitMEMLOCK=infinity in systemd or --ulimit memlock=-1 in docker");
  }
  return r;
}

}  // namespace tz::cpu
