// What the engine's components share (engine_context.h): the deferred device frees and the
// context's pin, error and view helpers.
#include "zero/engine_context.h"

namespace tz::zero::impl {

Result<gpu::DeviceBuffer> DeviceBuffers::allocate(std::size_t bytes) {
  if (!deferred_.empty() &&
      device_.memory_stats().in_use_bytes + store_device_room() + bytes > device_plan_bytes_) {
    reap(true);
  }
  auto b = device_.allocate(bytes);
  if (b.is_ok() || deferred_.empty()) return b;
  reap(true);
  return device_.allocate(bytes);
}

Status DeviceBuffers::defer_free(gpu::DeviceBuffer buffer) {
  if (buffer.empty()) return Status::ok();
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> ev, device_.create_event());
  TZ_RETURN_IF_ERROR(ev->record(device_.compute_stream()));
  deferred_.push_back(DeferredFree{std::move(ev), std::move(buffer)});
  reap(false);
  return Status::ok();
}

void DeviceBuffers::reap(bool all) {
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

std::uint64_t DeviceBuffers::store_device_room() const {
  if (store_ == nullptr) return 0;
  const store::TierStats t = store_->stats().tier(Tier::kDevice);
  const std::uint64_t held = t.used_bytes + t.cached_bytes;
  return t.budget_bytes > held ? t.budget_bytes - held : 0;
}

Result<Lease> EngineContext::pin_for(const Unit& u, const char* what, BlockId block, Tier tier,
                                     Access access) {
  TZ_ASSERT(store != nullptr, "pin before finalize");
  TZ_ASSERT(block != kNoBlock, "pin of a frozen unit's absent block");
  auto l = store->pin(block, tier, access);
  if (!l.is_ok()) return with_unit(u, what, l.status());
  return l;
}

Status EngineContext::zero_gradient(const Unit& u, const char* what) {
  if (grad_place != Placement::kDevice) return with_unit(u, what, store->zero(u.grad_acc));
  TZ_ASSIGN_OR_RETURN(Lease l, pin_for(u, what, u.grad_acc, Tier::kDevice, Access::kWrite));
  TZ_RETURN_IF_ERROR(with_unit(u, what, l.wait()));
  gpu::Stream& st = stream();
  TZ_RETURN_IF_ERROR(with_unit(u, what, device.memset_async(l.data(), 0, u.layout.shard * 4, st)));
  l.release(&st);
  return Status::ok();
}

Status EngineContext::with_unit(const Unit& u, const char* what, Status s) const {
  if (s.is_ok()) return s;
  return std::move(s).with_context("unit '" + u.spec.name + "' shard " + std::to_string(rank) +
                                   " of " + std::to_string(world) + " (rank " +
                                   std::to_string(rank) + "), " + what);
}

Status EngineContext::sync(gpu::Stream& st, const std::string& what) {
  Status s = st.synchronize();
  if (s.is_ok()) s = comm.async_error();
  if (s.is_ok()) return s;
  return std::move(s).with_context(what + " on rank " + std::to_string(rank));
}

UnitViews EngineContext::make_views(const Unit& u, void* base, DType dtype) const {
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

const Unit* EngineContext::next_trainable(std::size_t i) const {
  for (std::size_t j = i + 1; j < units.size(); ++j) {
    if (!units[j].frozen()) return &units[j];
  }
  return nullptr;
}

}  // namespace tz::zero::impl
