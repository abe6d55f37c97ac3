// The overlap modes (overlap.h): the mode from the config, the interface's defaults, exact mode
// and delayed's update worker. eager: overlap_eager.cc; delayed: overlap_delayed.cc.
#include "zero/overlap.h"

#include <algorithm>

#include "core/log.h"
#include "core/thread_name.h"
#include "gpu/pinned_registration.h"

#include "zero/optimizer_driver.h"

namespace tz::zero::impl {

Result<Overlap> overlap_from_config(const Config& config, Placement optimizer, int stage) {
  const std::string& mode = config.tierzero.overlap;
  if (mode == "exact") return Overlap::kExact;
  if (mode == "eager") return Overlap::kEager;
  if (mode == "delayed") {
    if (optimizer == Placement::kDevice) {
      return Status::invalid_argument(
          "tierzero.overlap: \"delayed\" runs step t's update on the CPU during step t+1's "
          "forward and backward, so it needs zero_optimization.offload_optimizer.device cpu "
          "or nvme (here the optimizer is on the device: use \"exact\" or \"eager\")");
    }
    if (stage == 0) {
      return Status::invalid_argument(
          "tierzero.overlap: \"delayed\" needs zero_optimization.stage >= 1 (stage 0 "
          "all-gathers the gradient for the update, a collective the background update "
          "cannot issue)");
    }
    return Overlap::kDelayed;
  }
  return Status::invalid_argument("tierzero.overlap: expected exact, eager or delayed, got '" +
                                  mode + "'");
}

bool streams_update(const Config& config, int stage, Placement param, Placement gradients,
                    Placement optimizer) {
  return config.tierzero.overlap != "delayed" && config.tierzero.stream_update && stage == 3 &&
         param != Placement::kDevice && gradients != Placement::kDevice &&
         optimizer != Placement::kDevice;
}

bool eager_needs_snapshot(const Config& config) {
  // Without clipping and loss scaling the speculation cannot be wrong but for a non-finite
  // gradient the model itself produced (step() reports that as an error).
  return config.gradient_clipping > 0 || config.fp16.enabled;
}

std::unique_ptr<OverlapMode> OverlapMode::create(Overlap overlap, const OverlapDeps& deps) {
  switch (overlap) {
    case Overlap::kExact:
      return std::make_unique<ExactOverlap>(deps);
    case Overlap::kEager:
      return std::make_unique<EagerOverlap>(deps, eager_needs_snapshot(deps.ctx.config));
    case Overlap::kDelayed:
      TZ_ASSERT(deps.ctx.opt_place != Placement::kDevice && deps.ctx.stage >= 1,
                "delayed needs the CPU optimizer and stage >= 1 (overlap_from_config)");
      return std::make_unique<DelayedOverlap>(deps);
  }
  TZ_ASSERT(false, "unknown overlap mode");
  return nullptr;
}

Status OverlapMode::finalize(std::uint64_t overlap_bytes,
                             const PinnedPoolOptions& /*pool_options*/) {
  TZ_ASSERT(overlap_bytes == 0, "the plan gave buffers to a mode that keeps none");
  return Status::ok();
}

Status OverlapMode::on_reduced(Unit& u, double loss_scale, std::int64_t next_update) {
  TZ_ASSERT(!u.frozen() && loss_scale > 0 && next_update >= 1, "on_reduced of a frozen unit");
  return Status::ok();
}

Status OverlapMode::wait() { return Status::ok(); }

Status OverlapMode::wait_unit(const Unit& u) {
  TZ_ASSERT(u.id < deps_.ctx.units.size(), "wait_unit of an unknown unit");
  return Status::ok();
}

Status OverlapMode::publish() { return Status::ok(); }

void OverlapMode::finish_step() {}

Status OverlapMode::create_pool(const PinnedPoolOptions& options) {
  TZ_ASSERT(pool_ == nullptr && options.budget_bytes > 0,
            "an overlap mode's pool is created once, with bytes");
  TZ_ASSIGN_OR_RETURN(PinnedPool pool, PinnedPool::create(options));
  pool_ = std::make_unique<PinnedPool>(std::move(pool));
  return gpu::register_pinned_pool(deps_.ctx.device, *pool_);
}

Status OverlapMode::update_now(const StepDecision& decision, std::int64_t update) {
  TZ_ASSERT(decision.update == StepUpdate::kNone || decision.update == StepUpdate::kAllUnitsNow,
            "update_now runs no update or every unit's");
  TZ_ASSERT(decision.skip == (decision.update == StepUpdate::kNone),
            "only a skipped step runs no update");
  if (decision.update == StepUpdate::kNone) return Status::ok();
  OptimizerDriver& driver = deps_.driver;
  return driver.update_all(driver.update_args(decision.multiplier, update));
}

ExactOverlap::~ExactOverlap() {
  // A pending update's status has nowhere to go; it must finish before the engine's blocks do.
  if (worker_) worker_->wait().ignore();
  worker_.reset();
}

// Streamed where every unit's update is host work (the CPU optimizer, host-tier parameter shards
// written in place, host gradient accumulators): stage 3, nothing of the update on the device.
Status ExactOverlap::finalize(std::uint64_t overlap_bytes, const PinnedPoolOptions& pool_options) {
  TZ_RETURN_IF_ERROR(OverlapMode::finalize(overlap_bytes, pool_options));
  const EngineContext& ctx = deps_.ctx;
  TZ_ASSERT(worker_ == nullptr, "exact finalized twice");
  if (ctx.opt_place == Placement::kNvme) {
    // The host cache: the host tier less the host-homed blocks, which are all allocated now.
    const std::uint64_t cache =
        ctx.store->budget_bytes(Tier::kHost) - ctx.store->used_bytes(Tier::kHost);
    std::uint64_t bytes = 0;
    for (const Unit& u : ctx.units) {
      if (u.frozen()) continue;
      bytes += ctx.optimizer_bytes(u);
      if (bytes > cache / 2) break;
      read_ahead_.push_back(u.id);
      read_ahead_loads_.add(ctx, u);
    }
  }
  if (!streams_update(ctx.config, ctx.stage, ctx.param_place, ctx.grad_place, ctx.opt_place)) {
    return Status::ok();
  }
  TZ_ASSERT(deps_.driver.cpu_optimizer() != nullptr, "an offloaded optimizer runs on the CPU");
  TZ_LOG_DEBUG("exact: the optimizer's update is streamed into the next forward "
               "(tierzero.stream_update)");
  done_.assign(ctx.units.size(), false);
  worker_ = std::make_unique<UpdateWorker>();
  return Status::ok();
}

Status ExactOverlap::apply(const StepDecision& decision, std::int64_t step, std::int64_t update) {
  TZ_ASSERT(step >= 1 && !decision.roll_back, "exact mode has no early updates to roll back");
  // What the backward read ahead for the update, before the update pins any of it.
  if (read_ahead_next_ > 0) {
    deps_.ctx.counters.state_read_ahead_bytes = read_ahead_loads_.since_mark(deps_.ctx);
  }
  if (!streamed() || decision.update == StepUpdate::kNone) return update_now(decision, update);
  TZ_ASSERT(decision.update == StepUpdate::kAllUnitsNow, "exact updates every unit or none");
  TZ_ASSERT(!running_, "exact: an update started while the previous one runs");
  const cpu::StepArgs args = deps_.driver.update_args(decision.multiplier, update);
  {
    std::lock_guard lock(mu_);
    std::fill(done_.begin(), done_.end(), false);
    job_over_ = false;
  }
  running_ = true;
  worker_->submit([this, args] {
    Status s = run_update(args);
    {
      std::lock_guard lock(mu_);
      job_over_ = true;
    }
    progress_.notify_all();
    return s;
  });
  return Status::ok();
}

// The update waits for the global norm, so the backward leaves the disk to the parameters it
// reads (none when they are cached) while the update's state reads and write-backs fill the
// next forward. Each reduced unit starts one read of the update's first units' master and states
// instead (Store::prefetch: into free room, or in place of copies the step's trace does not use
// again, the previous update's states, written home first if dirty), as far as half the host
// cache holds, so the update finds them loaded.
Status ExactOverlap::on_reduced(Unit& u, double loss_scale, std::int64_t next_update) {
  TZ_RETURN_IF_ERROR(OverlapMode::on_reduced(u, loss_scale, next_update));
  if (read_ahead_next_ < read_ahead_.size()) {
    if (read_ahead_next_ == 0) read_ahead_loads_.mark(deps_.ctx);
    deps_.driver.prefetch_states(deps_.ctx.unit(read_ahead_[read_ahead_next_++]));
  }
  return Status::ok();
}

void StateLoads::add(const EngineContext& ctx, const Unit& u) {
  blocks_.push_back(u.master);
  blocks_.insert(blocks_.end(), u.state, u.state + ctx.states);
}

std::uint64_t StateLoads::loads(const EngineContext& ctx) const {
  return ctx.store->block_stats(blocks_).tier_bytes_in(Tier::kHost);
}

Status ExactOverlap::run_update(const cpu::StepArgs& args) {
  EngineContext& ctx = deps_.ctx;
  return deps_.driver.for_each_update([&](Unit& u) -> Status {
    // The reduced gradient (zeroed once read, for the next step's accumulation) and this rank's
    // parameter shard in the host tier, overwritten in place.
    TZ_ASSIGN_OR_RETURN(Lease acc, ctx.pin_for(u, "streamed update: gradient", u.grad_acc,
                                               Tier::kHost, Access::kRead));
    TZ_ASSIGN_OR_RETURN(Lease param, ctx.pin_for(u, "streamed update: parameters", u.param,
                                                 Tier::kHost, Access::kWrite));
    TZ_RETURN_IF_ERROR(ctx.with_unit(u, "streamed update: gradient", acc.wait()));
    TZ_RETURN_IF_ERROR(ctx.with_unit(u, "streamed update: parameters", param.wait()));
    TZ_ASSIGN_OR_RETURN(const double seconds,
                        deps_.driver.update_unit_on_host(u, args, acc.data(), param.data(),
                                                         "streamed update", &param));
    worker_optimizer_s_ += seconds;  // the update released `param`
    acc.release();
    TZ_RETURN_IF_ERROR(ctx.zero_gradient(u, "streamed update: zeroing the gradient"));
    {
      std::lock_guard lock(mu_);
      done_[u.id] = true;
    }
    progress_.notify_all();
    return Status::ok();
  });
}

Status ExactOverlap::wait_unit(const Unit& u) {
  TZ_RETURN_IF_ERROR(OverlapMode::wait_unit(u));
  if (!running_ || u.frozen()) return Status::ok();
  bool done = false;
  {
    std::unique_lock lock(mu_);
    progress_.wait(lock, [&] { return done_[u.id] || job_over_; });
    done = done_[u.id];
  }
  // The job ended without this unit: its error comes back now.
  return done ? Status::ok() : wait();
}

// The rank's thread stalls on the optimizer; the job's error, if any, comes back here.
Status ExactOverlap::wait() {
  if (!running_) return Status::ok();
  Status s = worker_->wait();
  running_ = false;
  deps_.ctx.counters.optimizer_s += worker_optimizer_s_;
  worker_optimizer_s_ = 0;
  return s;
}

UpdateWorker::~UpdateWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void UpdateWorker::submit(std::function<Status()> job) {
  TZ_ASSERT(job != nullptr, "UpdateWorker::submit of no job");
  {
    std::lock_guard lock(mu_);
    TZ_ASSERT(!busy_, "UpdateWorker::submit while a job is pending");
    job_ = std::move(job);
    busy_ = true;
  }
  wake_.notify_all();
}

Status UpdateWorker::wait() {
  std::unique_lock lock(mu_);
  done_.wait(lock, [this] { return !busy_; });
  return std::exchange(result_, Status::ok());
}

bool UpdateWorker::busy() const {
  std::lock_guard lock(mu_);
  return busy_;
}

void UpdateWorker::loop() {
  set_thread_name("tz-update");
  // The jobs' pins interleave with the model's in an order that changes from step to step: left
  // out of the store's trace, they leave its prefetch walk and Belady's eviction to the model's
  // pins, which repeat (the jobs read ahead with Store::prefetch).
  const store::UntracedPins untraced;
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || job_ != nullptr; });
    if (job_ == nullptr) return;  // stop_ with nothing left to run
    std::function<Status()> job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    Status s = job();  // no lock held: the job waits on store moves
    lock.lock();
    result_ = std::move(s);
    busy_ = false;
    done_.notify_all();
  }
}

}  // namespace tz::zero::impl
