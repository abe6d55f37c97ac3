// The gradient reducer (DESIGN.md, zero/): a unit's device gradient buffer handed to the model,
// its reduce-scatter into this rank's shard and the fp32 accumulation over micro-batches (on the
// device, or on the host when the optimizer is offloaded), the global norm and overflow count over
// every rank's shards, and the accumulators zeroed for the next step. It owns the per-unit
// gradient buffers and reduce counts and the device scratch of the norm's all-reduce.
//
// Every stage reduces a unit's full gradient with the same reduce-scatter (ReduceOp::kSum, in the
// compute dtype, over the same padded layout) into this rank's shard and accumulates it in fp32,
// and every stage computes the global norm from those shards in unit order, so the update each
// element sees is the same in every stage and every placement.
#pragma once

#include <vector>

#include "gpu/elementwise.h"
#include "zero/engine_context.h"

namespace tz::zero::impl {

class GradientReducer {
 public:
  explicit GradientReducer(EngineContext& ctx) : ctx_(ctx) {}
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // One gradient state per registered unit and the norm's device scratch; once, by finalize.
  Status finalize();

  bool holds_buffer(UnitId id) const { return !state(id).buffer.empty(); }
  const UnitViews& buffer_views(UnitId id) const { return state(id).views; }
  int reduces(UnitId id) const { return state(id).reduces; }

  // A zeroed device buffer for the unit's full gradient in the compute dtype; the unit must be
  // trainable and hold none.
  Result<UnitViews> grad(Unit& u);

  // Reduce-scatters the unit's gradient buffer into this rank's shard and accumulates it in fp32;
  // the buffer is freed. The unit must hold one. Returns true when this was the step's last
  // micro-batch for the unit (gradient_accumulation_steps reduces).
  Result<bool> reduce(Unit& u);

  // The all-reduced sum of squares and non-finite count over every rank's trainable shards, the
  // same bits on every rank and wherever the shards live.
  Result<gpu::NormAccumulator> global_norm();

  // Every trainable unit's accumulator set to zero (after the step's update read them).
  Status zero_gradients();

  // The step is over: every trainable unit was reduced gradient_accumulation_steps times and holds
  // no buffer (step() checked; asserted here); the counts start again.
  void finish_step();

  // Drops the gradient buffers (the engine's destructor, after the device is idle).
  void clear();

 private:
  struct GradState {
    gpu::DeviceBuffer buffer;
    UnitViews views;
    int reduces = 0;  // reduce() calls since the last step
    // Host accumulators: the shard's sum of squares and non-finite count, taken at the step's
    // last reduce (local_norm adds them up), zeroed by finish_step.
    gpu::NormAccumulator norm;
  };
  GradState& state(UnitId id) {
    TZ_ASSERT(id < states_.size(), "reducer: unit id out of range (or before finalize)");
    return states_[id];
  }
  const GradState& state(UnitId id) const {
    TZ_ASSERT(id < states_.size(), "reducer: unit id out of range (or before finalize)");
    return states_[id];
  }
  Result<gpu::NormAccumulator> local_norm();
  Result<gpu::NormAccumulator> all_reduce_norm(const gpu::NormAccumulator& local);

  EngineContext& ctx_;
  std::vector<GradState> states_;
  gpu::DeviceBuffer norm_acc_;  // one gpu::NormAccumulator
  gpu::DeviceBuffer scalars_;   // world * 2 * kScalarPieces floats
};

}  // namespace tz::zero::impl
