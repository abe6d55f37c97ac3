// The ZeRO engine's implementation (engine.h's Engine), private to zero/. EngineImpl keeps the
// model API and composes DESIGN.md's components, each a class with the state it owns, passing
// what they share (config, device, comm, store, units, placements) through one EngineContext:
//   engine_context.h     Unit, the step's counters, deferred device frees, EngineContext
//   coordinator.h        ParameterCoordinator: gather, release, persistent units
//   reducer.h            GradientReducer: grad, reduce, host accumulation, the global norm
//   step_decision.h      decide_step: the pure step decision (skip, multiplier, rollback)
//   optimizer_driver.h   OptimizerDriver: unit updates, 16-bit parameters written home
//   overlap.h            OverlapMode: ExactOverlap, EagerOverlap, DelayedOverlap (+ UpdateWorker)
//   accounting.h         Accounting: plan, formulas, peaks, the step report's measurements
//   engine.cc            the model API's entry points: init, registration, finalize (the tiered
//                        stack from store/stack.h), weights in and out, step(), params_xxh3
//   tensor_slice.cc      set_tensor_slice and tensor_range
//
// Frozen units (UnitSpec::frozen) have only their parameter block, in the compute dtype, homed
// where offload_param says; every path that touches gradients, masters or optimizer state (the
// reducer, the norm, the optimizer driver, the overlap modes) skips them, and the engine pins
// their block for writing only in set_tensor, so after loading the store never writes it back.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero/accounting.h"
#include "zero/coordinator.h"
#include "zero/engine.h"
#include "zero/engine_context.h"
#include "zero/loss_scaler.h"
#include "zero/optimizer_driver.h"
#include "zero/overlap.h"
#include "zero/reducer.h"
#include "zero/step_decision.h"

namespace tz::zero::impl {

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineOptions& options, gpu::Device& device, comm::Comm& comm)
      : options_(options),
        config_(options.config),
        ctx_(config_, device, comm),
        scaler_(options.config.fp16),
        coordinator_(ctx_),
        reducer_(ctx_),
        driver_(ctx_),
        accounting_(ctx_, options_) {}

  ~EngineImpl() override {
    // Work that still reads engine buffers must finish before they go: a pending delayed
    // update (its status has nowhere to go) and the device's streams.
    if (overlap_) overlap_->wait().ignore();
    ctx_.device.synchronize().ignore();
    coordinator_.clear();
    reducer_.clear();
    overlap_.reset();  // its pool outlives its buffers
    ctx_.buffers.clear();
    ctx_.store = nullptr;
    store_.reset();
    ctx_.stage16.reset();
    ctx_.stage32.reset();
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

  // --- What the model needs to know -------------------------------------------------------------
  gpu::Device& device() override { return ctx_.device; }
  gpu::Stream& compute_stream() override { return ctx_.stream(); }
  DType compute_dtype() const override { return ctx_.compute_dtype; }
  double loss_scale() const override { return scaler_.scale(); }
  int gradient_accumulation_steps() const override { return ctx_.accumulation_steps(); }
  int rank() const override { return ctx_.rank; }
  int world_size() const override { return ctx_.world; }
  std::int64_t steps_done() const override { return steps_done_; }
  std::uint64_t param_count() const override { return accounting_.param_count(); }
  std::uint64_t trainable_param_count() const override {
    return accounting_.trainable_param_count();
  }
  std::size_t unit_count() const override { return ctx_.units.size(); }
  const UnitSpec& unit_spec(UnitId unit) const override;
  const UnitLayout& layout(UnitId unit) const override;
  int optimizer_state_count() const override { return ctx_.states; }
  const EngineOptions& options() const override { return options_; }
  void set_bound_bandwidths(double nvme_read_bytes_per_s, double nvme_write_bytes_per_s,
                            double copy_bytes_per_s) override {
    options_.nvme_read_bytes_per_s = nvme_read_bytes_per_s;
    options_.nvme_write_bytes_per_s = nvme_write_bytes_per_s;
    options_.copy_bytes_per_s = copy_bytes_per_s;
  }

  // --- Accounting (accounting.h)
  // ------------------------------------------------------------------
  nlohmann::ordered_json plan_json() const override { return accounting_.plan_json(); }
  TierBytes plan_bytes() const override { return accounting_.plan_bytes(); }
  TierBytes peak_bytes() const override { return accounting_.peak_bytes(); }
  Result<std::uint64_t> params_xxh3() override;

 private:
  // The placements, the NVMe paths, the overlap mode and the optimizer from the config.
  Status init_placements();

  // Every unit's blocks in the store (finalize).
  Status create_blocks();
  // The block devices under the NVMe swap paths, each once (Accounting::set_disks).
  std::vector<std::string> swap_devices() const;

  // step()'s preconditions: every unit reduced k times since the last step, none still gathered
  // or holding a gradient buffer (kInvalidArgument naming the unit otherwise).
  Status check_step_ready(int k) const;

  // Frozen parameters set since the last call are written to their home tier now (a store
  // flush), so that their loading is never a step's traffic; called by gather, grad and step.
  Status flush_frozen_loads();

  Status check_unit(UnitId id, const char* what) const;

  // kInvalidArgument naming the unit when it is frozen (grad, reduce, optimizer states).
  Status check_trainable(const Unit& u, const char* what) const;

  // get_tensor of a frozen unit: its compute-dtype parameters widened to fp32.
  Status get_frozen_tensor(Unit& u, std::size_t tensor, std::span<float> out);

  // Starts loading into the host tier the `which` block of the next unit after `id` that is
  // frozen as `id` is, when that block's home is NVMe (get_tensor's read ahead).
  Status read_ahead_after(UnitId id, TensorState which);

  // The elements [off, off + n) of the unit's sharded block `block` (of `dtype`),
  // all-gathered from the ranks' shards into `out` on the host. A collective; `what` names the
  // call in errors.
  Status gather_range(const Unit& u, BlockId block, DType dtype, std::size_t off, std::size_t n,
                      void* out, const char* what);

  Status check_tensor(UnitId id, std::size_t tensor, std::size_t n, const char* what) const;

  Result<BlockId> state_block(const Unit& u, TensorState which) const;

  // Host bytes into a block at `offset`, in its home tier (device blocks through a copy).
  Status write_block(BlockId block, std::size_t offset, const void* src, std::size_t bytes) {
    return host_block_copy(block, offset, src, nullptr, bytes);
  }
  Status read_block(BlockId block, std::size_t offset, void* dst, std::size_t bytes) {
    return host_block_copy(block, offset, nullptr, dst, bytes);
  }
  Status host_block_copy(BlockId block, std::size_t offset, const void* src, void* dst,
                         std::size_t bytes);

  // A block's bytes into device memory (synchronously complete on return).
  Status read_block_to_device(BlockId block, std::size_t offset, void* dst, std::size_t bytes);

  Tier home_tier(BlockId block) const;

  EngineOptions options_;
  Config config_;
  EngineContext ctx_;  // references config_: declared after it
  std::vector<std::string> nvme_paths_;
  LossScaler scaler_;
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<store::Store> store_;
  // The components (they hold ctx_; declared after what they reference).
  ParameterCoordinator coordinator_;
  GradientReducer reducer_;
  OptimizerDriver driver_;
  std::unique_ptr<OverlapMode> overlap_;
  Accounting accounting_;

  bool finalized_ = false;
  std::int64_t steps_done_ = 0;
  std::int64_t updates_done_ = 0;  // the optimizer's step count (skipped steps excluded)
  bool frozen_unflushed_ = false;  // set_tensor wrote frozen parameters not yet flushed home
};

}  // namespace tz::zero::impl
