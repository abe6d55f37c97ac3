// eager overlap (overlap.h): a unit's update as its gradient arrives, a snapshot of master and
// states to roll back when the step turns out to clip or overflow.
#include "zero/optimizer_driver.h"
#include "zero/overlap.h"

namespace tz::zero::impl {

EagerOverlap::EagerOverlap(const OverlapDeps& deps, bool snapshot)
    : OverlapMode(deps), snapshot_(snapshot) {}

EagerOverlap::~EagerOverlap() {
  // The snapshots are the pool's: they go first (the members' order says so too).
  snapshot_host_.clear();
  snapshot_device_.clear();
}

// The rollback snapshot: device memory with the optimizer there (the plan counts it in the device
// tier), else pinned host memory from the mode's own pool (plan_memory's overlap_bytes).
Status EagerOverlap::finalize(std::uint64_t overlap_bytes) {
  EngineContext& ctx = deps_.ctx;
  TZ_ASSERT(updated_early_.empty() && ctx.store != nullptr, "eager finalized twice or early");
  updated_early_.assign(ctx.units.size(), false);
  if (!snapshot_) return OverlapMode::finalize(overlap_bytes);
  TZ_ASSERT(overlap_bytes > 0, "eager's snapshot has no bytes in the plan");
  const std::uint64_t state_bytes_per_elem = 4ull * (1 + static_cast<std::uint64_t>(ctx.states));
  if (ctx.opt_place == Placement::kDevice) {
    snapshot_device_.resize(ctx.units.size());
    for (const Unit& u : ctx.units) {
      if (u.frozen()) continue;
      TZ_ASSIGN_OR_RETURN(snapshot_device_[u.id],
                          ctx.buffers.allocate(u.opt_elems * state_bytes_per_elem));
    }
    return Status::ok();
  }
  TZ_RETURN_IF_ERROR(create_pool(overlap_bytes));
  snapshot_host_.resize(ctx.units.size());
  for (const Unit& u : ctx.units) {
    if (u.frozen()) continue;
    TZ_ASSIGN_OR_RETURN(snapshot_host_[u.id], pool_->allocate(u.opt_elems * state_bytes_per_elem));
  }
  return Status::ok();
}

// The unit's update with the multiplier the step has when it neither clips nor overflows
// (1 / (scale N k)); apply() checks that and rolls back otherwise. The snapshot is taken first
// when a rollback can come.
Status EagerOverlap::on_reduced(Unit& u, double loss_scale, std::int64_t next_update) {
  TZ_RETURN_IF_ERROR(OverlapMode::on_reduced(u, loss_scale, next_update));
  TZ_ASSERT(u.id < updated_early_.size() && !updated_early_[u.id],
            "eager: a unit updated early twice in one step");
  EngineContext& ctx = deps_.ctx;
  const auto t0 = Clock::now();
  if (!args_) {
    const double divisor = loss_scale * static_cast<double>(ctx.world) * ctx.accumulation_steps();
    args_ = deps_.driver.update_args(1.0 / divisor, next_update);
  }
  TZ_ASSERT(args_->step == next_update, "eager: one update number per step");
  if (snapshot_) TZ_RETURN_IF_ERROR(copy_snapshot(u, /*to_snapshot=*/true));
  TZ_RETURN_IF_ERROR(deps_.driver.update_unit(u, *args_));
  updated_early_[u.id] = true;
  ctx.counters.early_update_s += seconds_since(t0);
  return Status::ok();
}

Status EagerOverlap::apply(const StepDecision& decision, std::int64_t step, std::int64_t update) {
  TZ_ASSERT(step >= 1 && decision.update != StepUpdate::kBackground,
            "eager updates early or now, never in the background");
  TZ_ASSERT(!decision.roll_back || decision.update != StepUpdate::kEarlyKept,
            "eager keeps no early update it rolled back");
  if (decision.roll_back) TZ_RETURN_IF_ERROR(roll_back(decision.skip, step));
  if (decision.update != StepUpdate::kEarlyKept) return update_now(decision, update);
  // The early updates were this step's: every trainable unit had one, with this update number.
  TZ_ASSERT(args_ && args_->step == update, "eager: the kept updates are this step's");
  for (const Unit& u : deps_.ctx.units) {
    TZ_ASSERT(u.frozen() != updated_early_[u.id], "eager: a trainable unit missed its update");
  }
  return Status::ok();
}

void EagerOverlap::finish_step() {
  std::fill(updated_early_.begin(), updated_early_.end(), false);
  args_.reset();
}

Status EagerOverlap::copy_snapshot(Unit& u, bool to_snapshot) {
  EngineContext& ctx = deps_.ctx;
  const bool on_device = ctx.opt_place == Placement::kDevice;
  TZ_ASSERT(snapshot_ && !u.frozen(), "eager: a snapshot needs one kept and a trainable unit");
  const Tier tier = on_device ? Tier::kDevice : Tier::kHost;
  const std::size_t bytes = u.opt_elems * 4;
  gpu::Stream& st = ctx.stream();
  std::byte* snap =
      on_device ? snapshot_device_[u.id].as<std::byte>() : snapshot_host_[u.id].data();
  const char* what = to_snapshot ? "eager: snapshot" : "eager: rollback";
  for (int i = 0; i <= ctx.states; ++i) {
    const BlockId block = i == 0 ? u.master : u.state[i - 1];
    TZ_ASSIGN_OR_RETURN(
        Lease l, ctx.pin_for(u, what, block, tier, to_snapshot ? Access::kRead : Access::kWrite));
    TZ_RETURN_IF_ERROR(ctx.with_unit(u, what, l.wait()));
    std::byte* kept = snap + static_cast<std::size_t>(i) * bytes;
    void* dst = to_snapshot ? static_cast<void*>(kept) : l.data();
    const void* src = to_snapshot ? l.data() : static_cast<const void*>(kept);
    if (on_device) {
      TZ_RETURN_IF_ERROR(ctx.with_unit(
          u, what, ctx.device.copy_async(dst, src, bytes, gpu::CopyKind::kDeviceToDevice, st)));
      l.release(&st);
    } else {
      std::memcpy(dst, src, bytes);
      l.release();
    }
  }
  return Status::ok();
}

Status EagerOverlap::roll_back(bool overflow, std::int64_t step) {
  EngineContext& ctx = deps_.ctx;
  if (!snapshot_) {
    return Status::corrupt(
        "step " + std::to_string(step) + " on rank " + std::to_string(ctx.rank) +
        ": a non-finite gradient under tierzero.overlap \"eager\" without gradient_clipping or "
        "fp16 loss scaling, so without a rollback snapshot: the units were updated as their "
        "gradients arrived and their weights are no longer finite. Resume from a checkpoint, "
        "with \"exact\" (which skips such steps) or with clipping or fp16 on (then eager keeps "
        "a snapshot and rolls back)");
  }
  for (Unit& u : ctx.units) {
    if (!updated_early_[u.id]) continue;
    TZ_RETURN_IF_ERROR(copy_snapshot(u, /*to_snapshot=*/false));
    if (overflow) TZ_RETURN_IF_ERROR(deps_.driver.write_params_from_master(u));
  }
  return ctx.sync(ctx.stream(), "eager rollback");
}

}  // namespace tz::zero::impl
