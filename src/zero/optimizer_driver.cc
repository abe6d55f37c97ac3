// The optimizer driver (engine_impl.h): one unit's update where the config puts the optimizer
// (device, CPU, NVMe-streamed states) and the new 16-bit parameters written to their home tier.
#include "zero/engine_impl.h"

namespace tz::zero::impl {

Status EngineImpl::update_unit(Unit& u, const cpu::StepArgs& args) {
  gpu::Stream& st = device_.compute_stream();
  const std::size_t es = dtype_size(compute_dtype_);
  const std::size_t s = u.layout.shard;
  const std::size_t n = u.opt_elems;
  const bool on_device = opt_place_ == Placement::kDevice;
  const Tier state_tier = on_device ? Tier::kDevice : Tier::kHost;
  TZ_ASSIGN_OR_RETURN(Lease master, pin_for(u, "step: master", u.master, state_tier,
                                            Access::kReadWrite));
  Lease states[2];
  for (int i = 0; i < states_; ++i) {
    TZ_ASSIGN_OR_RETURN(states[i], pin_for(u, "step: optimizer state", u.state[i], state_tier,
                                           Access::kReadWrite));
  }
  TZ_ASSIGN_OR_RETURN(Lease acc, pin_for(u, "step: gradient", u.grad_acc,
                                         on_device ? Tier::kDevice : Tier::kHost, Access::kRead));
  TZ_RETURN_IF_ERROR(with_unit(u, "step: master", master.wait()));
  for (int i = 0; i < states_; ++i) TZ_RETURN_IF_ERROR(with_unit(u, "step: state", states[i].wait()));
  TZ_RETURN_IF_ERROR(with_unit(u, "step: gradient", acc.wait()));

  // The gradient the update reads.
  DType grad_dtype = DType::kF32;
  gpu::DeviceBuffer dev_full;
  TZ_ASSIGN_OR_RETURN(const void* grad, update_gradient(u, acc, on_device, dev_full, grad_dtype));
  const bool copy16 = compute_dtype_ != DType::kF32;

  // Where the new compute-dtype parameters go: stages 0-2 the full device block (stage 0 all
  // of it, stages 1-2 this rank's slice, then all-gathered); stage 3 this rank's shard.
  const bool whole = stage_ == 0 || stage_ == 3;
  // The CPU optimizer writes a host- or NVMe-homed stage-3 shard in place in the host tier (the
  // next forward loads it from there); every other destination is the device copy.
  const Tier param_tier = !on_device && stage_ == 3 && param_place_ != Placement::kDevice
                              ? Tier::kHost
                              : Tier::kDevice;
  TZ_ASSIGN_OR_RETURN(Lease param, pin_for(u, "step: parameters", u.param, param_tier,
                                           whole ? Access::kWrite : Access::kReadWrite));
  TZ_RETURN_IF_ERROR(with_unit(u, "step: parameters", param.wait()));
  auto* param_dst = static_cast<std::byte*>(param.data()) +
                    (whole ? 0 : static_cast<std::size_t>(rank_) * s * es);

  if (on_device) {
    gpu::OptimizerStepArgs a = device_step_coeffs(spec_, [&] {
      cpu::StepArgs sa = args;
      sa.grad_dtype = grad_dtype;
      return sa;
    }());
    a.param = static_cast<float*>(master.data());
    a.grad = grad;
    a.grad_dtype = grad_dtype;
    for (int i = 0; i < states_; ++i) a.state[i] = static_cast<float*>(states[i].data());
    a.param_copy = copy16 ? param_dst : nullptr;
    a.copy_dtype = args.copy_dtype;
    a.n = n;
    TZ_RETURN_IF_ERROR(with_unit(u, "step: optimizer", device_.optimizer_step(a, st)));
    if (!copy16) {
      TZ_RETURN_IF_ERROR(device_.copy_async(param_dst, master.data(), n * 4,
                                            gpu::CopyKind::kDeviceToDevice, st));
    }
  } else {
    cpu::Shard shard;
    shard.param = static_cast<float*>(master.data());
    shard.grad = grad;
    for (int i = 0; i < states_; ++i) shard.state[i] = states[i].data();
    const bool in_place = param_tier == Tier::kHost;
    shard.param_copy = !copy16 ? nullptr : in_place ? static_cast<void*>(param_dst)
                                                    : static_cast<void*>(stage16_.data());
    shard.n = n;
    cpu::StepArgs sa = args;
    sa.grad_dtype = grad_dtype;
    const auto t_cpu = Clock::now();
    TZ_RETURN_IF_ERROR(with_unit(u, "step: cpu optimizer",
                                 cpu_opt_->step(std::span<const cpu::Shard>(&shard, 1), sa)));
    optimizer_s_ += seconds_since(t_cpu);
    if (in_place) {
      if (!copy16) std::memcpy(param_dst, master.data(), n * 4);
    } else {
      const void* src = copy16 ? static_cast<const void*>(stage16_.data()) : master.data();
      TZ_RETURN_IF_ERROR(
          device_.copy_async(param_dst, src, n * es, gpu::CopyKind::kHostToDevice, st));
      copy_bytes_ += n * es;
    }
  }
  if (stage_ == 1 || stage_ == 2) {
    TZ_RETURN_IF_ERROR(with_unit(
        u, "step: parameter all_gather",
        comm_.all_gather(param_dst, param.data(), s, compute_dtype_, st)));
    ++u.update_gathers;
  }
  // The host staging buffers and the leases' bytes are reused by the next unit: finish here.
  TZ_RETURN_IF_ERROR(sync(st, "step '" + u.spec.name + "'"));
  param.release();
  acc.release();
  for (int i = 0; i < states_; ++i) states[i].release();
  master.release();
  return Status::ok();
}

// The gradient update_unit reads: the reduced fp32 shard, or stage 0's all-gathered full gradient
// (in `dev_full`, copied to the host staging buffer when the optimizer runs on the CPU);
// `grad_dtype` says its dtype.
Result<const void*> EngineImpl::update_gradient(Unit& u, const Lease& acc, bool on_device,
                                                gpu::DeviceBuffer& dev_full, DType& grad_dtype) {
  TZ_ASSERT(finalized_ && acc.data() != nullptr, "update_gradient needs the pinned gradient");
  gpu::Stream& st = device_.compute_stream();
  const void* grad = acc.data();
  if (stage_ == 0) {
    TZ_ASSIGN_OR_RETURN(grad_dtype, gather_full_gradient(u, acc, dev_full));
    grad = dev_full.data();
    if (!on_device) {
      const std::size_t gb = u.layout.padded * dtype_size(grad_dtype);
      void* host_full = grad_dtype == DType::kF32 ? stage32_.data() : stage16_.data();
      copy_bytes_ += gb + static_cast<std::uint64_t>(u.layout.shard) * dtype_size(grad_dtype);
      TZ_RETURN_IF_ERROR(device_.copy_async(host_full, dev_full.data(), gb,
                                            gpu::CopyKind::kDeviceToHost, st));
      TZ_RETURN_IF_ERROR(sync(st, "step '" + u.spec.name + "'"));
      grad = host_full;
    }
  }
  return grad;
}

// The optimizer's arguments for update number `step` (1-based, skipped steps excluded) with
// gradient multiplier `multiplier`; the schedule's learning rate for it (DeepSpeed advances
// the schedule after each applied update).
cpu::StepArgs EngineImpl::update_args(double multiplier, std::int64_t step) const {
  cpu::StepArgs args;
  args.step = step;
  args.grad_multiplier = static_cast<float>(multiplier);
  args.grad_dtype = DType::kF32;
  args.copy_dtype = compute_dtype_ == DType::kF32 ? DType::kBF16 : compute_dtype_;
  args.lr_override =
      scheduled_lr(config_.scheduler, spec_.lr, config_.scheduler.last_batch_iteration + step - 1);
  return args;
}

// The compute-dtype parameters of `u` written from its master (stages 1-2: this rank's slice,
// then all-gathered), as update_unit writes the optimizer's copy.
Status EngineImpl::write_params_from_master(Unit& u) {
  gpu::Stream& st = device_.compute_stream();
  const std::size_t n = u.opt_elems;
  const bool on_device = opt_place_ == Placement::kDevice;
  const bool copy16 = compute_dtype_ != DType::kF32;
  TZ_ASSIGN_OR_RETURN(Lease master, pin_for(u, "eager rollback: master", u.master,
                                            on_device ? Tier::kDevice : Tier::kHost,
                                            Access::kRead));
  TZ_RETURN_IF_ERROR(with_unit(u, "eager rollback: master", master.wait()));
  if (!on_device) {
    const void* src = master.data();
    if (copy16) {
      host_cast_from_f32(static_cast<const float*>(master.data()), stage16_.data(),
                         compute_dtype_, n);
      src = stage16_.data();
    }
    Status s = write_params(u, src);
    master.release();
    return s;
  }
  const bool whole = stage_ == 0 || stage_ == 3;
  TZ_ASSIGN_OR_RETURN(Lease param, pin_for(u, "eager rollback: parameters", u.param,
                                           Tier::kDevice,
                                           whole ? Access::kWrite : Access::kReadWrite));
  TZ_RETURN_IF_ERROR(with_unit(u, "eager rollback: parameters", param.wait()));
  const std::size_t es = dtype_size(compute_dtype_);
  auto* dst = static_cast<std::byte*>(param.data()) +
              (whole ? 0 : static_cast<std::size_t>(rank_) * u.layout.shard * es);
  if (copy16) {
    TZ_RETURN_IF_ERROR(with_unit(u, "eager rollback: cast",
                                 device_.cast(master.data(), DType::kF32, dst, compute_dtype_,
                                              n, st)));
  } else {
    TZ_RETURN_IF_ERROR(device_.copy_async(dst, master.data(), n * 4,
                                          gpu::CopyKind::kDeviceToDevice, st));
  }
  if (stage_ == 1 || stage_ == 2) {
    TZ_RETURN_IF_ERROR(with_unit(
        u, "eager rollback: parameter all_gather",
        comm_.all_gather(dst, param.data(), u.layout.shard, compute_dtype_, st)));
    ++u.update_gathers;
  }
  TZ_RETURN_IF_ERROR(sync(st, "eager rollback '" + u.spec.name + "'"));
  param.release();
  master.release();
  return Status::ok();
}

// This rank's compute-dtype parameters of `u` (opt_elems elements of host memory in
// `src`) into the parameter block where the next forward finds them: in place in the host
// tier for a host- or NVMe-homed stage-3 shard, else the device copy; stages 1-2 write their
// slice and all-gather the full unit.
Status EngineImpl::write_params(Unit& u, const void* src) {
  gpu::Stream& st = device_.compute_stream();
  const std::size_t es = dtype_size(compute_dtype_);
  const std::size_t n = u.opt_elems;
  const bool whole = stage_ == 0 || stage_ == 3;
  const Tier param_tier =
      stage_ == 3 && param_place_ != Placement::kDevice ? Tier::kHost : Tier::kDevice;
  TZ_ASSIGN_OR_RETURN(Lease param, pin_for(u, "parameters", u.param, param_tier,
                                           whole ? Access::kWrite : Access::kReadWrite));
  TZ_RETURN_IF_ERROR(with_unit(u, "parameters", param.wait()));
  auto* dst = static_cast<std::byte*>(param.data()) +
              (whole ? 0 : static_cast<std::size_t>(rank_) * u.layout.shard * es);
  if (param_tier == Tier::kHost) {
    std::memcpy(dst, src, n * es);
  } else {
    TZ_RETURN_IF_ERROR(with_unit(u, "parameters: copy to device",
                                 device_.copy_async(dst, src, n * es,
                                                    gpu::CopyKind::kHostToDevice, st)));
    copy_bytes_ += n * es;
  }
  if (stage_ == 1 || stage_ == 2) {
    TZ_RETURN_IF_ERROR(with_unit(
        u, "parameter all_gather",
        comm_.all_gather(dst, param.data(), u.layout.shard, compute_dtype_, st)));
    ++u.update_gathers;
  }
  // `src` may be a staging buffer the caller reuses: finish here.
  TZ_RETURN_IF_ERROR(sync(st, "parameters of '" + u.spec.name + "'"));
  param.release();
  return Status::ok();
}

void EngineImpl::prefetch_states(const Unit& u) {
  if (u.frozen()) return;
  store_->prefetch(u.master, Tier::kHost).ignore();
  for (int i = 0; i < states_; ++i) store_->prefetch(u.state[i], Tier::kHost).ignore();
}

// The update the step decision chose (step_decision.h): none, eager's early updates kept, every
// unit now (exact, or eager after a rollback) or delayed's background job; each but none advances
// the optimizer's update count.
Status EngineImpl::apply_update(const StepDecision& decision) {
  TZ_ASSERT(finalized_ && store_ != nullptr, "apply_update before finalize");
  TZ_ASSERT(decision.update != StepUpdate::kEarlyKept || overlap_ == Overlap::kEager,
            "only eager keeps early updates");
  TZ_ASSERT(decision.update != StepUpdate::kBackground || overlap_ == Overlap::kDelayed,
            "only delayed updates in the background");
  switch (decision.update) {
    case StepUpdate::kNone:
      break;
    case StepUpdate::kEarlyKept:
      ++updates_done_;  // the early updates were this step's
      break;
    case StepUpdate::kAllUnitsNow: {
      const cpu::StepArgs args = update_args(decision.multiplier, ++updates_done_);
      for (std::size_t i = 0; i < units_.size(); ++i) {
        if (units_[i].frozen()) continue;
        // NVMe-homed optimizer state: the next trainable unit's reads start while this one
        // updates (the previous unit's write-back is already in flight from its unpin).
        if (opt_place_ == Placement::kNvme) {
          if (const Unit* next = next_trainable(i)) prefetch_states(*next);
        }
        TZ_RETURN_IF_ERROR(update_unit(units_[i], args));
      }
      break;
    }
    case StepUpdate::kBackground:
      TZ_RETURN_IF_ERROR(start_delayed_update(update_args(decision.multiplier, ++updates_done_)));
      break;
  }
  return Status::ok();
}

}  // namespace tz::zero::impl
