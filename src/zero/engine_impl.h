// The ZeRO engine's implementation (engine.h's Engine), private to zero/: the per-unit state, the
// background update worker and EngineImpl, whose members are defined one file per DESIGN.md
// component:
//   engine.cc            the model API's entry points: init, registration, finalize (the tiered
//                        stack from store/stack.h), weights in and out, step() (on the pure step
//                        decision, step_decision.h), shared block and stream helpers
//   coordinator.cc       parameter coordinator: gather, release, persistent units, device buffers
//   reducer.cc           gradient reducer: grad, reduce, host accumulation, the global norm
//   optimizer_driver.cc  optimizer driver: unit updates, 16-bit parameters written home
//   overlap.cc           overlap modes exact / eager / delayed (snapshot, rollback, worker)
//   accounting.cc        plan, formulas, peaks, the step's bound and comm formula, params_xxh3
//
// Frozen units (UnitSpec::frozen) have only their parameter block, in the compute dtype, homed
// where offload_param says; every path that touches gradients, masters or optimizer state (the
// reducer, the norm, the optimizer driver, the overlap modes) skips them, and the engine pins
// their block for writing only in set_tensor, so after loading the store never writes it back.
//
// Every stage reduces a unit's full gradient with the same reduce-scatter (ReduceOp::kSum, in the
// compute dtype, over the same padded layout) into this rank's shard and accumulates it in fp32,
// and every stage computes the global norm from those shards in unit order, so the update each
// element sees is the same in every stage and every placement: fp32 masters are bit-identical.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/assert.h"
#include "core/log.h"
#include "cpu/optimizer.h"
#include "cpu/pinned_pool.h"
#include "gpu/device.h"
#include "store/store.h"
#include "zero/engine.h"
#include "zero/layout.h"
#include "zero/loss_scaler.h"
#include "zero/optimizer_args.h"
#include "zero/plan.h"
#include "zero/schedule.h"
#include "zero/step_decision.h"

namespace tz::zero::impl {
using store::Access;
using store::BlockId;
using store::Lease;
using store::Tier;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// fp32 += a 16-bit or fp32 gradient on the host, the same IEEE sums as device_accumulate_coeffs.
inline void host_accumulate(float* acc, const void* grad, DType dtype, std::size_t n) {
  switch (dtype) {
    case DType::kF32: {
      const auto* g = static_cast<const float*>(grad);
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] + g[i];
      return;
    }
    case DType::kBF16: {
      const auto* g = static_cast<const bf16*>(grad);
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] + bf16_to_f32(g[i]);
      return;
    }
    case DType::kF16: {
      const auto* g = static_cast<const fp16*>(grad);
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] + fp16_to_f32(g[i]);
      return;
    }
  }
}

// fp32 -> dtype on the host (round to nearest even, as Device::cast).
inline void host_cast_from_f32(const float* src, void* dst, DType dtype, std::size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      auto* d = static_cast<bf16*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<fp16*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_fp16(src[i]);
      return;
    }
  }
}

// A collective scalar reduction that is exact and identical on every rank: rank r writes its
// values, each split into four 16-bit pieces stored as small integers in fp32, into slot r of an
// otherwise zero buffer; an fp32 sum all-reduce of integers below 2^24 with zeros is exact, so
// every rank decodes every rank's exact values and combines them in rank order.
inline constexpr std::size_t kScalarPieces = 4;
inline void encode_u64(std::uint64_t x, float* out) {
  for (std::size_t i = 0; i < kScalarPieces; ++i) {
    out[i] = static_cast<float>((x >> (16 * i)) & 0xffffu);
  }
}
inline std::uint64_t decode_u64(const float* in) {
  std::uint64_t x = 0;
  for (std::size_t i = 0; i < kScalarPieces; ++i) {
    x |= static_cast<std::uint64_t>(in[i]) << (16 * i);
  }
  return x;
}

struct DeferredFree {
  std::unique_ptr<gpu::Event> done;
  gpu::DeviceBuffer buffer;
};

// delayed mode's background update: one job at a time on a thread the engine owns. The job only
// pins store blocks and runs the CPU optimizer (the store and the optimizer are safe to call from
// another thread); it never touches a stream or a collective, so the rank's calls still pair up
// across ranks in the same order.
class UpdateWorker {
 public:
  UpdateWorker() : thread_([this] { loop(); }) {}
  ~UpdateWorker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  // Starts `job`; the previous one must have been waited for.
  void submit(std::function<Status()> job) {
    {
      std::lock_guard lock(mu_);
      TZ_ASSERT(!busy_, "UpdateWorker::submit while a job is pending");
      job_ = std::move(job);
      busy_ = true;
    }
    wake_.notify_all();
  }

  // Blocks until the submitted job (if any) has finished; returns its status once.
  Status wait() {
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return !busy_; });
    return std::exchange(result_, Status::ok());
  }

 private:
  void loop() {
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

  std::mutex mu_;  // guards every member below; never held while a job runs
  std::condition_variable wake_;
  std::condition_variable done_;
  std::function<Status()> job_;
  bool busy_ = false;
  bool stop_ = false;
  Status result_ = Status::ok();
  std::thread thread_;  // last: started after the members it reads
};

// The block id of a frozen unit's absent master, states and gradient accumulator.
inline constexpr BlockId kNoBlock = std::numeric_limits<BlockId>::max();

struct Unit {
  UnitSpec spec;
  UnitLayout layout;
  // Elements of master and states on this rank (P in stage 0, else S; 0 for a frozen unit).
  std::size_t opt_elems = 0;
  BlockId param = 0;          // stage 3: this rank's shard; stages 0-2: the full unit
  BlockId master = kNoBlock;
  BlockId state[2] = {kNoBlock, kNoBlock};
  BlockId grad_acc = kNoBlock;  // fp32 reduced gradient shard, accumulated over micro-batches
  bool frozen() const { return spec.frozen; }
  // gather state
  int gather_refs = 0;
  Lease param_lease;            // stages 0-2: the full block pinned while gathered
  gpu::DeviceBuffer gathered;   // stage 3: the all-gathered unit
  // Stage 3, numel below stage3_param_persistence_threshold: gathered once per step and kept.
  bool persistent = false;
  bool persistent_valid = false;
  UnitViews views;
  // gradient state
  gpu::DeviceBuffer grad_buffer;
  UnitViews grad_views;
  int reduces = 0;  // reduce() calls since the last step
  // delayed: the step's reduced fp32 gradient shard the background update reads (the
  // accumulator is zeroed for the next step meanwhile) and the 16-bit parameters it writes, which
  // the next step() publishes.
  PinnedBuffer delayed_grad;
  PinnedBuffer delayed_params;
  // eager: master and optimizer states as they were before the early update (host for the CPU
  // optimizer, device for the device one), kept when clipping or loss scaling may undo it.
  PinnedBuffer snapshot_host;
  gpu::DeviceBuffer snapshot_device;
  bool updated_early = false;
  // Stages 0-2: all-gathers of the unit's updated parameters (stage 0: of its reduced gradient)
  // this step, for comm_formula.
  std::uint64_t update_gathers = 0;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineOptions& options, gpu::Device& device, comm::Comm& comm)
      : options_(options),
        config_(options.config),
        device_(device),
        comm_(comm),
        rank_(comm.rank()),
        world_(comm.world_size()),
        scaler_(options.config.fp16) {}

  ~EngineImpl() override {
    // Work that still reads engine buffers must finish before they go: a pending delayed
    // update (its status has nowhere to go) and the device's streams.
    if (worker_) worker_->wait().ignore();
    worker_.reset();
    device_.synchronize().ignore();
    for (Unit& u : units_) {
      u.param_lease.release();
      u.gathered.reset();
      u.grad_buffer.reset();
      u.snapshot_device.reset();
      u.snapshot_host.reset();  // the overlap pool must outlive its buffers
      u.delayed_grad.reset();
      u.delayed_params.reset();
    }
    deferred_.clear();
    store_.reset();
    stage16_.reset();
    stage32_.reset();
  }

  Status init();

  // --- Registration ----------------------------------------------------------------------------
  Result<UnitId> register_unit(UnitSpec spec) override;

  Status finalize() override;

  // --- Weights in and out ------------------------------------------------------------------------
  Status set_tensor(UnitId id, std::size_t tensor, std::span<const float> values,
                    TensorState which) override;

  Status get_tensor(UnitId id, std::size_t tensor, std::span<float> out,
                    TensorState which) override;

  std::pair<std::size_t, std::size_t> tensor_range(UnitId id, std::size_t tensor) const override;

  Status set_tensor_slice(UnitId id, std::size_t tensor, std::size_t first_elem,
                          std::span<const float> values, TensorState which) override;  // tensor_slice.cc

  nlohmann::ordered_json scalar_state() const override;

  Status restore_scalar_state(const nlohmann::json& state) override;

  // --- One micro-batch ---------------------------------------------------------------------------
  Result<UnitViews> gather(UnitId id) override;

  Status release(UnitId id) override;

  Result<UnitViews> grad(UnitId id) override;

  Status reduce(UnitId id) override;

  Result<StepReport> step() override;
  Status check_step_ready(int k) const;
  Status apply_update(const StepDecision& decision);                 // optimizer_driver.cc
  void close_step_report(StepReport& report, Clock::time_point t_opt);  // accounting.cc

  // --- What the model needs to know -------------------------------------------------------------
  gpu::Device& device() override { return device_; }
  gpu::Stream& compute_stream() override { return device_.compute_stream(); }
  DType compute_dtype() const override { return compute_dtype_; }
  double loss_scale() const override { return scaler_.scale(); }
  int gradient_accumulation_steps() const override;
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::int64_t steps_done() const override { return steps_done_; }
  std::uint64_t param_count() const override { return param_count_; }
  std::uint64_t trainable_param_count() const override { return trainable_param_count_; }
  std::size_t unit_count() const override { return units_.size(); }
  const UnitSpec& unit_spec(UnitId unit) const override;
  const UnitLayout& layout(UnitId unit) const override;
  int optimizer_state_count() const override { return states_; }
  const EngineOptions& options() const override { return options_; }

  // --- Accounting ---------------------------------------------------------------------------------
  nlohmann::ordered_json plan_json() const override;

  // DESIGN.md's memory table for this config: what each tier would hold by the formula.
  TierBytes formula_bytes() const;

  std::uint64_t tier_plan(Tier t) const;

  TierBytes plan_bytes() const override;

  TierBytes peak_bytes() const override;

  Result<std::uint64_t> params_xxh3() override;

 private:
  TierBytes bytes_in_use() const;

  // The step's accounting window opens at its first gather or grad (set_tensor and checkpoint
  // traffic between steps is not the step's).
  void open_step();

  // Frozen parameters set since the last call are written to their home tier now (a store
  // flush), so that their loading is never a step's traffic; called by gather, grad and step.
  Status flush_frozen_loads();

  // Store::home_write_bytes summed over frozen units' blocks (first) and trainable units'.
  std::pair<std::uint64_t, std::uint64_t> home_write_bytes() const;

  // The step's lower bound (DESIGN.md): max(compute, NVMe bytes / NVMe bandwidth, host<->device
  // bytes / copy bandwidth, CPU optimizer time). Compute is the step's time outside the engine's
  // calls (the model's own work), or the compute stream's busy time where the device can tell
  // (HostDevice: the model's kernels run on the stream's thread while the engine waits in its
  // calls, so the time outside them is only the enqueueing). On a host-accessible device compute
  // and the CPU optimizer run on the same cores, so those two add. A bandwidth of 0 (unknown)
  // drops its term.
  double step_bound(const StepReport& r, std::uint64_t copy_bytes) const;

  Status check_unit(UnitId id, const char* what) const;

  // kInvalidArgument naming the unit when it is frozen (grad, reduce, optimizer states).
  Status check_trainable(const Unit& u, const char* what) const;

  // get_tensor of a frozen unit: its compute-dtype parameters widened to fp32.
  Status get_frozen_tensor(Unit& u, std::size_t tensor, std::span<float> out);

  Status check_tensor(UnitId id, std::size_t tensor, std::size_t n, const char* what) const;

  Result<BlockId> state_block(const Unit& u, TensorState which) const;

  // A store pin whose error names the unit, shard and what it was for.
  Result<Lease> pin_for(const Unit& u, const char* what, BlockId block, Tier tier, Access access);

  // Prefixes an error with the unit and rank.
  Status with_unit(const Unit& u, const char* what, Status s) const;

  Status sync(gpu::Stream& st, const std::string& what);

  UnitViews make_views(const Unit& u, void* base, DType dtype) const;

  // Device buffers freed only after the compute stream's work so far (an event), so release()
  // and reduce() never block; an allocation that does not fit waits for them first.
  Status defer_free(gpu::DeviceBuffer buffer);

  void reap_deferred(bool all);

  // The compute stream may run far behind the caller (HostDevice, a queued GPU), so buffers whose
  // free waits for it can pile up: an allocation that would take the device past the plan (or that
  // the device refuses) first waits for them, so the peak stays within the plan, not the budget.
  // The store's device room not yet filled counts as taken: its cache of offloaded shards loads
  // ahead on its own threads, so deferred frees that filled that room would let its next load
  // pass the plan (stage 3 with offloaded parameters).
  Result<gpu::DeviceBuffer> allocate_device(std::size_t bytes);

  // Device bytes the store may still allocate: its device budget less what it holds (copies in
  // use and its cache of freed buffers).
  std::uint64_t store_device_room() const;

  // Host bytes into a block at `offset`, in its home tier (device blocks through a copy).
  Status write_block(BlockId block, std::size_t offset, const void* src, std::size_t bytes);

  Status read_block(BlockId block, std::size_t offset, void* dst, std::size_t bytes);
  Status host_block_copy(BlockId block, std::size_t offset, const void* src, void* dst,
                         std::size_t bytes);

  // A block's bytes into device memory (synchronously complete on return).
  Status read_block_to_device(BlockId block, std::size_t offset, void* dst, std::size_t bytes);

  Tier home_tier(BlockId block) const;

  Result<gpu::NormAccumulator> local_norm();

  Result<gpu::NormAccumulator> all_reduce_norm(const gpu::NormAccumulator& local);

  // Stage 0: every rank's reduced shard gathered into the full fp32-exact gradient of the unit,
  // in 16-bit when the shard holds one micro-batch (its fp32 values are exact 16-bit values, so
  // the bits match stage 1's) and in fp32 otherwise. Returns the dtype; data in `dev_full`.
  Result<DType> gather_full_gradient(Unit& u, const Lease& acc, gpu::DeviceBuffer& dev_full);

  Result<const void*> update_gradient(Unit& u, const Lease& acc, bool on_device,
                                      gpu::DeviceBuffer& dev_full, DType& grad_dtype);
  Status update_unit(Unit& u, const cpu::StepArgs& args);

  // --- Overlap modes (docs/zero.md, "Overlap modes") ---------------------------------------------
  Status init_overlap();

  // The buffers of eager's rollback snapshot and of delayed's pending update (plan_memory counts
  // them: overlap_bytes_). They sit beside the store's tiers (their own pinned pool, or device
  // allocations for eager with the optimizer on the device).
  Status finalize_overlap();

  // The optimizer's arguments for update number `step` (1-based, skipped steps excluded) with
  // gradient multiplier `multiplier`; the schedule's learning rate for it (DeepSpeed advances
  // the schedule after each applied update).
  cpu::StepArgs update_args(double multiplier, std::int64_t step) const;

  // eager: the unit's update as soon as its last micro-batch's gradient is reduced, with the
  // multiplier the step has when it neither clips nor overflows (1 / (scale N k)); step()
  // checks that and rolls back otherwise. The snapshot is taken first when a rollback can come.
  Status update_early(Unit& u);

  // eager: the unit's master and optimizer states into its snapshot, or back from it.
  Status copy_snapshot(Unit& u, bool to_snapshot);

  // eager, when the step clips or overflows: every unit updated early gets its master and states
  // back, then step() redoes the update exactly (clipping) or skips it (overflow: the parameters
  // are re-derived from the restored master, the cast the optimizer's copy makes, so they get
  // the bits they had before the early update).
  Status roll_back_early_updates(bool overflow);

  // The compute-dtype parameters of `u` written from its master (stages 1-2: this rank's slice,
  // then all-gathered), as update_unit writes the optimizer's copy.
  Status write_params_from_master(Unit& u);

  // This rank's compute-dtype parameters of `u` (opt_elems elements of host memory in
  // `src`) into the parameter block where the next forward finds them: in place in the host
  // tier for a host- or NVMe-homed stage-3 shard, else the device copy; stages 1-2 write their
  // slice and all-gather the full unit.
  Status write_params(Unit& u, const void* src);

  // delayed: hands the step's update to the worker. The reduced gradient shards are copied out of
  // the accumulators (zeroed for the next step right after); the worker updates master and
  // states in place and writes the 16-bit parameters to Unit::delayed_params.
  Status start_delayed_update(const cpu::StepArgs& args);

  // The worker's job: every unit's update in registration order (NVMe state read ahead one unit,
  // as in exact mode). Touches only the store (thread-safe), the CPU optimizer (the rank's
  // thread does not call it while a job runs), the units' delayed buffers and
  // worker_optimizer_s_ (read by the rank's thread after wait()).
  Status run_delayed_update(const cpu::StepArgs& args);

  // delayed: waits for the update in flight (the rank's thread stalls on the optimizer); its
  // error, if any, comes back here.
  Status wait_pending_update();

  // delayed: waits for the pending update and publishes its parameters (the next forward sees
  // them; persistent stage-3 units are gathered again).
  Status publish_pending_update();

  // DESIGN.md's communication per rank per step for this config and model, in the ring's byte
  // counts (comm::ring_bytes): every micro-batch reduce-scatters each unit (the 16-bit gradient);
  // stage 3 all-gathers each unit in forward and again in backward (a persistent unit once per
  // step); stages 1-2 all-gather the updated 16-bit parameters, stage 0 the reduced gradient
  // (fp32 when k > 1), once per pass of updates over the unit (Unit::update_gathers: exact one,
  // none when the step is skipped; eager one more after a rollback; delayed one when the
  // previous step's update is published). all_reduce: the norm's scalars.
  nlohmann::ordered_json comm_formula() const;

  void prefetch_states(const Unit& u);

  // The first trainable unit after units_[i] in registration order, or null.
  const Unit* next_trainable(std::size_t i) const {
    for (std::size_t j = i + 1; j < units_.size(); ++j) {
      if (!units_[j].frozen()) return &units_[j];
    }
    return nullptr;
  }

  Status zero_gradients();

  EngineOptions options_;
  Config config_;
  gpu::Device& device_;
  comm::Comm& comm_;
  int rank_;
  int world_;
  int stage_ = 0;
  DType compute_dtype_ = DType::kF32;
  Placement opt_place_ = Placement::kDevice;
  Placement param_place_ = Placement::kDevice;
  Placement grad_place_ = Placement::kDevice;
  std::vector<std::string> nvme_paths_;
  cpu::OptimizerSpec spec_;
  int states_ = 0;
  std::optional<cpu::CpuOptimizer> cpu_opt_;
  LossScaler scaler_;

  std::deque<Unit> units_;  // stable addresses: views point at the specs
  std::vector<PlanTerm> plan_;
  std::vector<PlanTerm> process_plan_;  // MemoryPlan::process: host memory outside the tiers
  double compute_busy_base_ = -1;  // the compute stream's busy_seconds() when the step opened
  bool finalized_ = false;
  std::uint64_t param_count_ = 0;
  std::uint64_t trainable_param_count_ = 0;
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<store::Store> store_;
  PinnedBuffer stage16_;
  PinnedBuffer stage32_;
  gpu::DeviceBuffer norm_acc_;
  gpu::DeviceBuffer scalars_;
  std::deque<DeferredFree> deferred_;

  std::int64_t steps_done_ = 0;
  std::int64_t updates_done_ = 0;  // the optimizer's step count (skipped steps excluded)
  bool step_open_ = false;
  Clock::time_point step_start_;
  double stall_gather_s_ = 0;
  double stall_reduce_s_ = 0;
  comm::CommCounters comm_base_;
  std::uint64_t nvme_read_base_ = 0;
  std::uint64_t copy_link_base_ = 0;
  std::uint64_t copy_bytes_ = 0;  // the engine's own host<->device copies this step
  double optimizer_s_ = 0;        // CPU optimizer and host gradient accumulation this step
  std::uint64_t nvme_write_base_ = 0;
  std::pair<std::uint64_t, std::uint64_t> home_write_base_{0, 0};
  bool frozen_unflushed_ = false;  // set_tensor wrote frozen parameters not yet flushed home

  // Overlap modes (docs/zero.md).
  Overlap overlap_ = Overlap::kExact;
  bool eager_snapshot_ = false;               // eager: keep master and states to roll back
  std::optional<cpu::StepArgs> eager_args_;   // eager: the step's speculative update arguments
  double early_update_s_ = 0;                 // eager: time in early updates this step
  std::uint64_t overlap_bytes_ = 0;           // the plan's term for the two below
  std::unique_ptr<PinnedPool> overlap_pool_;  // host buffers of eager's snapshot / delayed
  std::unique_ptr<UpdateWorker> worker_;      // delayed: runs the previous step's update
  bool update_running_ = false;               // delayed: a job was submitted, not waited for
  bool update_unpublished_ = false;           // delayed: finished, parameters not yet published
  double worker_optimizer_s_ = 0;             // delayed: the worker's CPU optimizer time
};

}  // namespace tz::zero::impl
