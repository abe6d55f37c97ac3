// Accounting (DESIGN.md, zero/: memory estimator, comm accounting): the memory plan the engine was
// built from and DESIGN.md's formula per tier, bytes in use and peaks, and the step report's
// measured side: its window (opened at the step's first gather or grad), stalls by cause, comm
// bytes next to the formula per collective, NVMe and home-write bytes, and the step's lower bound.
// It owns the plan and the step's baselines; the components add to EngineContext::counters.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/host_probe.h"
#include "zero/engine_context.h"

namespace tz::zero::impl {

// The bound and the term that set it (StepReport::bound_term's names).
struct StepBound {
  double seconds = 0;
  const char* term = "compute";
};

// max(compute, optimizer, nvme, copy) and its term; on a tie the earlier of compute, optimizer,
// nvme, copy names it. Where compute and the optimizer share the cores, the two are one term
// named compute: max(shared_busy, compute, optimizer) where the union is known (the union holds
// both, so it is at least each one), their sum where it is not. Pure (tests/unit/zero/bound_test).
StepBound step_bound_of(const BoundTerms& terms);

// The seconds `read` and `written` bytes take at `read_bw` and `write_bw` bytes per second (both
// above 0): the NVMe term before the run's raise, and disk_shown's readings.
double seconds_at(std::uint64_t read, std::uint64_t written, double read_bw, double write_bw);

// What a step shows of the disk against the bandwidth probe's `read_bw` and `write_bw`: bytes the
// step moved, the time they took and the time they take at the probe's bandwidths, and `scale`,
// the ratio of the two times, from whichever of two readings gives the larger: the swap disks'
// own counts (StepReport::disks: their bytes over the longest busy time among them) when that
// time is at least kDiskEvidenceS (the counters move in jiffies of 1-10 ms), and the store's bytes
// over the step's time when the step is that long (they can pass the disk's counts: a swap file
// read through the page cache). 0 with neither, or without both bandwidths. Above 1 the disk did
// better than the probe. Pure (tests/unit/zero/bound_test).
inline constexpr double kDiskEvidenceS = 0.25;
struct DiskShown {
  std::uint64_t read_bytes = 0;
  std::uint64_t write_bytes = 0;
  double took_s = 0;
  double probe_s = 0;
  double scale = 0;
  bool by_store = false;  // the store's bytes in the step's time gave the scale
};
DiskShown disk_shown(const StepReport& r, double read_bw, double write_bw);

class Accounting {
 public:
  Accounting(EngineContext& ctx, const EngineOptions& options) : ctx_(ctx), options_(options) {}
  Accounting(const Accounting&) = delete;
  Accounting& operator=(const Accounting&) = delete;

  // The plan (finalize, before anything is allocated from it) and the units' parameter counts.
  void set_plan(const MemoryPlan& plan);
  // The host pools whose bytes count in the host tier (the engine's, the overlap mode's or null);
  // once the store exists.
  void set_pools(const PinnedPool* pool, const PinnedPool* overlap_pool);
  // The disks (by their /proc/diskstats names) under the swap paths, for the step report's
  // `disks`; before the first step.
  void set_disks(std::vector<std::string> devices);

  std::uint64_t param_count() const { return param_count_; }
  std::uint64_t trainable_param_count() const { return trainable_param_count_; }

  nlohmann::ordered_json plan_json() const;
  // DESIGN.md's memory table for this config: what each tier would hold by the formula.
  TierBytes formula_bytes() const;
  std::uint64_t tier_plan(Tier t) const;
  TierBytes plan_bytes() const;
  TierBytes peak_bytes() const;

  // The step's accounting window opens at its first gather or grad (set_tensor and checkpoint
  // traffic between steps is not the step's); later calls in the step do nothing.
  void open_step();

  // The step report's accounting once the update is done (`t_opt`: when step() began, `step`: the
  // step's 1-based number): stalls by cause, time, bytes in use and peaks, comm bytes against the
  // formula, NVMe and home-write bytes and the step's bound; the per-step counters start again.
  void close_step_report(StepReport& report, Clock::time_point t_opt, std::int64_t step);

 private:
  // The swap devices during the step (StepReport::disks), `step_s` seconds long.
  std::vector<DiskStep> disk_steps(double step_s) const;

  TierBytes bytes_in_use() const;

  // BlockStats::home_write_bytes summed over frozen units' blocks (first) and trainable units'.
  std::pair<std::uint64_t, std::uint64_t> home_write_bytes() const;
  // The gradient accumulators' NVMe bytes so far when they are homed there: read into the host
  // cache (first) and written home (Store::block_stats); {0, 0} otherwise.
  std::pair<std::uint64_t, std::uint64_t> gradient_nvme_bytes() const;

  // The step's lower bound's terms (DESIGN.md): compute, NVMe bytes / NVMe bandwidth,
  // host<->device bytes / copy bandwidth, CPU optimizer time. Compute is the compute stream's
  // busy time where the device can tell (HostDevice: the model's kernels run on the stream's
  // thread, and the model's thread may block outside the engine's calls on a full queue), else
  // the step's time outside the engine's calls (the model's own work). On a host-accessible device
  // compute and the CPU optimizer run on the same cores: shared_busy is the union of their busy
  // time in the step's window (BusyUnion::host_cores()). A bandwidth of 0 (unknown) drops its
  // term. step_bound_of turns them into the bound.
  BoundTerms bound_terms(const StepReport& r, std::uint64_t copy_bytes) const;
  // The probe (a short burst at the run's start) can meet a stall of the disk, and a step then
  // moves its bytes in less time than the probe's bandwidths allow: raises disk_scale_ to what
  // the step showed (disk_shown), for it and the rest of the run, so that the NVMe term stays a
  // lower bound. The first raise is logged (per rank: each has its own).
  void calibrate_disk(const StepReport& r, std::int64_t step);

  // DESIGN.md's communication per rank per step for this config and model, in the ring's byte
  // counts (comm::ring_bytes): every micro-batch reduce-scatters each trainable unit (the 16-bit
  // gradient; a frozen unit has none); stage 3 all-gathers each unit in forward and again in
  // backward (a persistent unit once per step); stages 1-2 all-gather the updated 16-bit
  // parameters, stage 0 the reduced gradient (fp32 when k > 1), once per pass of updates over the
  // unit (StepCounters::update_gathers: exact one, none when the step is skipped; eager one more
  // after a rollback; delayed one when the previous step's update is published). all_reduce: the
  // norm's scalars.
  nlohmann::ordered_json comm_formula() const;

  std::uint64_t copy_link_bytes(const store::StoreStats& ss) const;

  EngineContext& ctx_;
  const EngineOptions& options_;
  std::vector<PlanTerm> plan_;
  std::vector<PlanTerm> process_plan_;  // MemoryPlan::process: host memory outside the tiers
  std::uint64_t param_count_ = 0;
  std::uint64_t trainable_param_count_ = 0;
  const PinnedPool* pool_ = nullptr;
  const PinnedPool* overlap_pool_ = nullptr;
  // The step's window and its baselines.
  bool step_open_ = false;
  Clock::time_point step_start_;
  double compute_busy_base_ = -1;  // the compute stream's busy_seconds() when the step opened
  double shared_busy_base_ = 0;    // BusyUnion::host_cores().seconds() when the step opened
  double process_cpu_base_ = 0;    // process_cpu_seconds() when the step opened
  std::vector<std::string> disks_;       // set_disks
  std::vector<DiskCounters> disk_base_;  // per disk: its counters when the step opened
  // How much faster than the probe's bandwidths the disk has shown it can move bytes: the most
  // any step so far showed (calibrate_disk), 1 while the probe holds. The NVMe term divides by it.
  double disk_scale_ = 1;
  bool said_disk_scale_ = false;    // the first raise was logged
  bool warned_short_step_ = false;  // a step too short to calibrate by passed its NVMe term
  comm::CommCounters comm_base_;
  std::uint64_t nvme_read_base_ = 0;
  std::uint64_t nvme_write_base_ = 0;
  std::uint64_t writer_hashed_base_ = 0;
  std::uint64_t copy_link_base_ = 0;
  std::pair<std::uint64_t, std::uint64_t> home_write_base_{0, 0};
  std::pair<std::uint64_t, std::uint64_t> gradient_nvme_base_{0, 0};
};

}  // namespace tz::zero::impl
