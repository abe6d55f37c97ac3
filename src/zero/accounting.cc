// Accounting (engine_impl.h): the memory plan and DESIGN.md's formula per tier, bytes in use and
// peaks, the step's lower bound, the comm formula per collective and params_xxh3.
#include <xxhash.h>

#include "zero/engine_impl.h"

namespace tz::zero::impl {

// --- Accounting ---------------------------------------------------------------------------------
nlohmann::ordered_json EngineImpl::plan_json() const {
  nlohmann::ordered_json j;
  j["stage"] = stage_;
  j["world_size"] = world_;
  j["params"] = param_count_;
  j["trainable_params"] = trainable_param_count_;
  j["compute_dtype"] = std::string(dtype_name(compute_dtype_));
  j["offload_optimizer"] = std::string(placement_name(opt_place_));
  j["offload_param"] = std::string(placement_name(param_place_));
  j["plan_bytes"] = plan_bytes().to_json();
  for (const PlanTerm& t : plan_) {
    j["terms"][store::tier_name(t.tier)][t.name] = t.bytes;
  }
  j["formula_bytes"] = formula_bytes().to_json();
  j["formula"] = "DESIGN.md: params " + std::to_string(dtype_size(compute_dtype_)) +
                 "P, grads " + std::to_string(dtype_size(compute_dtype_)) + "P, optimizer " +
                 std::to_string(4 * (1 + states_)) +
                 "P (fp32 master + states); stage 1 shards the optimizer, stage 2 + grads, "
                 "stage 3 + params, by N; offload moves a term to its tier";
  return j;
}

// DESIGN.md's memory table for this config: what each tier would hold by the formula. Frozen
// parameters count in the parameter term only (no gradients, masters or states).
TierBytes EngineImpl::formula_bytes() const {
  const double all = static_cast<double>(param_count_);
  const double phi = static_cast<double>(trainable_param_count_);
  const double n = world_;
  const double es = static_cast<double>(dtype_size(compute_dtype_));
  const double params = stage_ == 3 ? es * all / n : es * all;
  const double grads = stage_ >= 2 ? es * phi / n : es * phi;
  const double opt = 4.0 * (1 + states_) * phi / (stage_ >= 1 ? n : 1.0);
  double tiers[3] = {0, 0, 0};
  tiers[static_cast<int>(tier_of(param_place_))] += params;
  tiers[static_cast<int>(tier_of(grad_place_))] += grads;
  tiers[static_cast<int>(tier_of(opt_place_))] += opt;
  TierBytes b;
  b.device = static_cast<std::uint64_t>(tiers[0]);
  b.host = static_cast<std::uint64_t>(tiers[1]);
  b.nvme = static_cast<std::uint64_t>(tiers[2]);
  return b;
}

std::uint64_t EngineImpl::tier_plan(Tier t) const {
  std::uint64_t sum = 0;
  for (const PlanTerm& p : plan_) {
    if (p.tier == t) sum += p.bytes;
  }
  return sum;
}

TierBytes EngineImpl::plan_bytes() const {
  TierBytes b;
  b.device = tier_plan(Tier::kDevice);
  b.host = tier_plan(Tier::kHost);
  b.nvme = tier_plan(Tier::kNvme);
  return b;
}

TierBytes EngineImpl::peak_bytes() const {
  TierBytes b;
  b.device = device_.memory_stats().peak_bytes;
  if (pool_) b.host = pool_->stats().peak_bytes;
  if (overlap_pool_) b.host += overlap_pool_->stats().peak_bytes;
  if (store_) b.nvme = store_->stats().tier(Tier::kNvme).peak_bytes;
  return b;
}

Result<std::uint64_t> EngineImpl::params_xxh3() {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) return Status::out_of_memory("params_xxh3: XXH3_createState");
  XXH3_64bits_reset(state);
  Status status = Status::ok();
  std::vector<float> values;
  for (UnitId id = 0; id < units_.size() && status.is_ok(); ++id) {
    if (units_[id].frozen()) continue;  // engine.h: trainable units only
    for (std::size_t t = 0; t < units_[id].spec.tensors.size(); ++t) {
      values.resize(units_[id].spec.tensors[t].numel());
      status = get_tensor(id, t, values, TensorState::kMaster);
      if (!status.is_ok()) break;
      XXH3_64bits_update(state, values.data(), values.size() * sizeof(float));
    }
  }
  const std::uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!status.is_ok()) return status;
  return h;
}

std::pair<std::uint64_t, std::uint64_t> EngineImpl::home_write_bytes() const {
  std::uint64_t frozen = 0, trainable = 0;
  for (const Unit& u : units_) {
    if (u.frozen()) {
      frozen += store_->home_write_bytes(u.param);
      continue;
    }
    trainable += store_->home_write_bytes(u.param) + store_->home_write_bytes(u.master) +
                 store_->home_write_bytes(u.grad_acc);
    for (int s = 0; s < states_; ++s) trainable += store_->home_write_bytes(u.state[s]);
  }
  return {frozen, trainable};
}

Status EngineImpl::flush_frozen_loads() {
  if (!frozen_unflushed_) return Status::ok();
  frozen_unflushed_ = false;
  return store_->flush();
}

TierBytes EngineImpl::bytes_in_use() const {
  TierBytes b;
  b.device = device_.memory_stats().in_use_bytes;
  if (pool_) b.host = pool_->stats().in_use_bytes;
  if (overlap_pool_) b.host += overlap_pool_->stats().in_use_bytes;
  if (store_) b.nvme = store_->used_bytes(Tier::kNvme);
  return b;
}

// The step's accounting window opens at its first gather or grad (set_tensor and checkpoint
// traffic between steps is not the step's).
void EngineImpl::open_step() {
  if (step_open_) return;
  step_open_ = true;
  step_start_ = Clock::now();
  comm_base_ = comm_.counters();
  const store::StoreStats ss = store_->stats();
  nvme_read_base_ = ss.nvme_read_bytes();
  nvme_write_base_ = ss.nvme_write_bytes();
  home_write_base_ = home_write_bytes();
  copy_link_base_ = ss.link(store::Link::kHostToDevice).bytes +
                    ss.link(store::Link::kDeviceToHost).bytes +
                    ss.link(store::Link::kNvmeToDevice).bytes +
                    ss.link(store::Link::kDeviceToNvme).bytes;
  optimizer_s_ = 0;
  copy_bytes_ = 0;
  compute_busy_base_ = device_.compute_stream().busy_seconds();
}

// The step's lower bound (DESIGN.md): max(compute, NVMe bytes / NVMe bandwidth, host<->device
// bytes / copy bandwidth, CPU optimizer time). Compute is the step's time outside the engine's
// calls (the model's own work), or the compute stream's busy time where the device can tell
// (HostDevice: the model's kernels run on the stream's thread while the engine waits in its
// calls, so the time outside them is only the enqueueing). On a host-accessible device compute
// and the CPU optimizer run on the same cores, so those two add. A bandwidth of 0 (unknown)
// drops its term.
double EngineImpl::step_bound(const StepReport& r, std::uint64_t copy_bytes) const {
  const double engine_s = r.stall_gather_s + r.stall_reduce_s + r.stall_optimizer_s;
  double compute_s = std::max(0.0, r.step_s - engine_s);
  const double busy = device_.compute_stream().busy_seconds();
  if (busy >= 0 && compute_busy_base_ >= 0) compute_s = std::max(compute_s, busy - compute_busy_base_);
  double bound = device_.host_accessible() ? compute_s + optimizer_s_ : std::max(compute_s, optimizer_s_);
  if (options_.nvme_read_bytes_per_s > 0 && options_.nvme_write_bytes_per_s > 0) {
    bound = std::max(bound, static_cast<double>(r.nvme_read_bytes) / options_.nvme_read_bytes_per_s +
                                static_cast<double>(r.nvme_write_bytes) / options_.nvme_write_bytes_per_s);
  }
  if (options_.copy_bytes_per_s > 0) {
    bound = std::max(bound, static_cast<double>(copy_bytes) / options_.copy_bytes_per_s);
  }
  return bound;
}

// DESIGN.md's communication per rank per step for this config and model, in the ring's byte
// counts (comm::ring_bytes): every micro-batch reduce-scatters each trainable unit (the 16-bit
// gradient; a frozen unit has none);
// stage 3 all-gathers each unit in forward and again in backward (a persistent unit once per
// step); stages 1-2 all-gather the updated 16-bit parameters, stage 0 the reduced gradient
// (fp32 when k > 1), once per pass of updates over the unit (Unit::update_gathers: exact one,
// none when the step is skipped; eager one more after a rollback; delayed one when the
// previous step's update is published). all_reduce: the norm's scalars.
nlohmann::ordered_json EngineImpl::comm_formula() const {
  const auto k = static_cast<std::uint64_t>(gradient_accumulation_steps());
  const std::size_t es = dtype_size(compute_dtype_);
  std::uint64_t ag = 0, rs = 0;
  auto ring = [this](comm::CollectiveOp op, std::size_t count, std::size_t elem) {
    return comm::ring_bytes(op, world_, rank_, count, elem).bytes_sent;
  };
  for (const Unit& u : units_) {
    const std::size_t sh = u.layout.shard;
    if (!u.frozen()) rs += k * ring(comm::CollectiveOp::kReduceScatter, sh, es);
    if (stage_ == 3) {
      ag += (u.persistent ? 1 : 2 * k) * ring(comm::CollectiveOp::kAllGather, sh, es);
    } else {
      const std::size_t e = stage_ == 0 && k > 1 ? 4 : es;
      ag += u.update_gathers * ring(comm::CollectiveOp::kAllGather, sh, e);
    }
  }
  nlohmann::ordered_json j;
  j[std::string(comm::collective_op_name(comm::CollectiveOp::kAllGather))] = ag;
  j[std::string(comm::collective_op_name(comm::CollectiveOp::kReduceScatter))] = rs;
  j[std::string(comm::collective_op_name(comm::CollectiveOp::kAllReduce))] =
      ring(comm::CollectiveOp::kAllReduce, static_cast<std::size_t>(world_) * 2 * kScalarPieces, 4);
  return j;
}

// The step report's accounting once the update is done: the step count, stalls by cause, time,
// bytes in use and peaks, comm bytes against the formula, NVMe bytes and the step's bound; the
// per-step counters start again.
void EngineImpl::close_step_report(StepReport& report, Clock::time_point t_opt) {
  TZ_ASSERT(finalized_ && store_ != nullptr, "close_step_report before finalize");
  report.step = steps_done_;
  report.stall_optimizer_s = seconds_since(t_opt) + early_update_s_;
  early_update_s_ = 0;
  report.stall_gather_s = stall_gather_s_;
  report.stall_reduce_s = stall_reduce_s_;
  report.stall_s = report.stall_gather_s + report.stall_reduce_s + report.stall_optimizer_s;
  stall_gather_s_ = stall_reduce_s_ = 0;
  open_step();
  report.step_s = seconds_since(step_start_);
  step_open_ = false;
  report.bytes_in_use = bytes_in_use();
  report.peak_bytes = peak_bytes();
  const comm::CommCounters now = comm_.counters();
  for (std::size_t op = 0; op < comm::kCollectiveOpCount; ++op) {
    const auto o = static_cast<comm::CollectiveOp>(op);
    report.comm_bytes[std::string(comm::collective_op_name(o))] =
        now.ops[op].bytes_sent - comm_base_.ops[op].bytes_sent;
  }
  report.comm_formula_bytes = comm_formula();
  for (Unit& u : units_) u.update_gathers = 0;
  const store::StoreStats ss = store_->stats();
  report.nvme_read_bytes = ss.nvme_read_bytes() - nvme_read_base_;
  report.nvme_write_bytes = ss.nvme_write_bytes() - nvme_write_base_;
  const auto [frozen_writes, trainable_writes] = home_write_bytes();
  report.frozen_home_write_bytes = frozen_writes - home_write_base_.first;
  report.trainable_home_write_bytes = trainable_writes - home_write_base_.second;
  const std::uint64_t link_bytes = ss.link(store::Link::kHostToDevice).bytes +
                                   ss.link(store::Link::kDeviceToHost).bytes +
                                   ss.link(store::Link::kNvmeToDevice).bytes +
                                   ss.link(store::Link::kDeviceToNvme).bytes;
  report.bound_s = step_bound(report, link_bytes - copy_link_base_ + copy_bytes_);
  optimizer_s_ = 0;
  copy_bytes_ = 0;
}

}  // namespace tz::zero::impl
