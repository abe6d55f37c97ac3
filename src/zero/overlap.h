// The optimizer's overlap modes (tierzero.overlap; docs/zero.md, "Overlap modes") behind one
// interface. step() asks the pure step decision (step_decision.h) what the step does, then the
// mode carries it out; the mode's hooks mark when it may act:
//   exact    updates every unit once the global norm is known: in step(), or (streamed, stage 3
//            with the parameters and the optimizer offloaded) on a worker after step(), each
//            unit's next gather waiting for its own update (wait_unit);
//   eager    updates a unit as soon as its last micro-batch's gradient is reduced (on_reduced),
//            keeping a snapshot of master and states when clipping or loss scaling may undo it,
//            and rolls the early updates back in apply() when the decision says so;
//   delayed  hands step t's update to a background worker in apply() and publishes its
//            parameters at step t+1 (publish), so the update runs during step t+1's passes.
// Each mode owns its state: eager its snapshots and the units it updated early, delayed its
// worker, the gradient copies and parameters of the pending update, and their pinned pool;
// streamed exact its worker and which units its update has done.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/optimizer.h"
#include "zero/engine_context.h"
#include "zero/step_decision.h"

namespace tz::zero::impl {

class OptimizerDriver;
class ParameterCoordinator;

// What a mode needs from the engine besides the context, passed explicitly.
struct OverlapDeps {
  EngineContext& ctx;
  OptimizerDriver& driver;
  ParameterCoordinator& coordinator;
};

// tierzero.overlap's mode from the config, checked against the optimizer's placement and the
// stage (no device; a test calls it on configs alone). Errors: kInvalidArgument naming
// tierzero.overlap and what the mode needs.
Result<Overlap> overlap_from_config(const Config& config, Placement optimizer, int stage);

// Whether the update runs on a worker thread beside the model's compute (tierzero.stream_update,
// and every part of the update is host work: stage 3 with the parameters, the gradient
// accumulators and the optimizer off the device): exact streams it into the next forward, eager
// runs each early update beside the backward. delayed always has its worker.
bool streams_update(const Config& config, int stage, Placement param, Placement gradients,
                    Placement optimizer);

// eager: whether the early updates may have to be undone, so a snapshot is kept: only clipping
// and loss scaling (with its overflow skips) can change a step's multiplier after them.
bool eager_needs_snapshot(const Config& config);

// The master and state blocks of the units a mode reads ahead for the update, and their loads
// into the host tier since mark(): the step report's state_read_ahead_bytes (exact: the
// backward's read ahead; eager: the forward's, for the next backward).
class StateLoads {
 public:
  void clear() { blocks_.clear(); }
  void add(const EngineContext& ctx, const Unit& u);
  bool empty() const { return blocks_.empty(); }
  void mark(const EngineContext& ctx) { base_ = loads(ctx); }
  std::uint64_t since_mark(const EngineContext& ctx) const { return loads(ctx) - base_; }

 private:
  std::uint64_t loads(const EngineContext& ctx) const;
  std::vector<BlockId> blocks_;
  std::uint64_t base_ = 0;
};

class OverlapMode {
 public:
  // The mode object for `overlap` (overlap_from_config's answer).
  static std::unique_ptr<OverlapMode> create(Overlap overlap, const OverlapDeps& deps);

  virtual ~OverlapMode() = default;
  virtual Overlap kind() const = 0;

  // The mode's buffers (plan_memory's overlap_bytes, 0 when it keeps none; host buffers from a
  // pool made with `pool_options`, plan_memory's overlap_pool), once the units and the store
  // exist.
  virtual Status finalize(std::uint64_t overlap_bytes, const PinnedPoolOptions& pool_options);

  // The unit's last micro-batch of the step was reduced. `loss_scale` is the scale of the step's
  // backward, `next_update` the update number the step gets if it is not skipped.
  virtual Status on_reduced(Unit& u, double loss_scale, std::int64_t next_update);

  // Waits for an update still running (before get_tensor reads masters and states).
  virtual Status wait();

  // Waits until an update still running has finished with `u` (before the unit's parameters are
  // gathered or its gradient is handed out); its error, if the update failed before `u`.
  virtual Status wait_unit(const Unit& u);

  // This step's update runs past step() and zeroes each unit's gradient accumulator itself
  // (step() zeroes them otherwise).
  virtual bool update_pending() const { return false; }

  // The pending update's parameters become the ones the next forward sees (at step(), and before
  // set_tensor writes parameters the pending update would overwrite).
  virtual Status publish();

  // Carries out `decision` (made with this mode's kind): `step` is the step's 1-based number,
  // `update` the optimizer's update number when the decision counts one.
  virtual Status apply(const StepDecision& decision, std::int64_t step, std::int64_t update) = 0;

  // The step is over: per-step state starts again.
  virtual void finish_step();

  // The host pool the mode's buffers live in (accounting's bytes in use and peaks), or null.
  const PinnedPool* pool() const { return pool_.get(); }

 protected:
  explicit OverlapMode(const OverlapDeps& deps) : deps_(deps) {}
  // Runs `decision.update` kNone or kAllUnitsNow (asserts it is one of them).
  Status update_now(const StepDecision& decision, std::int64_t update);
  // Creates pool_ for the mode's host buffers (plan_memory's overlap_pool) and registers it with
  // the device.
  Status create_pool(const PinnedPoolOptions& options);

  OverlapDeps deps_;
  std::unique_ptr<PinnedPool> pool_;  // a derived mode's buffers go before it (members first)
};

// The modes' background update (exact streamed, eager on the worker, delayed): one job at a time
// on a thread the mode owns. The job only
// pins store blocks and runs the CPU optimizer (the store and the optimizer are safe to call from
// another thread); it never touches a stream or a collective, so the rank's calls still pair up
// across ranks in the same order.
class UpdateWorker {
 public:
  UpdateWorker() : thread_([this] { loop(); }) {}
  ~UpdateWorker();
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  // Starts `job`; the previous one must have been waited for.
  void submit(std::function<Status()> job);

  // Blocks until the submitted job (if any) has finished; returns its status once.
  Status wait();

  // A job was submitted and not yet waited for.
  bool busy() const;

 private:
  void loop();

  mutable std::mutex mu_;  // guards every member below; never held while a job runs
  std::condition_variable wake_;
  std::condition_variable done_;
  std::function<Status()> job_;
  bool busy_ = false;
  bool stop_ = false;
  Status result_ = Status::ok();
  std::thread thread_;  // last: started after the members it reads
};

// exact: every unit's update once the global norm is known; results equal a non-offloaded run.
// In step(), or streamed (tierzero.stream_update, where it applies: stage 3 with the parameters,
// the gradients and the optimizer off the device, so an update is host work only): apply() hands
// the update to a worker that takes the units in registration order (the order the next forward
// gathers them), writing each unit's parameters home and zeroing its gradient accumulator, and
// step() returns; a unit's next gather or gradient waits for that unit's own update, so the
// update's NVMe traffic runs under the next forward's compute. Same arithmetic, same bits.
class ExactOverlap final : public OverlapMode {
 public:
  explicit ExactOverlap(const OverlapDeps& deps) : OverlapMode(deps) {}
  ~ExactOverlap() override;
  Overlap kind() const override { return Overlap::kExact; }
  Status finalize(std::uint64_t overlap_bytes, const PinnedPoolOptions& pool_options) override;
  Status wait() override;
  Status wait_unit(const Unit& u) override;
  Status publish() override { return wait(); }
  bool update_pending() const override { return running_; }
  Status on_reduced(Unit& u, double loss_scale, std::int64_t next_update) override;
  Status apply(const StepDecision& decision, std::int64_t step, std::int64_t update) override;
  void finish_step() override { read_ahead_next_ = 0; }

  // Whether the update is streamed (decided at finalize from the config and the placements).
  bool streamed() const { return worker_ != nullptr; }

 private:
  // The worker's job: every trainable unit's update in registration order (NVMe state read ahead
  // one unit), each marked done as it finishes. Touches only the store, the CPU optimizer, the
  // marks (under mu_) and worker_optimizer_s_ (read by the rank's thread after wait()).
  Status run_update(const cpu::StepArgs& args);

  std::mutex mu_;  // guards done_ and job_over_
  std::condition_variable progress_;
  std::vector<bool> done_;          // per unit: this update has finished with it
  bool job_over_ = false;           // the job returned (every unit done, or an error)
  bool running_ = false;            // the rank's thread: a job was submitted, not waited for
  double worker_optimizer_s_ = 0;   // the worker's CPU optimizer time
  // Optimizer state on NVMe: the first trainable units of the update, as many as half the host
  // cache holds (finalize), whose states the backward reads ahead, one per reduced unit, and
  // their blocks' loads since the step's first one.
  std::vector<UnitId> read_ahead_;
  StateLoads read_ahead_loads_;
  std::size_t read_ahead_next_ = 0;  // this step's next one
  std::unique_ptr<UpdateWorker> worker_;  // last: its job reads the members above
};

// The eager queue a kept step leaves to run into the next forward: reduced last to first (the
// backward's order), while the forward gathers first to last and waits for each unit's update, so
// in the backward's order it would wait for all of them (unit 0 is reduced last). The front stays
// (the worker has read its states ahead); the rest is put in registration order.
void order_for_next_forward(std::deque<Unit*>& queue);

// The units whose states eager keeps in the host tier, in the order it takes them until the room
// is spent: the last reduced of the previous step first (`order`: that step's reduce order). In
// the first step there is no order yet, so it guesses the trainable units in registration order:
// the backward reduces about in reverse, so the forward's first units are reduced last.
std::vector<const Unit*> kept_states_candidates(const std::vector<Unit*>& order,
                                                const std::deque<Unit>& units);

// eager: a unit's update as soon as its last micro-batch's gradient is reduced, with the
// multiplier the step has when it neither clips nor overflows (1 / (scale N k)); apply() rolls the
// early updates back when the decision says the step clipped or overflowed. Streamed (where the
// update is host work, as exact's): on_reduced() queues the unit for a worker that snapshots and
// updates it while the model computes the next unit's gradient, reading the accumulator only, so
// step()'s global norm reads the accumulators while the worker runs. A step that keeps its early
// updates leaves the rest of the queue running into the next forward (each accumulator zeroed
// once its update is done: by the worker after the decision, by apply() before it); a rollback
// or a redone update waits for the queue first. A unit's next gather or gradient waits for its
// own update. Same arithmetic, same bits.
class EagerOverlap final : public OverlapMode {
 public:
  EagerOverlap(const OverlapDeps& deps, bool snapshot);
  ~EagerOverlap() override;
  Overlap kind() const override { return Overlap::kEager; }
  Status finalize(std::uint64_t overlap_bytes, const PinnedPoolOptions& pool_options) override;
  Status on_reduced(Unit& u, double loss_scale, std::int64_t next_update) override;
  Status wait() override;
  Status wait_unit(const Unit& u) override;
  bool update_pending() const override { return running_; }
  Status apply(const StepDecision& decision, std::int64_t step, std::int64_t update) override;
  void finish_step() override;

 private:
  // The worker's job: the queued units' early updates (snapshot first when one is kept), in the
  // order they were reduced until apply() keeps them (then order_for_next_forward's), the next
  // queued unit's NVMe states read ahead, each accumulator zeroed after its update once the step
  // kept them (zero_after_update_); returns once the queue is closed and empty, or at the first
  // error. Touches only the store, the CPU optimizer, the snapshots and the queue and marks
  // (under mu_).
  Status run_queue(const cpu::StepArgs& args);
  // Which units' states stay in the host tier after their update (kept_), from the previous
  // step's reduce order (order_; kept_states_candidates), at the first reduce of a step.
  void choose_kept_states();
  // The next backward's first units' NVMe states, read ahead once the job's queue is done in the
  // forward (the worker's, under mu_).
  void read_ahead_next_backward();
  // One unit's early update on the host (the worker's): gradient and parameter shard pinned in
  // the host tier, the accumulator kept for step()'s norm.
  Status update_on_host(Unit& u, const cpu::StepArgs& args);
  // The unit's master and optimizer states into its snapshot, or back from it.
  Status copy_snapshot(Unit& u, bool to_snapshot);
  // Every unit updated early gets its master and states back; on overflow its parameters are
  // re-derived from the restored master (the cast the optimizer's copy makes, so they get the
  // bits they had before the early update).
  Status roll_back(bool overflow, std::int64_t step);

  const bool snapshot_;                             // keep master and states to roll back
  std::optional<cpu::StepArgs> args_;               // the step's speculative update arguments
  std::vector<bool> updated_early_;                 // per unit, this step (queued, if streamed)
  std::vector<PinnedBuffer> snapshot_host_;         // per unit: master then states
  std::vector<gpu::DeviceBuffer> snapshot_device_;  // the optimizer on the device
  // Streamed only.
  std::mutex mu_;  // guards queue_, queued_, done_, closed_, zero_after_update_ and job_over_
  std::condition_variable progress_;
  std::deque<Unit*> queue_;          // reduced units whose early update has not started
  std::vector<bool> queued_;         // per unit: handed to the running job
  std::vector<bool> done_;           // per unit: the running job finished its early update
  bool closed_ = false;              // no more units come: the job ends once the queue is empty
  bool zero_after_update_ = false;   // the step kept its early updates: the job zeroes
  bool job_over_ = false;            // the job returned (queue closed and empty, or an error)
  bool running_ = false;             // the rank's thread: a job was submitted, not waited for
  bool closed_by_step_ = false;      // the rank's thread: apply() left the job running
  double worker_optimizer_s_ = 0;    // the worker's CPU optimizer time
  std::vector<Unit*> order_;         // the step's units in the order they were reduced
  std::vector<bool> kept_;           // per unit: its states kept in the host tier (NVMe-homed)
  // NVMe-homed states, and the parameter shards and gradient accumulators leave a third of the
  // host tier or more (finalize).
  bool roomy_ = false;
  // roomy_, and the states do not all fit beside the parameter shards and accumulators: the job
  // writes the states it does not keep home right after their update (finalize).
  bool write_back_updated_ = false;
  // What the job read ahead for the next backward (written by the job, read after it ended).
  StateLoads read_ahead_loads_;
  // Kept: a fifth of the host tier, a third where the parameters leave it (roomy_); read ahead in
  // the forward, there only: a fifth.
  static constexpr std::uint64_t kKeptStatesShare = 5;
  static constexpr std::uint64_t kKeptStatesMaxShare = 3;
  std::unique_ptr<UpdateWorker> worker_;  // last: its job reads the members above
};

// delayed: step t's update runs on the worker during step t+1's forward and backward (parameters
// one step stale, as ZeRO-Offload's DPU). apply() copies the reduced gradients out (the
// accumulators are zeroed for the next step right after) and starts the job; publish() waits for
// it and writes its parameters home.
class DelayedOverlap final : public OverlapMode {
 public:
  explicit DelayedOverlap(const OverlapDeps& deps) : OverlapMode(deps) {}
  ~DelayedOverlap() override;
  Overlap kind() const override { return Overlap::kDelayed; }
  Status finalize(std::uint64_t overlap_bytes, const PinnedPoolOptions& pool_options) override;
  Status wait() override;
  Status publish() override;
  Status apply(const StepDecision& decision, std::int64_t step, std::int64_t update) override;

 private:
  // The worker's job: every unit's update in registration order (NVMe state read ahead one unit,
  // as in exact mode). Touches only the store (thread-safe), the CPU optimizer (the rank's
  // thread does not call it while a job runs), the pending buffers and worker_optimizer_s_ (read
  // by the rank's thread after wait()).
  Status run_update(const cpu::StepArgs& args);

  std::vector<PinnedBuffer> grad_;        // per unit: the step's reduced gradient shard
  std::vector<PinnedBuffer> params_;      // per unit: the 16-bit parameters the update writes
  bool running_ = false;                  // a job was submitted, not waited for
  bool unpublished_ = false;              // finished, parameters not yet published
  double worker_optimizer_s_ = 0;         // the worker's CPU optimizer time
  std::unique_ptr<UpdateWorker> worker_;  // last: its job reads the members above
};

}  // namespace tz::zero::impl
