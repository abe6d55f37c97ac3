// The parameter coordinator (DESIGN.md, zero/): gather and release of a unit's parameters on the
// device. Stages 0-2 pin the unit's full block on the device for as long as it is gathered, and
// so does stage 3 on one rank (the shard is the unit: gather_pins_shard, plan.h); otherwise stage
// 3 all-gathers every rank's shard into a device buffer, freed after the compute stream is past
// it, except for persistent units (small ones, the plan decides), gathered once per step and kept.
// It owns the per-unit gather state: the reference count, the lease or gathered buffer, the views
// handed out and whether a persistent copy is still current.
#pragma once

#include <vector>

#include "zero/engine_context.h"

namespace tz::zero::impl {

class ParameterCoordinator {
 public:
  explicit ParameterCoordinator(EngineContext& ctx) : ctx_(ctx) {}
  ParameterCoordinator(const ParameterCoordinator&) = delete;
  ParameterCoordinator& operator=(const ParameterCoordinator&) = delete;

  // One gather state per registered unit; called once, by EngineImpl::finalize.
  void finalize();

  bool gathered(UnitId id) const { return state(id).refs > 0; }

  // Another reference to a gathered unit: the same views.
  UnitViews add_ref(UnitId id);

  // The unit's full parameters on the device in the compute dtype (the compute stream waits for
  // them); the unit must not be gathered already. Errors: the store's pin and the all-gather's,
  // naming the unit.
  Result<UnitViews> gather(Unit& u);

  // Drops one reference; the last one releases the lease or (not persistent) the buffer after the
  // compute stream's work so far. The unit must be gathered.
  Status release(Unit& u);

  // The unit's parameters changed: a persistent gathered copy is gathered again at its next use.
  void invalidate(UnitId id) { state(id).valid = false; }
  void invalidate_all();

  // Drops every lease and buffer (the engine's destructor, after the device is idle).
  void clear();

 private:
  struct GatherState {
    int refs = 0;
    Lease param_lease;         // the full block pinned while gathered (gather_pins_shard too)
    gpu::DeviceBuffer buffer;  // stage 3: the all-gathered unit
    bool valid = false;        // stage 3, persistent: `buffer` holds the current parameters
    UnitViews views;
  };
  GatherState& state(UnitId id) {
    TZ_ASSERT(id < states_.size(), "coordinator: unit id out of range (or before finalize)");
    return states_[id];
  }
  const GatherState& state(UnitId id) const {
    TZ_ASSERT(id < states_.size(), "coordinator: unit id out of range (or before finalize)");
    return states_[id];
  }

  EngineContext& ctx_;
  std::vector<GatherState> states_;
};

}  // namespace tz::zero::impl
