// The overlap modes (engine_impl.h; docs/zero.md, "Overlap modes"): exact updates in step();
// eager updates a unit as its gradient arrives, with a snapshot to roll back; delayed runs step t's
// update on the UpdateWorker during step t+1 and publishes its parameters at the next step().
#include "gpu/pinned_registration.h"
#include "zero/engine_impl.h"

namespace tz::zero::impl {

// --- Overlap modes (docs/zero.md, "Overlap modes") ---------------------------------------------
Status EngineImpl::init_overlap() {
  const std::string& mode = config_.tierzero.overlap;
  if (mode == "exact") {
    overlap_ = Overlap::kExact;
  } else if (mode == "eager") {
    overlap_ = Overlap::kEager;
    // Only clipping and loss scaling (with its overflow skips) can change a step's multiplier
    // after the early updates; without them the speculation cannot be wrong but for a
    // non-finite gradient the model itself produced (step() reports that as an error).
    eager_snapshot_ = config_.gradient_clipping > 0 || config_.fp16.enabled;
  } else if (mode == "delayed") {
    if (opt_place_ == Placement::kDevice) {
      return Status::invalid_argument(
          "tierzero.overlap: \"delayed\" runs step t's update on the CPU during step t+1's "
          "forward and backward, so it needs zero_optimization.offload_optimizer.device cpu "
          "or nvme (here the optimizer is on the device: use \"exact\" or \"eager\")");
    }
    if (stage_ == 0) {
      return Status::invalid_argument(
          "tierzero.overlap: \"delayed\" needs zero_optimization.stage >= 1 (stage 0 "
          "all-gathers the gradient for the update, a collective the background update "
          "cannot issue)");
    }
    overlap_ = Overlap::kDelayed;
  } else {
    return Status::invalid_argument("tierzero.overlap: expected exact, eager or delayed, got '" +
                                    mode + "'");
  }
  return Status::ok();
}

// The buffers of eager's rollback snapshot and of delayed's pending update (plan_memory counts
// them: overlap_bytes_). They sit beside the store's tiers (their own pinned pool, or device
// allocations for eager with the optimizer on the device).
Status EngineImpl::finalize_overlap() {
  if (overlap_bytes_ == 0) return Status::ok();
  const bool delayed = overlap_ == Overlap::kDelayed;
  const std::size_t es = dtype_size(compute_dtype_);
  const std::uint64_t state_bytes_per_elem = 4ull * (1 + static_cast<std::uint64_t>(states_));
  if (!delayed && opt_place_ == Placement::kDevice) {
    for (Unit& u : units_) {
      if (u.frozen()) continue;
      TZ_ASSIGN_OR_RETURN(u.snapshot_device, allocate_device(u.opt_elems * state_bytes_per_elem));
    }
    return Status::ok();
  }
  PinnedPoolOptions po;
  po.budget_bytes = overlap_bytes_;
  const std::uint64_t slab_unit = 2u << 20;
  po.slab_bytes = std::min<std::uint64_t>(
      1ull << 30, (overlap_bytes_ + slab_unit - 1) / slab_unit * slab_unit);
  po.prefault = false;
  TZ_ASSIGN_OR_RETURN(PinnedPool pool, PinnedPool::create(po));
  overlap_pool_ = std::make_unique<PinnedPool>(std::move(pool));
  TZ_RETURN_IF_ERROR(gpu::register_pinned_pool(device_, *overlap_pool_));
  for (Unit& u : units_) {
    if (u.frozen()) continue;
    if (delayed) {
      TZ_ASSIGN_OR_RETURN(u.delayed_grad, overlap_pool_->allocate(u.layout.shard * 4));
      TZ_ASSIGN_OR_RETURN(u.delayed_params, overlap_pool_->allocate(u.opt_elems * es));
    } else {
      TZ_ASSIGN_OR_RETURN(u.snapshot_host,
                          overlap_pool_->allocate(u.opt_elems * state_bytes_per_elem));
    }
  }
  if (delayed) worker_ = std::make_unique<UpdateWorker>();
  return Status::ok();
}

// eager: the unit's update as soon as its last micro-batch's gradient is reduced, with the
// multiplier the step has when it neither clips nor overflows (1 / (scale N k)); step()
// checks that and rolls back otherwise. The snapshot is taken first when a rollback can come.
Status EngineImpl::update_early(Unit& u) {
  const auto t0 = Clock::now();
  if (!eager_args_) {
    const double divisor =
        scaler_.scale() * static_cast<double>(world_) * gradient_accumulation_steps();
    eager_args_ = update_args(1.0 / divisor, updates_done_ + 1);
  }
  if (eager_snapshot_) TZ_RETURN_IF_ERROR(copy_snapshot(u, /*to_snapshot=*/true));
  TZ_RETURN_IF_ERROR(update_unit(u, *eager_args_));
  u.updated_early = true;
  early_update_s_ += seconds_since(t0);
  return Status::ok();
}

// eager: the unit's master and optimizer states into its snapshot, or back from it.
Status EngineImpl::copy_snapshot(Unit& u, bool to_snapshot) {
  const bool on_device = opt_place_ == Placement::kDevice;
  const Tier tier = on_device ? Tier::kDevice : Tier::kHost;
  const std::size_t bytes = u.opt_elems * 4;
  gpu::Stream& st = device_.compute_stream();
  std::byte* snap = on_device ? u.snapshot_device.as<std::byte>() : u.snapshot_host.data();
  const char* what = to_snapshot ? "eager: snapshot" : "eager: rollback";
  for (int i = 0; i <= states_; ++i) {
    const BlockId block = i == 0 ? u.master : u.state[i - 1];
    TZ_ASSIGN_OR_RETURN(Lease l, pin_for(u, what, block, tier,
                                         to_snapshot ? Access::kRead : Access::kWrite));
    TZ_RETURN_IF_ERROR(with_unit(u, what, l.wait()));
    std::byte* kept = snap + static_cast<std::size_t>(i) * bytes;
    void* dst = to_snapshot ? static_cast<void*>(kept) : l.data();
    const void* src = to_snapshot ? l.data() : static_cast<const void*>(kept);
    if (on_device) {
      TZ_RETURN_IF_ERROR(with_unit(
          u, what, device_.copy_async(dst, src, bytes, gpu::CopyKind::kDeviceToDevice, st)));
      l.release(&st);
    } else {
      std::memcpy(dst, src, bytes);
      l.release();
    }
  }
  return Status::ok();
}

// eager, when the step clips or overflows: every unit updated early gets its master and states
// back, then step() redoes the update exactly (clipping) or skips it (overflow: the parameters
// are re-derived from the restored master, the cast the optimizer's copy makes, so they get
// the bits they had before the early update).
Status EngineImpl::roll_back_early_updates(bool overflow) {
  if (!eager_snapshot_) {
    return Status::corrupt(
        "step " + std::to_string(steps_done_ + 1) + " on rank " + std::to_string(rank_) +
        ": a non-finite gradient under tierzero.overlap \"eager\" without gradient_clipping or "
        "fp16 loss scaling, so without a rollback snapshot: the units were updated as their "
        "gradients arrived and their weights are no longer finite. Resume from a checkpoint, "
        "with \"exact\" (which skips such steps) or with clipping or fp16 on (then eager keeps "
        "a snapshot and rolls back)");
  }
  for (Unit& u : units_) {
    if (!u.updated_early) continue;
    TZ_RETURN_IF_ERROR(copy_snapshot(u, /*to_snapshot=*/false));
    if (overflow) TZ_RETURN_IF_ERROR(write_params_from_master(u));
  }
  return sync(device_.compute_stream(), "eager rollback");
}

// delayed: hands the step's update to the worker. The reduced gradient shards are copied out of
// the accumulators (zeroed for the next step right after); the worker updates master and
// states in place and writes the 16-bit parameters to Unit::delayed_params.
Status EngineImpl::start_delayed_update(const cpu::StepArgs& args) {
  TZ_ASSERT(!update_running_ && !update_unpublished_, "delayed update started twice");
  for (Unit& u : units_) {
    if (u.frozen()) continue;
    TZ_ASSIGN_OR_RETURN(Lease acc, pin_for(u, "delayed: gradient", u.grad_acc, Tier::kHost,
                                           Access::kRead));
    TZ_RETURN_IF_ERROR(with_unit(u, "delayed: gradient", acc.wait()));
    std::memcpy(u.delayed_grad.data(), acc.data(), u.layout.shard * 4);
    acc.release();
  }
  update_running_ = true;
  worker_->submit([this, args] { return run_delayed_update(args); });
  return Status::ok();
}

// The worker's job: every unit's update in registration order (NVMe state read ahead one unit,
// as in exact mode). Touches only the store (thread-safe), the CPU optimizer (the rank's
// thread does not call it while a job runs), the units' delayed buffers and
// worker_optimizer_s_ (read by the rank's thread after wait()).
Status EngineImpl::run_delayed_update(const cpu::StepArgs& args) {
  const bool copy16 = compute_dtype_ != DType::kF32;
  for (std::size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    if (u.frozen()) continue;
    if (opt_place_ == Placement::kNvme) {
      if (const Unit* next = next_trainable(i)) prefetch_states(*next);
    }
    TZ_ASSIGN_OR_RETURN(Lease master, pin_for(u, "delayed update: master", u.master,
                                              Tier::kHost, Access::kReadWrite));
    Lease states[2];
    for (int s = 0; s < states_; ++s) {
      TZ_ASSIGN_OR_RETURN(states[s], pin_for(u, "delayed update: optimizer state", u.state[s],
                                             Tier::kHost, Access::kReadWrite));
    }
    TZ_RETURN_IF_ERROR(with_unit(u, "delayed update: master", master.wait()));
    for (int s = 0; s < states_; ++s) {
      TZ_RETURN_IF_ERROR(with_unit(u, "delayed update: optimizer state", states[s].wait()));
    }
    cpu::Shard shard;
    shard.param = static_cast<float*>(master.data());
    shard.grad = u.delayed_grad.data();
    for (int s = 0; s < states_; ++s) shard.state[s] = states[s].data();
    shard.param_copy = copy16 ? u.delayed_params.data() : nullptr;
    shard.n = u.opt_elems;
    const auto t0 = Clock::now();
    TZ_RETURN_IF_ERROR(with_unit(u, "delayed update: cpu optimizer",
                                 cpu_opt_->step(std::span<const cpu::Shard>(&shard, 1), args)));
    if (!copy16) std::memcpy(u.delayed_params.data(), master.data(), u.opt_elems * 4);
    worker_optimizer_s_ += seconds_since(t0);
    for (int s = 0; s < states_; ++s) states[s].release();
    master.release();
  }
  return Status::ok();
}

// delayed: waits for the update in flight (the rank's thread stalls on the optimizer); its
// error, if any, comes back here.
Status EngineImpl::wait_pending_update() {
  if (!update_running_) return Status::ok();
  Status s = worker_->wait();
  update_running_ = false;
  update_unpublished_ = s.is_ok();
  optimizer_s_ += worker_optimizer_s_;
  worker_optimizer_s_ = 0;
  return s;
}

// delayed: waits for the pending update and publishes its parameters (the next forward sees
// them; persistent stage-3 units are gathered again).
Status EngineImpl::publish_pending_update() {
  TZ_RETURN_IF_ERROR(wait_pending_update());
  if (!update_unpublished_) return Status::ok();
  update_unpublished_ = false;
  for (Unit& u : units_) {
    if (u.frozen()) continue;
    TZ_RETURN_IF_ERROR(write_params(u, u.delayed_params.data()));
    u.persistent_valid = false;
  }
  return Status::ok();
}

}  // namespace tz::zero::impl
