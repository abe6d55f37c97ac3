// Accounting (accounting.h): the memory plan and DESIGN.md's formula per tier, bytes in use and
// peaks, the step's lower bound and the comm formula per collective.
#include "zero/accounting.h"

#include <algorithm>
#include <vector>

#include "core/busy_union.h"
#include "core/host_probe.h"
#include "core/log.h"

namespace tz::zero::impl {

void Accounting::set_plan(const MemoryPlan& plan) {
  TZ_ASSERT(plan_.empty() && !plan.terms.empty(), "one plan, set once");
  plan_ = plan.terms;
  process_plan_ = plan.process;
  for (const Unit& u : ctx_.units) {
    param_count_ += u.layout.numel;
    if (!u.frozen()) trainable_param_count_ += u.layout.numel;
  }
  ctx_.counters.update_gathers.assign(ctx_.units.size(), 0);
}

void Accounting::set_disks(std::vector<std::string> devices) {
  disks_ = std::move(devices);
}

void Accounting::set_pools(const PinnedPool* pool, const PinnedPool* overlap_pool) {
  TZ_ASSERT(pool != nullptr && ctx_.store != nullptr, "the engine's pool comes with the store");
  pool_ = pool;
  overlap_pool_ = overlap_pool;
}

std::uint64_t Accounting::copy_link_bytes(const store::StoreStats& ss) const {
  return ss.link(store::Link::kHostToDevice).bytes + ss.link(store::Link::kDeviceToHost).bytes +
         ss.link(store::Link::kNvmeToDevice).bytes + ss.link(store::Link::kDeviceToNvme).bytes;
}

nlohmann::ordered_json Accounting::plan_json() const {
  nlohmann::ordered_json j;
  j["stage"] = ctx_.stage;
  j["world_size"] = ctx_.world;
  j["params"] = param_count_;
  j["trainable_params"] = trainable_param_count_;
  j["compute_dtype"] = std::string(dtype_name(ctx_.compute_dtype));
  j["offload_optimizer"] = std::string(placement_name(ctx_.opt_place));
  j["offload_param"] = std::string(placement_name(ctx_.param_place));
  // The gradient accumulators' home and dtype (gradient_home, gradient_accumulator_dtype).
  j["gradient_home"] = std::string(placement_name(ctx_.grad_place));
  j["gradient_dtype"] = std::string(dtype_name(ctx_.grad_dtype));
  j["plan_bytes"] = plan_bytes().to_json();
  for (const PlanTerm& t : plan_) {
    j["terms"][store::tier_name(t.tier)][t.name] = t.bytes;
  }
  // Host memory outside the tiers; the process's peak RSS is planned as device (when the device
  // is host memory) + host + process (docs/estimate.md, "The process's memory").
  std::uint64_t process = 0;
  for (const PlanTerm& t : process_plan_) {
    j["terms"]["process"][t.name] = t.bytes;
    process += t.bytes;
  }
  j["process_bytes"] = process;
  j["device_is_host_memory"] = ctx_.device.host_accessible();
  j["formula_bytes"] = formula_bytes().to_json();
  j["formula"] = "DESIGN.md: params " + std::to_string(dtype_size(ctx_.compute_dtype)) +
                 "P, grads " + std::to_string(dtype_size(ctx_.compute_dtype)) + "P, optimizer " +
                 std::to_string(4 * (1 + ctx_.states)) +
                 "P (fp32 master + states); stage 1 shards the optimizer, stage 2 + grads, "
                 "stage 3 + params, by N; offload moves a term to its tier";
  return j;
}

// DESIGN.md's memory table for this config: what each tier would hold by the formula. Frozen
// parameters count in the parameter term only (no gradients, masters or states).
TierBytes Accounting::formula_bytes() const {
  const double all = static_cast<double>(param_count_);
  const double phi = static_cast<double>(trainable_param_count_);
  const double n = ctx_.world;
  const double es = static_cast<double>(dtype_size(ctx_.compute_dtype));
  const double params = ctx_.stage == 3 ? es * all / n : es * all;
  const double grads = ctx_.stage >= 2 ? es * phi / n : es * phi;
  const double opt = 4.0 * (1 + ctx_.states) * phi / (ctx_.stage >= 1 ? n : 1.0);
  double tiers[3] = {0, 0, 0};
  tiers[static_cast<int>(tier_of(ctx_.param_place))] += params;
  tiers[static_cast<int>(tier_of(ctx_.grad_place))] += grads;
  tiers[static_cast<int>(tier_of(ctx_.opt_place))] += opt;
  TierBytes b;
  b.device = static_cast<std::uint64_t>(tiers[0]);
  b.host = static_cast<std::uint64_t>(tiers[1]);
  b.nvme = static_cast<std::uint64_t>(tiers[2]);
  return b;
}

std::uint64_t Accounting::tier_plan(Tier t) const {
  std::uint64_t sum = 0;
  for (const PlanTerm& p : plan_) {
    if (p.tier == t) sum += p.bytes;
  }
  return sum;
}

TierBytes Accounting::plan_bytes() const {
  TierBytes b;
  b.device = tier_plan(Tier::kDevice);
  b.host = tier_plan(Tier::kHost);
  b.nvme = tier_plan(Tier::kNvme);
  return b;
}

TierBytes Accounting::peak_bytes() const {
  TierBytes b;
  b.device = ctx_.device.memory_stats().peak_bytes;
  if (pool_ != nullptr) b.host = pool_->stats().peak_bytes;
  if (overlap_pool_ != nullptr) b.host += overlap_pool_->stats().peak_bytes;
  if (ctx_.store != nullptr) b.nvme = ctx_.store->stats().tier(Tier::kNvme).peak_bytes;
  return b;
}

std::pair<std::uint64_t, std::uint64_t> Accounting::home_write_bytes() const {
  std::vector<BlockId> frozen, trainable;
  for (const Unit& u : ctx_.units) {
    if (u.frozen()) {
      frozen.push_back(u.param);
      continue;
    }
    trainable.insert(trainable.end(), {u.param, u.master, u.grad_acc});
    trainable.insert(trainable.end(), u.state, u.state + ctx_.states);
  }
  return {ctx_.store->block_stats(frozen).home_write_bytes,
          ctx_.store->block_stats(trainable).home_write_bytes};
}

std::pair<std::uint64_t, std::uint64_t> Accounting::gradient_nvme_bytes() const {
  if (ctx_.grad_place != Placement::kNvme) return {0, 0};
  std::vector<BlockId> grads;
  for (const Unit& u : ctx_.units) {
    if (!u.frozen()) grads.push_back(u.grad_acc);
  }
  const store::BlockStats b = ctx_.store->block_stats(grads);
  // Loaded into the host cache (from NVMe: an NVMe-homed accumulator is never on the device).
  return {b.tier_bytes_in(Tier::kHost), b.tier_bytes_in(Tier::kNvme)};
}

TierBytes Accounting::bytes_in_use() const {
  TierBytes b;
  b.device = ctx_.device.memory_stats().in_use_bytes;
  if (pool_ != nullptr) b.host = pool_->stats().in_use_bytes;
  if (overlap_pool_ != nullptr) b.host += overlap_pool_->stats().in_use_bytes;
  if (ctx_.store != nullptr) b.nvme = ctx_.store->used_bytes(Tier::kNvme);
  return b;
}

// The step's accounting window opens at its first gather or grad (set_tensor and checkpoint
// traffic between steps is not the step's).
void Accounting::open_step() {
  TZ_ASSERT(ctx_.store != nullptr, "a step opened before finalize");
  if (step_open_) return;
  step_open_ = true;
  step_start_ = Clock::now();
  process_cpu_base_ = process_cpu_seconds();
  if (!disks_.empty()) disk_base_ = disk_counters(disks_);
  comm_base_ = ctx_.comm.counters();
  const store::StoreStats ss = ctx_.store->stats();
  nvme_read_base_ = ss.nvme_read_bytes();
  nvme_write_base_ = ss.nvme_write_bytes();
  writer_hashed_base_ = ss.writer_hashed_bytes;
  home_write_base_ = home_write_bytes();
  gradient_nvme_base_ = gradient_nvme_bytes();
  copy_link_base_ = copy_link_bytes(ss);
  ctx_.counters.optimizer_s = 0;
  ctx_.counters.copy_bytes = 0;
  compute_busy_base_ = ctx_.device.compute_stream().busy_seconds();
  shared_busy_base_ = BusyUnion::host_cores().seconds();
}

StepBound step_bound_of(const BoundTerms& t) {
  StepBound b;
  if (t.shared_cores && t.shared_busy_s >= 0) {
    b.seconds = std::max({t.shared_busy_s, t.compute_s, t.optimizer_s});
  } else if (t.shared_cores) {
    b.seconds = t.compute_s + t.optimizer_s;
  } else {
    b.seconds = t.compute_s;
    if (t.optimizer_s > b.seconds) b = {t.optimizer_s, "optimizer"};
  }
  if (t.nvme_s > b.seconds) b = {t.nvme_s, "nvme"};
  if (t.copy_s > b.seconds) b = {t.copy_s, "copy"};
  return b;
}

// The swap devices' counters since the step opened, over its `step_s` seconds; a device whose
// counters could not be read at either end, or were reset, is left out.
std::vector<DiskStep> Accounting::disk_steps(double step_s) const {
  std::vector<DiskStep> out;
  if (disks_.empty() || step_s <= 0) return out;
  const std::vector<DiskCounters> now = disk_counters(disks_);
  for (std::size_t i = 0; i < disks_.size() && i < disk_base_.size(); ++i) {
    const DiskDelta delta = disk_delta(disk_base_[i], now[i]);
    if (!delta.known) continue;
    DiskStep d;
    d.device = disks_[i];
    // io_ticks moves in jiffies (1-10 ms): a step of a few milliseconds can read past 1.
    d.busy_fraction = std::min(1.0, static_cast<double>(delta.busy_ms) / 1e3 / step_s);
    d.mean_in_flight = static_cast<double>(delta.queue_ms) / 1e3 / step_s;
    d.read_bytes = delta.read_bytes;
    d.write_bytes = delta.write_bytes;
    out.push_back(std::move(d));
  }
  return out;
}

// The step's lower bound's terms (accounting.h): compute from the compute stream's busy time
// where the device can tell (HostDevice: the model's thread can block outside the engine's calls
// on a full stream queue while the stream waits for parameters, so that time is no compute), else
// the step's time outside the engine's calls; the CPU optimizer; on a
// host-memory device the union of the two's busy time over the step's window; NVMe and copies
// from the step's bytes at the measured bandwidths (0: unknown, the term stays out).
BoundTerms Accounting::bound_terms(const StepReport& r, std::uint64_t copy_bytes) const {
  const double engine_s = r.stall_gather_s + r.stall_reduce_s + r.stall_optimizer_s;
  BoundTerms t;
  const double busy = ctx_.device.compute_stream().busy_seconds();
  t.compute_s = busy >= 0 && compute_busy_base_ >= 0 ? busy - compute_busy_base_
                                                     : std::max(0.0, r.step_s - engine_s);
  t.optimizer_s = ctx_.counters.optimizer_s;
  t.shared_cores = ctx_.device.host_accessible();
  if (t.shared_cores) t.shared_busy_s = BusyUnion::host_cores().seconds() - shared_busy_base_;
  if (options_.nvme_read_bytes_per_s > 0 && options_.nvme_write_bytes_per_s > 0) {
    t.nvme_s = seconds_at(r.nvme_read_bytes, r.nvme_write_bytes, options_.nvme_read_bytes_per_s,
                          options_.nvme_write_bytes_per_s) /
               disk_scale_;
  }
  if (options_.copy_bytes_per_s > 0) {
    t.copy_s = static_cast<double>(copy_bytes) / options_.copy_bytes_per_s;
  }
  return t;
}

double seconds_at(std::uint64_t read, std::uint64_t written, double read_bw, double write_bw) {
  return static_cast<double>(read) / read_bw + static_cast<double>(written) / write_bw;
}

DiskShown disk_shown(const StepReport& r, double read_bw, double write_bw) {
  DiskShown d;
  if (read_bw <= 0 || write_bw <= 0) return d;
  for (const DiskStep& disk : r.disks) {
    d.read_bytes += disk.read_bytes;
    d.write_bytes += disk.write_bytes;
    d.took_s = std::max(d.took_s, disk.busy_fraction * r.step_s);
  }
  d.probe_s = seconds_at(d.read_bytes, d.write_bytes, read_bw, write_bw);
  if (d.took_s >= kDiskEvidenceS) d.scale = d.probe_s / d.took_s;
  // The store's own bytes in the step's time: they can pass the disk's counts (a swap file read
  // through the page cache), and the NVMe term is of these bytes.
  if (r.step_s >= kDiskEvidenceS) {
    const double store_s = seconds_at(r.nvme_read_bytes, r.nvme_write_bytes, read_bw, write_bw);
    if (store_s / r.step_s > d.scale) {
      d.read_bytes = r.nvme_read_bytes;
      d.write_bytes = r.nvme_write_bytes;
      d.took_s = r.step_s;
      d.probe_s = store_s;
      d.scale = store_s / r.step_s;
      d.by_store = true;
    }
  }
  return d;
}

void Accounting::calibrate_disk(const StepReport& r, std::int64_t step) {
  const DiskShown d =
      disk_shown(r, options_.nvme_read_bytes_per_s, options_.nvme_write_bytes_per_s);
  if (d.scale <= disk_scale_) return;
  disk_scale_ = d.scale;
  if (said_disk_scale_) return;
  said_disk_scale_ = true;
  TZ_LOG_INFO("step %lld on rank %d: %.2f GB read and %.2f GB written in %.2f s (%s), faster "
              "than the probe's %.2f GB/s read and %.2f GB/s write allow (%.2f s): the disk did "
              "better than the probe (a short burst at the start, which can meet a stall), and "
              "the bound's disk ceiling is raised %.2fx to what this run showed "
              "(nvme_ceiling_scale)",
              static_cast<long long>(step), ctx_.rank, static_cast<double>(d.read_bytes) / 1e9,
              static_cast<double>(d.write_bytes) / 1e9, d.took_s,
              d.by_store ? "the store's bytes in the step's time" : "the swap disks' busy time",
              options_.nvme_read_bytes_per_s / 1e9, options_.nvme_write_bytes_per_s / 1e9,
              d.probe_s, disk_scale_);
}

// DESIGN.md's communication per rank per step for this config and model, in the ring's byte
// counts (comm::ring_bytes): every micro-batch reduce-scatters each trainable unit (the 16-bit
// gradient; a frozen unit has none);
// stage 3 all-gathers each unit in forward and again in backward (a persistent unit once per
// step); stages 1-2 all-gather the updated 16-bit parameters, stage 0 the reduced gradient
// (fp32 when k > 1), once per pass of updates over the unit (Unit::update_gathers: exact one,
// none when the step is skipped; eager one more after a rollback; delayed one when the
// previous step's update is published). all_reduce: the norm's scalars.
nlohmann::ordered_json Accounting::comm_formula() const {
  const auto k = static_cast<std::uint64_t>(ctx_.accumulation_steps());
  const std::size_t es = dtype_size(ctx_.compute_dtype);
  std::uint64_t ag = 0, rs = 0;
  auto ring = [this](comm::CollectiveOp op, std::size_t count, std::size_t elem) {
    return comm::ring_bytes(op, ctx_.world, ctx_.rank, count, elem).bytes_sent;
  };
  for (const Unit& u : ctx_.units) {
    const std::size_t sh = u.layout.shard;
    if (!u.frozen()) rs += k * ring(comm::CollectiveOp::kReduceScatter, sh, es);
    if (ctx_.stage == 3) {
      ag += (u.persistent ? 1 : 2 * k) * ring(comm::CollectiveOp::kAllGather, sh, es);
    } else {
      const std::size_t e = ctx_.stage == 0 && k > 1 ? 4 : es;
      ag += ctx_.counters.update_gathers[u.id] * ring(comm::CollectiveOp::kAllGather, sh, e);
    }
  }
  nlohmann::ordered_json j;
  j[std::string(comm::collective_op_name(comm::CollectiveOp::kAllGather))] = ag;
  j[std::string(comm::collective_op_name(comm::CollectiveOp::kReduceScatter))] = rs;
  j[std::string(comm::collective_op_name(comm::CollectiveOp::kAllReduce))] = ring(
      comm::CollectiveOp::kAllReduce, static_cast<std::size_t>(ctx_.world) * 2 * kScalarPieces, 4);
  return j;
}

// The step report's accounting once the update is done: the step count, stalls by cause, time,
// bytes in use and peaks, comm bytes against the formula, NVMe bytes and the step's bound; the
// per-step counters start again.
void Accounting::close_step_report(StepReport& report, Clock::time_point t_opt, std::int64_t step) {
  TZ_ASSERT(ctx_.store != nullptr && !plan_.empty(), "close_step_report before finalize");
  TZ_ASSERT(step >= 1, "steps are 1-based");
  report.step = step;
  report.stall_optimizer_s = seconds_since(t_opt) + ctx_.counters.early_update_s;
  ctx_.counters.early_update_s = 0;
  report.stall_gather_s = ctx_.counters.stall_gather_s;
  report.stall_reduce_s = ctx_.counters.stall_reduce_s;
  report.stall_s = report.stall_gather_s + report.stall_reduce_s + report.stall_optimizer_s;
  ctx_.counters.stall_gather_s = ctx_.counters.stall_reduce_s = 0;
  open_step();
  report.step_s = seconds_since(step_start_);
  report.process_cpu_s = process_cpu_seconds() - process_cpu_base_;
  report.disks = disk_steps(report.step_s);
  step_open_ = false;
  report.bytes_in_use = bytes_in_use();
  report.peak_bytes = peak_bytes();
  const comm::CommCounters now = ctx_.comm.counters();
  for (std::size_t op = 0; op < comm::kCollectiveOpCount; ++op) {
    const auto o = static_cast<comm::CollectiveOp>(op);
    report.comm_bytes[std::string(comm::collective_op_name(o))] =
        now.ops[op].bytes_sent - comm_base_.ops[op].bytes_sent;
  }
  report.comm_formula_bytes = comm_formula();
  std::fill(ctx_.counters.update_gathers.begin(), ctx_.counters.update_gathers.end(), 0);
  const store::StoreStats ss = ctx_.store->stats();
  report.nvme_read_bytes = ss.nvme_read_bytes() - nvme_read_base_;
  report.nvme_write_bytes = ss.nvme_write_bytes() - nvme_write_base_;
  report.writer_hashed_bytes = ss.writer_hashed_bytes - writer_hashed_base_;
  const auto [frozen_writes, trainable_writes] = home_write_bytes();
  report.frozen_home_write_bytes = frozen_writes - home_write_base_.first;
  report.trainable_home_write_bytes = trainable_writes - home_write_base_.second;
  const auto [gradient_reads, gradient_writes] = gradient_nvme_bytes();
  report.gradient_nvme_read_bytes = gradient_reads - gradient_nvme_base_.first;
  report.gradient_nvme_write_bytes = gradient_writes - gradient_nvme_base_.second;
  report.state_read_ahead_bytes = ctx_.counters.state_read_ahead_bytes;
  ctx_.counters.state_read_ahead_bytes = 0;
  const std::uint64_t link_bytes = copy_link_bytes(ss);
  calibrate_disk(report, step);
  report.nvme_ceiling_scale = disk_scale_;
  report.bound_terms = bound_terms(report, link_bytes - copy_link_base_ + ctx_.counters.copy_bytes);
  // A step too short to calibrate by (calibrate_disk) can still pass its time: said once.
  if (report.bound_terms.nvme_s > 1.05 * report.step_s && !warned_short_step_) {
    warned_short_step_ = true;
    TZ_LOG_WARN("step %lld on rank %d: its NVMe term (%.3f s) passes the step (%.3f s), which is "
                "too short to raise the disk's ceiling by (under %.2f s): that term is no lower "
                "bound for it",
                static_cast<long long>(step), ctx_.rank, report.bound_terms.nvme_s, report.step_s,
                kDiskEvidenceS);
  }
  const StepBound bound = step_bound_of(report.bound_terms);
  report.bound_s = bound.seconds;
  report.bound_term = bound.term;
  ctx_.counters.optimizer_s = 0;
  ctx_.counters.copy_bytes = 0;
}

}  // namespace tz::zero::impl
