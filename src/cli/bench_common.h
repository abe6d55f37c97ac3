// The harness every `tierzero bench` command shares (STYLE.md, "Benchmarks"): one result type
// that prints a run's records as JSON lines or as the human table (BenchReport), the median of
// repeated timings and the machine a result was measured on, and the ceilings a bench holds its
// figures against (the disk through the tiered stack's own swap space, host<->device copies,
// memcpy), each measured once per run where a bench needs it. Benches build the tiered stack
// through store/stack.h (prepare_stack/open_store or build_stack); a run() reads as parse ->
// build -> measure -> report.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "cpu/pinned_pool.h"
#include "gpu/device.h"
#include "nvme/swap_space.h"
#include "store/stack.h"
#include "zero/engine.h"

namespace tz::cli {

// The median of `samples` (the mean of the middle two for an even count); 0 when empty.
double median(std::vector<double> samples);

// Each bound term's median over `steps` (zero::BoundTerms); a term unknown (< 0) in any step stays
// unknown (-1), as every step of one run knows the same terms.
zero::BoundTerms median_bound_terms(const std::vector<zero::BoundTerms>& steps);

// The CPU model from /proc/cpuinfo ("unknown" when it cannot be read).
std::string cpu_model_name();

// {"host", "cpu", "cpus", "kernel"}: the machine a benchmark result was measured on.
nlohmann::ordered_json machine_json();

// printf into a string: one cell of a BenchReport's table, or one of its text lines.
std::string cell(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// A bench's output, printed as it is given, in order: with --json one JSON object per result
// and nothing else on stdout; without, the text lines and the table (a header row, then one row
// per result). Every bench's records and rows go through this one type, so the two forms show
// the same results.
class BenchReport {
 public:
  // One table column: its header and width; left-aligned or right-aligned (printf's %-Ns, %Ns).
  struct Column {
    std::string name;
    int width = 0;
    bool left = false;
  };

  explicit BenchReport(bool json) : json_(json) {}
  bool json() const { return json_; }

  // A line people read (a title, the ceilings, a summary); not printed with --json.
  void text(const std::string& line) const;
  // The table's columns; prints the header row (not with --json).
  void table(std::vector<Column> columns);
  // One result: its JSON line with --json; otherwise its row, `cells` in column order (none:
  // the result has no row). TZ_ASSERT: as many cells as columns.
  void result(const nlohmann::ordered_json& record, const std::vector<std::string>& cells) const;
  void result(const nlohmann::json& record, const std::vector<std::string>& cells) const;
  // A table row with no JSON record of its own (its figures are in another result's record).
  void row(const std::vector<std::string>& cells) const;
  // A JSON-only record (a summary whose text form is a line of its own).
  void record(const nlohmann::ordered_json& record) const;
  void record(const nlohmann::json& record) const;

 private:
  void print_row(const std::vector<std::string>& cells) const;
  void json_line(const std::string& dumped) const;

  bool json_;
  std::vector<Column> columns_;
};

// Sequential O_DIRECT throughput of the disk under a swap space: what the disk gives with
// nothing else in the way. `mixed_gbps` is reads and writes at once, both directions together
// (0 when the bytes are too few for a mixed pass).
struct DiskCeiling {
  double read_gbps = 0;
  double write_gbps = 0;
  double mixed_gbps = 0;
};
// Host <-> device copy bandwidth on the device's copy streams (memcpy on HostDevice).
struct CopyCeiling {
  double h2d_gbps = 0;
  double d2h_gbps = 0;
};

// The disk ceiling through a swap space of `stack`'s own factory (made on this thread, its
// buffers registered with its queue when the engine allows, gone before this returns, so before
// the store makes its own): `bytes` written, read, then mixed, with the store's chunking and
// bytes in flight. Errors: the swap space's and the pool's.
Result<DiskCeiling> measure_stack_disk(store::TieredStack& stack, std::uint64_t bytes,
                                       std::uint64_t chunk_bytes, std::uint64_t in_flight_bytes);
// The copy ceiling: the best of three copies of `bytes` each way between `stack`'s pool and
// `device`. Errors: the allocations' and the copies'.
Result<CopyCeiling> measure_stack_copies(store::TieredStack& stack, gpu::Device& device,
                                         std::uint64_t bytes);
// The disk's ceiling through the NVMe engine (bench nvme's rig: the engine `auto` picks, 1 MiB
// requests, 32 in flight per file, O_DIRECT, registered pinned buffers): one probe
// file per path, `bytes_per_path` written sequentially, then read, the best of three passes each
// way; over all paths at once (GB/s; no mixed pass). The files are removed. `what` names the command in errors
// and file names.
Result<DiskCeiling> measure_engine_disk(const std::vector<std::string>& paths,
                                        std::uint64_t bytes_per_path, const std::string& what);
// Single-thread memcpy of `bytes` from `src` to `dst`, `repeats` times: GB/s of each.
std::vector<double> memcpy_gbps_samples(void* dst, const void* src, std::size_t bytes,
                                        int repeats);
// The same on buffers of its own.
std::vector<double> memcpy_gbps_samples(std::size_t bytes, int repeats);

// The bandwidths of the engine's step bound (EngineOptions::nvme_read_bytes_per_s,
// nvme_write_bytes_per_s, copy_bytes_per_s), measured once before a run (`bench zero`, `train`):
// - copy, when `device_is_host_memory`: single-thread memcpy of 64 MiB, the best of three, what
//   HostDevice's host <-> device copies run at (its copy streams are memcpy on one thread each).
//   On a GPU memcpy says nothing of PCIe, so the copy term is left at 0 (out of the bound).
// - NVMe, when `eo`'s config puts the parameters or the optimizer's states on nvme: the disk
//   under every directory the run's swap files go to (zero::swap_paths: EngineOptions::nvme_path,
//   else the offload sections' nvme_path), measure_engine_disk's sequential write then read of
//   `disk_bytes` in each, all paths at once through the engine at a deep queue (a ceiling: a
//   probe of one request at a time measured a virtio disk at a third of what the run got).
// Bandwidths not measured are left as `eo` has them. `what` names the command in errors.
// Errors: measure_engine_disk's.
Status measure_engine_ceilings(const std::string& what, bool device_is_host_memory,
                               std::uint64_t disk_bytes, zero::EngineOptions& eo);

// The host memory measure_engine_ceilings holds at its peak (its memcpy probe and its disk probe
// run one after the other, each freeing its buffers): 2 x 64 MiB on a host-memory device, the
// disk probe's staging (engine_disk_probe_host_bytes) when `eo` puts a tier on NVMe. What the
// plan counts for it (zero::EngineOptions::probe_host_bytes).
std::uint64_t engine_ceilings_host_bytes(bool device_is_host_memory,
                                         const zero::EngineOptions& eo);
// measure_engine_disk's pinned staging for `paths` swap directories.
std::uint64_t engine_disk_probe_host_bytes(std::size_t paths);
// Has the engine's plan count the probe (EngineOptions::probe_host_bytes, from
// engine_ceilings_host_bytes of `eo` as it is now): for runs whose ranks call
// SharedCeilings::measure once their plan is checked.
void count_probe_in_plan(zero::EngineOptions& eo);

// measure_engine_ceilings once for every rank of this process (`train`, `bench zero`): the first
// rank to call measure() measures (256 MiB each way on the disk), the others wait for its figures;
// each gets them in its `eo`. The ranks call it once their engine has checked its memory plan, so
// a run the plan refuses spends no time on the probe and writes no probe file, and before their
// first step, so no rank's step runs beside the probe.
class SharedCeilings {
 public:
  explicit SharedCeilings(std::string what) : what_(std::move(what)) {}
  // Errors: the measurement's (every rank gets the first's).
  Status measure(bool device_is_host_memory, zero::EngineOptions& eo);

 private:
  std::string what_;
  std::once_flag once_;
  Status status_;
  zero::EngineOptions measured_;
};

}  // namespace tz::cli
