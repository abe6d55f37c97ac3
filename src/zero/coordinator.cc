// The parameter coordinator (coordinator.h): gather and release of a unit's parameters (stages
// 0-2 pin the full block; stage 3 all-gathers the shards, persistent units once per step).
#include "zero/coordinator.h"

namespace tz::zero::impl {

void ParameterCoordinator::finalize() {
  TZ_ASSERT(states_.empty() && ctx_.store != nullptr, "coordinator finalized twice or early");
  states_.resize(ctx_.units.size());
}

UnitViews ParameterCoordinator::add_ref(UnitId id) {
  GatherState& g = state(id);
  TZ_ASSERT(g.refs > 0, "add_ref of a unit that is not gathered");
  ++g.refs;
  return g.views;
}

Result<UnitViews> ParameterCoordinator::gather(Unit& u) {
  GatherState& g = state(u.id);
  TZ_ASSERT(g.refs == 0, "gather of a unit already gathered (use add_ref)");
  TZ_ASSERT(ctx_.stage == 3 || g.buffer.empty(), "stages 0-2 gather no buffer");
  TZ_ASSERT(u.persistent || !g.valid, "only a persistent unit keeps its gathered copy");
  const auto t0 = Clock::now();
  gpu::Stream& st = ctx_.stream();
  const std::size_t es = dtype_size(ctx_.compute_dtype);
  void* base = nullptr;
  if (ctx_.stage < 3 || (gather_pins_shard(ctx_.stage, ctx_.world) && !u.persistent)) {
    TZ_ASSIGN_OR_RETURN(g.param_lease,
                        ctx_.pin_for(u, "gather", u.param, Tier::kDevice, Access::kRead));
    TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "gather", g.param_lease.wait()));
    base = g.param_lease.data();
  } else if (u.persistent && g.valid) {
    base = g.buffer.data();
  } else {
    TZ_ASSIGN_OR_RETURN(Lease shard,
                        ctx_.pin_for(u, "gather", u.param, Tier::kDevice, Access::kRead));
    TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "gather", shard.wait()));
    if (g.buffer.empty()) {
      TZ_ASSIGN_OR_RETURN(g.buffer, ctx_.buffers.allocate(u.layout.padded * es));
    }
    g.valid = u.persistent;
    TZ_RETURN_IF_ERROR(
        ctx_.with_unit(u, "gather: all_gather",
                       ctx_.comm.all_gather(shard.data(), g.buffer.data(), u.layout.shard,
                                            ctx_.compute_dtype, st)));
    shard.release(&st);
    base = g.buffer.data();
  }
  g.views = ctx_.make_views(u, base, ctx_.compute_dtype);
  g.refs = 1;
  ctx_.counters.stall_gather_s += seconds_since(t0);
  return g.views;
}

Status ParameterCoordinator::release(Unit& u) {
  GatherState& g = state(u.id);
  TZ_ASSERT(g.refs > 0, "release of a unit that is not gathered");
  if (--g.refs > 0) return Status::ok();
  if (g.param_lease.valid()) {
    g.param_lease.release(&ctx_.stream());
  } else if (!u.persistent) {
    TZ_RETURN_IF_ERROR(ctx_.buffers.defer_free(std::move(g.buffer)));
  }
  g.views = UnitViews{};
  return Status::ok();
}

void ParameterCoordinator::invalidate_all() {
  for (GatherState& g : states_) g.valid = false;
}

void ParameterCoordinator::clear() {
  for (GatherState& g : states_) {
    g.param_lease.release();
    g.buffer.reset();
  }
}

}  // namespace tz::zero::impl
