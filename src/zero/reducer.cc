// The gradient reducer (engine_impl.h): a unit's gradient buffer, its reduce-scatter into this
// rank's shard and the fp32 accumulation over micro-batches (on the device or the host), the
// global norm and overflow count over every rank's shards, and the gradients zeroed for a step.
#include "zero/engine_impl.h"

#include "gpu/elementwise.h"

namespace tz::zero::impl {

Result<UnitViews> EngineImpl::grad(UnitId id) {
  TZ_RETURN_IF_ERROR(check_unit(id, "grad"));
  Unit& u = units_[id];
  TZ_RETURN_IF_ERROR(check_trainable(u, "grad"));
  if (!u.grad_buffer.empty()) return u.grad_views;
  TZ_RETURN_IF_ERROR(flush_frozen_loads());
  open_step();
  const std::size_t bytes = u.layout.padded * dtype_size(compute_dtype_);
  TZ_ASSIGN_OR_RETURN(u.grad_buffer, allocate_device(bytes));
  TZ_RETURN_IF_ERROR(
      device_.memset_async(u.grad_buffer.data(), 0, bytes, device_.compute_stream()));
  u.grad_views = make_views(u, u.grad_buffer.data(), compute_dtype_);
  return u.grad_views;
}

Status EngineImpl::reduce(UnitId id) {
  TZ_RETURN_IF_ERROR(check_unit(id, "reduce"));
  Unit& u = units_[id];
  TZ_RETURN_IF_ERROR(check_trainable(u, "reduce"));
  if (u.grad_buffer.empty()) {
    return Status::invalid_argument("reduce '" + u.spec.name + "': no grad() buffer handed out");
  }
  const auto t0 = Clock::now();
  gpu::Stream& st = device_.compute_stream();
  const std::size_t es = dtype_size(compute_dtype_);
  const std::size_t s = u.layout.shard;
  auto* full = u.grad_buffer.as<std::byte>();
  std::byte* mine = full + static_cast<std::size_t>(rank_) * s * es;
  // In place: rank r's reduced shard lands where its part of the full gradient was.
  TZ_RETURN_IF_ERROR(with_unit(u, "reduce: reduce_scatter",
                               comm_.reduce_scatter(full, mine, s, compute_dtype_,
                                                    comm::ReduceOp::kSum, st)));
  if (grad_place_ == Placement::kDevice) {
    TZ_ASSIGN_OR_RETURN(Lease acc, pin_for(u, "reduce", u.grad_acc, Tier::kDevice, Access::kReadWrite));
    TZ_RETURN_IF_ERROR(with_unit(u, "reduce", acc.wait()));
    gpu::OptimizerStepArgs a = device_accumulate_coeffs();
    a.param = static_cast<float*>(acc.data());
    a.grad = mine;
    a.grad_dtype = compute_dtype_;
    a.n = s;
    TZ_RETURN_IF_ERROR(with_unit(u, "reduce: accumulate", device_.optimizer_step(a, st)));
    acc.release(&st);
    TZ_RETURN_IF_ERROR(defer_free(std::move(u.grad_buffer)));
  } else {
    TZ_RETURN_IF_ERROR(with_unit(u, "reduce: copy to host",
                                 device_.copy_async(stage16_.data(), mine, s * es,
                                                    gpu::CopyKind::kDeviceToHost, st)));
    TZ_RETURN_IF_ERROR(sync(st, "reduce '" + u.spec.name + "'"));
    copy_bytes_ += s * es;
    u.grad_buffer.reset();
    TZ_ASSIGN_OR_RETURN(Lease acc, pin_for(u, "reduce", u.grad_acc, Tier::kHost, Access::kReadWrite));
    TZ_RETURN_IF_ERROR(with_unit(u, "reduce", acc.wait()));
    const auto t_acc = Clock::now();
    host_accumulate(static_cast<float*>(acc.data()), stage16_.data(), compute_dtype_, s);
    optimizer_s_ += seconds_since(t_acc);
    acc.release();
  }
  u.grad_views = UnitViews{};
  ++u.reduces;
  stall_reduce_s_ += seconds_since(t0);
  if (overlap_ == Overlap::kEager && u.reduces == gradient_accumulation_steps()) {
    return update_early(u);
  }
  return Status::ok();
}

Result<gpu::NormAccumulator> EngineImpl::local_norm() {
  gpu::Stream& st = device_.compute_stream();
  gpu::NormAccumulator host_acc;
  TZ_RETURN_IF_ERROR(device_.memset_async(norm_acc_.data(), 0, sizeof(gpu::NormAccumulator), st));
  auto* dev_acc = norm_acc_.as<gpu::NormAccumulator>();
  // A device that can read host memory sums host shards with the same kernel as device ones,
  // so the sum (and so the clip coefficient) does not depend on where the shards live.
  const bool device_sums = grad_place_ == Placement::kDevice || device_.host_accessible();
  std::vector<Lease> leases;
  for (const Unit& u : units_) {
    if (u.frozen()) continue;
    const Tier pin_tier = grad_place_ == Placement::kDevice ? Tier::kDevice : Tier::kHost;
    TZ_ASSIGN_OR_RETURN(Lease l, store_->pin(u.grad_acc, pin_tier, Access::kRead));
    TZ_RETURN_IF_ERROR(with_unit(u, "norm", l.wait()));
    if (device_sums) {
      TZ_RETURN_IF_ERROR(
          device_.sum_squares(l.data(), DType::kF32, u.layout.shard, dev_acc, st));
      leases.push_back(std::move(l));
      // NVMe-homed shards pass through the host cache, which holds a few units, not all: each
      // is summed and released before the next is loaded (the same sums in the same order).
      if (grad_place_ == Placement::kNvme) {
        TZ_RETURN_IF_ERROR(sync(st, "norm"));
        for (Lease& done : leases) done.release();
        leases.clear();
      }
    } else {  // the devices' fixed order on the host: the same bits wherever shards live
      gpu::sum_squares_fixed_order(l.data(), DType::kF32, u.layout.shard, host_acc);
    }
  }
  if (device_sums) {
    TZ_RETURN_IF_ERROR(device_.copy_async(&host_acc, dev_acc, sizeof(host_acc),
                                          gpu::CopyKind::kDeviceToHost, st));
    TZ_RETURN_IF_ERROR(sync(st, "norm"));
    for (Lease& l : leases) l.release();
  }
  return host_acc;
}

Result<gpu::NormAccumulator> EngineImpl::all_reduce_norm(const gpu::NormAccumulator& local) {
  const std::size_t per_rank = 2 * kScalarPieces;
  std::vector<float> buf(static_cast<std::size_t>(world_) * per_rank, 0.0f);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &local.sum_squares, sizeof(bits));
  encode_u64(bits, buf.data() + static_cast<std::size_t>(rank_) * per_rank);
  encode_u64(local.nonfinite_count,
             buf.data() + static_cast<std::size_t>(rank_) * per_rank + kScalarPieces);
  gpu::Stream& st = device_.compute_stream();
  const std::size_t bytes = buf.size() * sizeof(float);
  TZ_RETURN_IF_ERROR(device_.copy_async(scalars_.data(), buf.data(), bytes,
                                        gpu::CopyKind::kHostToDevice, st));
  TZ_RETURN_IF_ERROR(comm_.all_reduce(scalars_.data(), scalars_.data(), buf.size(), DType::kF32,
                                      comm::ReduceOp::kSum, st));
  TZ_RETURN_IF_ERROR(device_.copy_async(buf.data(), scalars_.data(), bytes,
                                        gpu::CopyKind::kDeviceToHost, st));
  TZ_RETURN_IF_ERROR(sync(st, "norm all_reduce"));
  gpu::NormAccumulator total;
  for (int r = 0; r < world_; ++r) {
    const float* slot = buf.data() + static_cast<std::size_t>(r) * per_rank;
    const std::uint64_t s = decode_u64(slot);
    double v = 0;
    std::memcpy(&v, &s, sizeof(v));
    total.sum_squares += v;
    total.nonfinite_count += decode_u64(slot + kScalarPieces);
  }
  return total;
}

// Stage 0: every rank's reduced shard gathered into the full fp32-exact gradient of the unit,
// in 16-bit when the shard holds one micro-batch (its fp32 values are exact 16-bit values, so
// the bits match stage 1's) and in fp32 otherwise. Returns the dtype; data in `dev_full`.
Result<DType> EngineImpl::gather_full_gradient(Unit& u, const Lease& acc, gpu::DeviceBuffer& dev_full) {
  gpu::Stream& st = device_.compute_stream();
  const std::size_t s = u.layout.shard;
  const DType dt = gradient_accumulation_steps() == 1 ? compute_dtype_ : DType::kF32;
  const std::size_t es = dtype_size(dt);
  TZ_ASSIGN_OR_RETURN(dev_full, allocate_device(u.layout.padded * es));
  auto* mine = dev_full.as<std::byte>() + static_cast<std::size_t>(rank_) * s * es;
  const bool acc_on_device = grad_place_ == Placement::kDevice;
  if (dt == DType::kF32) {
    TZ_RETURN_IF_ERROR(device_.copy_async(mine, acc.data(), s * 4,
                                          acc_on_device ? gpu::CopyKind::kDeviceToDevice
                                                        : gpu::CopyKind::kHostToDevice,
                                          st));
  } else if (acc_on_device) {
    TZ_RETURN_IF_ERROR(device_.cast(acc.data(), DType::kF32, mine, dt, s, st));
  } else {
    host_cast_from_f32(static_cast<const float*>(acc.data()), stage16_.data(), dt, s);
    TZ_RETURN_IF_ERROR(
        device_.copy_async(mine, stage16_.data(), s * es, gpu::CopyKind::kHostToDevice, st));
  }
  TZ_RETURN_IF_ERROR(with_unit(u, "step: gradient all_gather",
                               comm_.all_gather(mine, dev_full.data(), s, dt, st)));
  ++u.update_gathers;
  return dt;
}

Status EngineImpl::zero_gradients() {
  gpu::Stream& st = device_.compute_stream();
  for (const Unit& u : units_) {
    if (u.frozen()) continue;
    if (grad_place_ == Placement::kDevice) {
      TZ_ASSIGN_OR_RETURN(Lease l, store_->pin(u.grad_acc, Tier::kDevice, Access::kWrite));
      TZ_RETURN_IF_ERROR(l.wait());
      TZ_RETURN_IF_ERROR(device_.memset_async(l.data(), 0, u.layout.shard * 4, st));
      l.release(&st);
    } else {
      TZ_ASSIGN_OR_RETURN(Lease l, store_->pin(u.grad_acc, Tier::kHost, Access::kWrite));
      TZ_RETURN_IF_ERROR(l.wait());
      std::memset(l.data(), 0, u.layout.shard * 4);
      l.release();
    }
  }
  return Status::ok();
}

}  // namespace tz::zero::impl
