// delayed overlap (overlap.h): step t's update on the UpdateWorker during step t+1's forward and
// backward, its parameters published at the next step().
#include "zero/coordinator.h"
#include "zero/optimizer_driver.h"
#include "zero/overlap.h"

namespace tz::zero::impl {

DelayedOverlap::~DelayedOverlap() {
  // A pending update's status has nowhere to go; it must finish before its buffers do.
  if (worker_) worker_->wait().ignore();
  worker_.reset();
}

// The pending update's gradient shards (in EngineContext::grad_dtype) and 16-bit parameters,
// from the mode's own pinned pool (plan_memory's overlap_bytes), and the worker.
Status DelayedOverlap::finalize(std::uint64_t overlap_bytes,
                                const PinnedPoolOptions& pool_options) {
  EngineContext& ctx = deps_.ctx;
  TZ_ASSERT(worker_ == nullptr && ctx.store != nullptr, "delayed finalized twice or early");
  TZ_ASSERT(overlap_bytes > 0 && deps_.driver.cpu_optimizer() != nullptr,
            "delayed needs its buffers in the plan and the CPU optimizer");
  TZ_RETURN_IF_ERROR(create_pool(pool_options));
  const std::size_t es = dtype_size(ctx.compute_dtype);
  const std::size_t gs = dtype_size(ctx.grad_dtype);
  grad_.resize(ctx.units.size());
  params_.resize(ctx.units.size());
  for (const Unit& u : ctx.units) {
    if (u.frozen()) continue;
    TZ_ASSIGN_OR_RETURN(grad_[u.id], pool_->allocate(u.layout.shard * gs));
    TZ_ASSIGN_OR_RETURN(params_[u.id], pool_->allocate(u.opt_elems * es));
  }
  worker_ = std::make_unique<UpdateWorker>();
  return Status::ok();
}

Status DelayedOverlap::apply(const StepDecision& decision, std::int64_t step, std::int64_t update) {
  TZ_ASSERT(step >= 1 && !decision.roll_back, "delayed has no early updates to roll back");
  TZ_ASSERT(decision.update == StepUpdate::kNone || decision.update == StepUpdate::kBackground,
            "delayed updates in the background or not at all");
  TZ_ASSERT(!running_ && !unpublished_, "delayed update started while one is pending");
  TZ_ASSERT(worker_ != nullptr, "delayed apply before finalize");
  if (decision.update == StepUpdate::kNone) return Status::ok();
  EngineContext& ctx = deps_.ctx;
  const cpu::StepArgs args = deps_.driver.update_args(decision.multiplier, update);
  for (Unit& u : ctx.units) {
    if (u.frozen()) continue;
    TZ_ASSIGN_OR_RETURN(
        Lease acc, ctx.pin_for(u, "delayed: gradient", u.grad_acc, Tier::kHost, Access::kRead));
    TZ_RETURN_IF_ERROR(ctx.with_unit(u, "delayed: gradient", acc.wait()));
    std::memcpy(grad_[u.id].data(), acc.data(), u.layout.shard * dtype_size(ctx.grad_dtype));
    acc.release();
  }
  running_ = true;
  worker_->submit([this, args] { return run_update(args); });
  return Status::ok();
}

Status DelayedOverlap::run_update(const cpu::StepArgs& args) {
  return deps_.driver.for_each_update([&](Unit& u) -> Status {
    TZ_ASSIGN_OR_RETURN(const double seconds,
                        deps_.driver.update_unit_on_host(u, args, grad_[u.id].data(),
                                                         params_[u.id].data(), "delayed update"));
    worker_optimizer_s_ += seconds;
    return Status::ok();
  });
}

// The rank's thread stalls on the optimizer; the job's error, if any, comes back here.
Status DelayedOverlap::wait() {
  if (!running_) return Status::ok();
  TZ_ASSERT(!unpublished_, "delayed: an update finished and another ran before publishing");
  Status s = worker_->wait();
  running_ = false;
  unpublished_ = s.is_ok();
  deps_.ctx.counters.optimizer_s += worker_optimizer_s_;
  worker_optimizer_s_ = 0;
  return s;
}

// The next forward sees the update's parameters; persistent stage-3 units are gathered again.
Status DelayedOverlap::publish() {
  TZ_RETURN_IF_ERROR(wait());
  if (!unpublished_) return Status::ok();
  TZ_ASSERT(!running_, "delayed: publish while the update runs");
  unpublished_ = false;
  for (Unit& u : deps_.ctx.units) {
    if (u.frozen()) continue;
    TZ_RETURN_IF_ERROR(deps_.driver.write_params(u, params_[u.id].data()));
    deps_.coordinator.invalidate(u.id);
  }
  return Status::ok();
}

}  // namespace tz::zero::impl
