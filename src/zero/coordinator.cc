// The parameter coordinator (engine_impl.h): gather and release of a unit's parameters (stages
// 0-2 pin the full block; stage 3 all-gathers the shards, persistent units once per step), and the
// engine's device buffers freed once the compute stream is past them.
#include "zero/engine_impl.h"

namespace tz::zero::impl {

// --- One micro-batch ---------------------------------------------------------------------------
Result<UnitViews> EngineImpl::gather(UnitId id) {
  TZ_RETURN_IF_ERROR(check_unit(id, "gather"));
  Unit& u = units_[id];
  if (u.gather_refs > 0) {
    ++u.gather_refs;
    return u.views;
  }
  TZ_RETURN_IF_ERROR(flush_frozen_loads());
  open_step();
  const auto t0 = Clock::now();
  gpu::Stream& st = device_.compute_stream();
  const std::size_t es = dtype_size(compute_dtype_);
  void* base = nullptr;
  if (stage_ < 3) {
    TZ_ASSIGN_OR_RETURN(u.param_lease, pin_for(u, "gather", u.param, Tier::kDevice, Access::kRead));
    TZ_RETURN_IF_ERROR(with_unit(u, "gather", u.param_lease.wait()));
    base = u.param_lease.data();
  } else if (u.persistent && u.persistent_valid) {
    base = u.gathered.data();
  } else {
    TZ_ASSIGN_OR_RETURN(Lease shard, pin_for(u, "gather", u.param, Tier::kDevice, Access::kRead));
    TZ_RETURN_IF_ERROR(with_unit(u, "gather", shard.wait()));
    if (u.gathered.empty()) {
      TZ_ASSIGN_OR_RETURN(u.gathered, allocate_device(u.layout.padded * es));
    }
    u.persistent_valid = u.persistent;
    TZ_RETURN_IF_ERROR(with_unit(
        u, "gather: all_gather",
        comm_.all_gather(shard.data(), u.gathered.data(), u.layout.shard, compute_dtype_, st)));
    shard.release(&st);
    base = u.gathered.data();
  }
  u.views = make_views(u, base, compute_dtype_);
  u.gather_refs = 1;
  stall_gather_s_ += seconds_since(t0);
  return u.views;
}

Status EngineImpl::release(UnitId id) {
  TZ_RETURN_IF_ERROR(check_unit(id, "release"));
  Unit& u = units_[id];
  if (u.gather_refs == 0) {
    return Status::invalid_argument("release '" + u.spec.name + "': not gathered");
  }
  if (--u.gather_refs > 0) return Status::ok();
  gpu::Stream& st = device_.compute_stream();
  if (stage_ < 3) {
    u.param_lease.release(&st);
  } else if (!u.persistent) {
    TZ_RETURN_IF_ERROR(defer_free(std::move(u.gathered)));
  }
  u.views = UnitViews{};
  return Status::ok();
}

// A store pin whose error names the unit, shard and what it was for.
Result<Lease> EngineImpl::pin_for(const Unit& u, const char* what, BlockId block, Tier tier, Access access) {
  auto l = store_->pin(block, tier, access);
  if (!l.is_ok()) return with_unit(u, what, l.status());
  return l;
}

UnitViews EngineImpl::make_views(const Unit& u, void* base, DType dtype) const {
  UnitViews v;
  for (std::size_t t = 0; t < u.spec.tensors.size(); ++t) {
    TensorView tv;
    tv.data = static_cast<std::byte*>(base) + u.layout.offsets[t] * dtype_size(dtype);
    tv.dtype = dtype;
    tv.spec = &u.spec.tensors[t];
    v.tensors.push_back(tv);
  }
  return v;
}

// Device buffers freed only after the compute stream's work so far (an event), so release()
// and reduce() never block; an allocation that does not fit waits for them first.
Status EngineImpl::defer_free(gpu::DeviceBuffer buffer) {
  if (buffer.empty()) return Status::ok();
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> ev, device_.create_event());
  TZ_RETURN_IF_ERROR(ev->record(device_.compute_stream()));
  deferred_.push_back(DeferredFree{std::move(ev), std::move(buffer)});
  reap_deferred(false);
  return Status::ok();
}

void EngineImpl::reap_deferred(bool all) {
  while (!deferred_.empty()) {
    DeferredFree& d = deferred_.front();
    if (all) {
      d.done->synchronize().ignore();
    } else {
      auto q = d.done->query();
      if (!q.is_ok() || !*q) break;
    }
    deferred_.pop_front();
  }
}

// The compute stream may run far behind the caller (HostDevice, a queued GPU), so buffers whose
// free waits for it can pile up: an allocation that would take the device past the plan (or that
// the device refuses) first waits for them, so the peak stays within the plan, not the budget.
// The store's device room not yet filled counts as taken: its cache of offloaded shards loads
// ahead on its own threads, so deferred frees that filled that room would let its next load
// pass the plan (stage 3 with offloaded parameters).
Result<gpu::DeviceBuffer> EngineImpl::allocate_device(std::size_t bytes) {
  if (!deferred_.empty() &&
      device_.memory_stats().in_use_bytes + store_device_room() + bytes >
          tier_plan(Tier::kDevice)) {
    reap_deferred(true);
  }
  auto b = device_.allocate(bytes);
  if (b.is_ok() || deferred_.empty()) return b;
  reap_deferred(true);
  return device_.allocate(bytes);
}

// Device bytes the store may still allocate: its device budget less what it holds (copies in
// use and its cache of freed buffers).
std::uint64_t EngineImpl::store_device_room() const {
  if (!store_) return 0;
  const store::TierStats t = store_->stats().tier(Tier::kDevice);
  const std::uint64_t held = t.used_bytes + t.cached_bytes;
  return t.budget_bytes > held ? t.budget_bytes - held : 0;
}

}  // namespace tz::zero::impl
