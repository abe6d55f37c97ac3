// eager overlap (overlap.h): a unit's update as its gradient arrives, a snapshot of master and
// states to roll back when the step turns out to clip or overflow.
#include "zero/overlap.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "core/trace.h"
#include "zero/optimizer_driver.h"

namespace tz::zero::impl {
namespace {
constexpr const char* kZeroing = "eager update: zeroing the gradient";
// Chrome trace tracks: the worker's waits for a queued unit's gradient and parameters (its waits
// for master and states, and its steps, are on the optimizer driver's "cpu optimizer" track), and
// the model thread's waits for a unit's early update before the unit's next gather or gradient.
constexpr std::string_view kWorkerTrack = "eager worker";
constexpr std::string_view kModelWaitsTrack = "model waits";
}  // namespace

void order_for_next_forward(std::deque<Unit*>& queue) {
  if (queue.size() < 3) return;
  std::sort(queue.begin() + 1, queue.end(),
            [](const Unit* a, const Unit* b) { return a->id < b->id; });
}

// Without the first step's guess the first step kept nothing, and the second read all of those
// states back and wrote them out again: gpt2-774m's step 3 (whose forward runs that tail) moved
// 0.8-1.8 GB more each way than its step 4, and was the slowest against its bound in every run
// (bench/RESULTS.md, twenty-sixth session).
std::vector<const Unit*> kept_states_candidates(const std::vector<Unit*>& order,
                                                const std::deque<Unit>& units) {
  std::vector<const Unit*> out(order.rbegin(), order.rend());
  if (!out.empty()) return out;
  for (const Unit& u : units) {
    if (!u.frozen()) out.push_back(&u);
  }
  return out;
}

EagerOverlap::EagerOverlap(const OverlapDeps& deps, bool snapshot)
    : OverlapMode(deps), snapshot_(snapshot) {}

EagerOverlap::~EagerOverlap() {
  // A running job's status has nowhere to go; it must end before the engine's blocks do.
  if (worker_) wait().ignore();
  worker_.reset();
  // The snapshots are the pool's: they go first (the members' order says so too).
  snapshot_host_.clear();
  snapshot_device_.clear();
}

// The rollback snapshot: device memory with the optimizer there (the plan counts it in the device
// tier), else pinned host memory from the mode's own pool (plan_memory's overlap_bytes).
Status EagerOverlap::finalize(std::uint64_t overlap_bytes, const PinnedPoolOptions& pool_options) {
  EngineContext& ctx = deps_.ctx;
  TZ_ASSERT(updated_early_.empty() && ctx.store != nullptr, "eager finalized twice or early");
  updated_early_.assign(ctx.units.size(), false);
  if (streams_update(ctx.config, ctx.stage, ctx.param_place, ctx.grad_place, ctx.opt_place)) {
    TZ_ASSERT(deps_.driver.cpu_optimizer() != nullptr, "an offloaded optimizer runs on the CPU");
    queued_.assign(ctx.units.size(), false);
    kept_.assign(ctx.units.size(), false);
    done_.assign(ctx.units.size(), false);
    worker_ = std::make_unique<UpdateWorker>();
    if (ctx.opt_place == Placement::kNvme) {
      // The parameter shards (the worker streams on stage 3 with them offloaded) and the
      // host-homed gradient accumulators, which the step reads from the host tier too.
      const std::uint64_t host = ctx.store->budget_bytes(Tier::kHost);
      std::uint64_t resident = 0;
      std::uint64_t states = 0;
      for (const Unit& u : ctx.units) {
        resident += ctx.param_bytes(u);
        if (u.frozen()) continue;
        if (ctx.grad_place == Placement::kHost) resident += ctx.grad_bytes(u);
        states += ctx.optimizer_bytes(u);
      }
      roomy_ = host > resident && host - resident >= host / kKeptStatesMaxShare;
      // Where the states fit beside the rest, their copies stay until the next update, which
      // dirties them again: writing them home early would only add disk traffic.
      write_back_updated_ = roomy_ && resident + states > host;
    }
  }
  if (!snapshot_) return OverlapMode::finalize(overlap_bytes, pool_options);
  TZ_ASSERT(overlap_bytes > 0, "eager's snapshot has no bytes in the plan");
  if (ctx.opt_place == Placement::kDevice) {
    snapshot_device_.resize(ctx.units.size());
    for (const Unit& u : ctx.units) {
      if (u.frozen()) continue;
      TZ_ASSIGN_OR_RETURN(snapshot_device_[u.id],
                          ctx.buffers.allocate(ctx.optimizer_bytes(u)));
    }
    return Status::ok();
  }
  TZ_RETURN_IF_ERROR(create_pool(pool_options));
  snapshot_host_.resize(ctx.units.size());
  for (const Unit& u : ctx.units) {
    if (u.frozen()) continue;
    TZ_ASSIGN_OR_RETURN(snapshot_host_[u.id], pool_->allocate(ctx.optimizer_bytes(u)));
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
  updated_early_[u.id] = true;
  if (worker_) {
    // An NVMe-homed accumulator (gradient_home) now holds the reduced shard, which only the
    // worker reads, and its pins are left out of the trace: the trace's next use of the block is
    // the next step's reduce, an overwrite, so its dirty copy would be the first one evicted,
    // written home and read back for the update (llama-3.2-3b: its whole 6.4 GB gradient, both
    // ways, every step). Kept, it is evicted last until the worker's pin; zeroed after the update,
    // it never reaches the disk. Kept before it is queued, so the worker's pin comes after.
    if (ctx.grad_place == Placement::kNvme) {
      TZ_RETURN_IF_ERROR(ctx.with_unit(u, "eager: keeping the gradient",
                                       ctx.store->keep(u.grad_acc, Tier::kHost)));
    }
    // The previous step's job ran into this step's forward, whose gathers waited for each of
    // its units: it has only to return.
    if (running_ && closed_by_step_) {
      TZ_RETURN_IF_ERROR(wait());
      // What the forward read ahead for this backward (read_ahead_next_backward), loaded by now.
      if (!read_ahead_loads_.empty()) {
        ctx.counters.state_read_ahead_bytes = read_ahead_loads_.since_mark(ctx);
        read_ahead_loads_.clear();
      }
    }
    bool first = false;
    {
      std::lock_guard lock(mu_);
      if (!running_) {
        std::fill(queued_.begin(), queued_.end(), false);
        std::fill(done_.begin(), done_.end(), false);
        closed_ = false;
        zero_after_update_ = false;
        job_over_ = false;
        choose_kept_states();
        order_.clear();
      }
      order_.push_back(&u);
      first = queue_.empty();
      queue_.push_back(&u);
      queued_[u.id] = true;
    }
    progress_.notify_all();
    // The worker reads ahead the unit after the one it starts; a unit that arrives while the
    // queue is empty is the next one it starts, so its states start loading now.
    if (first && ctx.opt_place == Placement::kNvme) deps_.driver.prefetch_states(u);
    if (!running_) {
      running_ = true;
      worker_->submit([this, args = *args_] {
        Status s = run_queue(args);
        {
          std::lock_guard lock(mu_);
          job_over_ = true;
        }
        progress_.notify_all();
        return s;
      });
    }
  } else {
    if (snapshot_) TZ_RETURN_IF_ERROR(copy_snapshot(u, /*to_snapshot=*/true));
    TZ_RETURN_IF_ERROR(deps_.driver.update_unit(u, *args_));
  }
  ctx.counters.early_update_s += seconds_since(t0);
  return Status::ok();
}

Status EagerOverlap::run_queue(const cpu::StepArgs& args) {
  for (;;) {
    Unit* u = nullptr;
    Unit* next = nullptr;
    {
      std::unique_lock lock(mu_);
      progress_.wait(lock, [&] { return !queue_.empty() || closed_; });
      if (queue_.empty()) {
        if (zero_after_update_) read_ahead_next_backward();
        return Status::ok();
      }
      u = queue_.front();
      queue_.pop_front();
      if (!queue_.empty()) next = queue_.front();
    }
    if (next != nullptr && deps_.ctx.opt_place == Placement::kNvme) {
      deps_.driver.prefetch_states(*next);
    }
    if (snapshot_) TZ_RETURN_IF_ERROR(copy_snapshot(*u, /*to_snapshot=*/true));
    TZ_RETURN_IF_ERROR(update_on_host(*u, args));
    // Kept until its next update; else, where the parameters leave the host tier room and the
    // states do not all fit (write_back_updated_), the updated states start going home now, so
    // that their eviction, once the write is done, frees room without a write the next unit's
    // load waits behind (gpt2-774m: the forward's waits for the tail's updates, behind those
    // writes; bench/RESULTS.md, twenty-sixth session). The trace's own early write-backs never
    // see these untraced pins. Not where the tier is tight (llama-3.2-3b): there the copies
    // being written held room the loads needed.
    if (kept_[u->id]) {
      deps_.driver.keep_states(*u);
    } else if (write_back_updated_) {
      deps_.driver.write_back_states(*u);
    }
    // With a snapshot, before the step's decision the unit is done as it is (a rollback may
    // redo its update from the accumulator; apply() zeroes the accumulators of the units done
    // by then); after it, the job zeroes the accumulator first. Without one nothing reads the
    // accumulator again (the norm was taken at the reduce), so it is zeroed now and never
    // written back dirty. One lock hold decides, so every accumulator is zeroed once.
    bool zero = false;
    {
      std::lock_guard lock(mu_);
      zero = zero_after_update_ || !snapshot_;
      if (!zero) done_[u->id] = true;
    }
    if (zero) {
      TZ_RETURN_IF_ERROR(deps_.ctx.zero_gradient(*u, kZeroing));
      std::lock_guard lock(mu_);
      done_[u->id] = true;
    }
    progress_.notify_all();
  }
}

// The units the next forward needs first are the ones the backward reduces last, so their
// updates come last and the forward waits for them (gpt2-774m: its tied `wte`, 0.5 s of master
// and states through the disk, then h.0, h.1 ..., each 0.18 s through the disk, a tail the
// forward's compute cannot cover). Their states are kept in the host tier from their update to
// the next one: the last reduced units of the previous step, latest first, as far as a fifth of
// the tier holds, or a third where the parameter shards and gradient accumulators, which the step
// reads from the host tier too, leave at least that much (roomy_). A fifth: gpt2-774m (wte and
// h.0, 1.0 of 5.6 GB) and llama-3.2-3b (one of its four embedding units, 1.2 of 8 GB) gained most
// with that many (bench/RESULTS.md, fifteenth session). A third, where the parameters leave it:
// gpt2-774m keeps wte and h.0-h.3, and with the read ahead below its step is 6-13% faster on a
// disk-bound machine; on llama-3.2-3b, whose parameters fill most of the tier, a third held two
// embedding units and the step read back the parameters they displaced, 1.3-1.7x slower, and the
// read ahead alone made it 8% slower (twentieth session).
void EagerOverlap::choose_kept_states() {
  std::fill(kept_.begin(), kept_.end(), false);
  const EngineContext& ctx = deps_.ctx;
  if (ctx.opt_place != Placement::kNvme) return;
  const std::uint64_t room =
      ctx.store->budget_bytes(Tier::kHost) / (roomy_ ? kKeptStatesMaxShare : kKeptStatesShare);
  std::uint64_t held = 0;
  for (const Unit* u : kept_states_candidates(order_, ctx.units)) {
    held += ctx.optimizer_bytes(*u);
    if (held > room) break;
    kept_[u->id] = true;
  }
}

// The job ran into the forward and its queue is done: until the next backward's first reduce
// the disk has nothing to do (gpt2-774m: 1 s of a 7 s step; bench/RESULTS.md, twentieth
// session). That backward reduces in this step's order, so where the parameters leave room
// (roomy_) the states of its first units not kept are read now, as far as a fifth of the tier:
// the store loads them into free bytes or in place of untraced copies (Store::prefetch), writing
// the dirty states of the tail's updates home first, so both directions of the disk's work move
// into the forward. Their copies in the host tier are kept first, so that no read ahead takes
// their room.
void EagerOverlap::read_ahead_next_backward() {
  const EngineContext& ctx = deps_.ctx;
  if (!roomy_) return;
  const std::uint64_t room = ctx.store->budget_bytes(Tier::kHost) / kKeptStatesShare;
  std::vector<const Unit*> units;
  std::uint64_t ahead = 0;
  read_ahead_loads_.clear();
  for (const Unit* u : order_) {
    if (kept_[u->id]) continue;
    ahead += ctx.optimizer_bytes(*u);
    if (ahead > room) break;
    units.push_back(u);
    read_ahead_loads_.add(ctx, *u);
  }
  read_ahead_loads_.mark(ctx);
  for (const Unit* u : units) deps_.driver.keep_states(*u);
  for (const Unit* u : units) deps_.driver.prefetch_states(*u);
}

Status EagerOverlap::update_on_host(Unit& u, const cpu::StepArgs& args) {
  EngineContext& ctx = deps_.ctx;
  TZ_ASSIGN_OR_RETURN(Lease acc, ctx.pin_for(u, "eager update: gradient", u.grad_acc, Tier::kHost,
                                             Access::kRead));
  TZ_ASSIGN_OR_RETURN(Lease param, ctx.pin_for(u, "eager update: parameters", u.param,
                                               Tier::kHost, Access::kWrite));
  {
    TraceSpan span(kWorkerTrack, "wait gradient, parameters ", u.spec.name);
    TZ_RETURN_IF_ERROR(ctx.with_unit(u, "eager update: gradient", acc.wait()));
    TZ_RETURN_IF_ERROR(ctx.with_unit(u, "eager update: parameters", param.wait()));
  }
  TZ_ASSIGN_OR_RETURN(const double seconds,
                      deps_.driver.update_unit_on_host(u, args, acc.data(), param.data(),
                                                       "eager update", &param));
  worker_optimizer_s_ += seconds;  // the update released `param`
  acc.release();
  return Status::ok();
}

// The rank's thread stalls on the queued early updates; the job's error, if any, comes back here.
Status EagerOverlap::wait() {
  if (!running_) return Status::ok();
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  progress_.notify_all();
  Status s = worker_->wait();
  running_ = false;
  closed_by_step_ = false;
  {
    std::lock_guard lock(mu_);
    queue_.clear();  // what an error left unstarted
  }
  deps_.ctx.counters.optimizer_s += worker_optimizer_s_;
  worker_optimizer_s_ = 0;
  return s;
}

Status EagerOverlap::wait_unit(const Unit& u) {
  TZ_RETURN_IF_ERROR(OverlapMode::wait_unit(u));
  if (!running_ || u.frozen()) return Status::ok();
  bool done = false;
  {
    std::unique_lock lock(mu_);
    if (!queued_[u.id]) return Status::ok();
    if (!done_[u.id] && !job_over_) {
      TraceSpan span(kModelWaitsTrack, "update of ", u.spec.name);
      progress_.wait(lock, [&] { return done_[u.id] || job_over_; });
    }
    done = done_[u.id];
  }
  // The job ended without this unit: its error comes back now.
  return done ? Status::ok() : wait();
}

Status EagerOverlap::apply(const StepDecision& decision, std::int64_t step, std::int64_t update) {
  TZ_ASSERT(step >= 1 && decision.update != StepUpdate::kBackground,
            "eager updates early or now, never in the background");
  TZ_ASSERT(!decision.roll_back || decision.update != StepUpdate::kEarlyKept,
            "eager keeps no early update it rolled back");
  if (running_ && decision.update == StepUpdate::kEarlyKept) {
    // Kept: the rest of the queue runs into the next forward. The accumulators of the units
    // done by now are zeroed here (without a snapshot the job zeroed them), the job zeroes the
    // others after their updates.
    std::vector<Unit*> zero_now;
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      zero_after_update_ = true;
      order_for_next_forward(queue_);
      for (Unit& u : deps_.ctx.units) {
        TZ_ASSERT(u.frozen() != queued_[u.id], "eager: a trainable unit missed its update");
        if (snapshot_ && done_[u.id]) zero_now.push_back(&u);
      }
    }
    progress_.notify_all();
    closed_by_step_ = true;
    TZ_ASSERT(args_ && args_->step == update, "eager: the kept updates are this step's");
    for (Unit* u : zero_now) TZ_RETURN_IF_ERROR(deps_.ctx.zero_gradient(*u, kZeroing));
    return Status::ok();
  }
  // A rollback, or an update redone now, needs every early update finished first.
  TZ_RETURN_IF_ERROR(wait());
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
  // A job still running (kept updates streamed into the next forward) keeps its own marks.
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
