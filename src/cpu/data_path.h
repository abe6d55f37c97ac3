// Which data path this host gives the CPU side of a training step: the SIMD target the optimizer
// kernels run, whether pinned staging gets 2 MiB pages (reserved pages, THP mode, MADV_COLLAPSE)
// and how much of it may be locked. `tierzero info`, `bench adam` and `bench nvme` report it and
// print the same warnings, each naming the setting that would take the fast path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tz::cpu {

struct DataPathReport {
  std::string simd_target;       // what optimizer steps dispatch to now
  std::string best_simd_target;  // the best compiled target this CPU supports
  std::string thp_mode;          // the bracketed word of .../transparent_hugepage/enabled, or "absent"
  std::string thp_defrag;        // likewise for .../defrag
  std::uint64_t hugepages_total = 0;  // reserved (hugetlbfs) pages of the default size
  std::uint64_t hugepages_free = 0;
  bool memlock_unlimited = false;
  std::uint64_t memlock_limit_bytes = 0;  // RLIMIT_MEMLOCK soft limit when not unlimited
  bool cap_ipc_lock = false;              // the process may lock any amount
  // Measured: a small pinned pool asked for huge pages got them, through `staging_source`
  // ("reserved huge pages", "transparent huge pages", or "none").
  bool staging_huge_pages = false;
  std::string staging_source;
  std::vector<std::string> warnings;  // one sentence per slow path, naming what to change
};

// Probes the host (reads /proc and /sys, maps and frees a 2 MiB pinned slab). Never fails: what
// cannot be read is reported as such.
DataPathReport data_path_report();

}  // namespace tz::cpu
