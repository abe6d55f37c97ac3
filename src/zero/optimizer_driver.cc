// The optimizer driver (optimizer_driver.h): one unit's update where the config puts the optimizer
// (device, CPU, NVMe-streamed states) and the new 16-bit parameters written to their home tier.
#include "zero/optimizer_driver.h"

#include <optional>
#include <string_view>
#include <vector>

#include "core/busy_union.h"
#include "core/trace.h"
#include "zero/optimizer_args.h"
#include "zero/schedule.h"

namespace tz::zero::impl {
namespace {
// The Chrome trace track of the CPU optimizer's waits for a unit's states and its steps.
constexpr std::string_view kOptimizerTrack = "cpu optimizer";

// The piece sums the CPU optimizer takes of a host-tier block it writes, while the bytes are in
// its cache (cpu::PieceSums), handed to the store at release (Lease::release_hashed) so that the
// block's write-back to NVMe does not read them again to hash them. None when the block's
// write-backs are not hashed (not NVMe-homed, or checksums off).
class WrittenSums {
 public:
  // The request for `lease`'s sums, for the optimizer's shard.
  cpu::PieceSums ask(const store::Store& store, const Lease& lease) {
    const std::uint64_t piece = store.hashed_piece_bytes(lease.block());
    if (piece == 0) return {};
    sums_.assign((lease.bytes() + piece - 1) / piece, 0);
    return {sums_.data(), lease.bytes(), piece};
  }
  // Unpins `lease` with the sums the optimizer filled, or plainly when none were asked.
  void release(Lease& lease) {
    if (sums_.empty()) {
      lease.release();
    } else {
      lease.release_hashed(sums_);
    }
  }

 private:
  std::vector<std::uint64_t> sums_;
};
}  // namespace

Status OptimizerDriver::init() {
  TZ_ASSERT(!cpu_opt_, "optimizer driver initialized twice");
  TZ_ASSIGN_OR_RETURN(spec_, cpu::spec_from_config(ctx_.config));
  ctx_.states = cpu::state_count(spec_);
  TZ_ASSERT(ctx_.states >= 0 && ctx_.states <= 2, "an optimizer keeps at most two state arrays");
  if (ctx_.opt_place == Placement::kDevice && spec_.state_dtype != DType::kF32) {
    return Status::invalid_argument(
        "tierzero.state_dtype: bf16 optimizer states need the CPU optimizer "
        "(zero_optimization.offload_optimizer.device cpu or nvme)");
  }
  if (ctx_.opt_place != Placement::kDevice) {
    cpu::OptimizerOptions oo;
    oo.threads = static_cast<int>(ctx_.config.tierzero.optimizer_threads);
    // Ranks as threads of one process share the cores: binding every rank's arena to the same
    // cores would serialize them behind one another's pins.
    oo.pin_threads = ctx_.comm.backend() != "local" || ctx_.world == 1;
    TZ_ASSIGN_OR_RETURN(cpu::CpuOptimizer opt, cpu::CpuOptimizer::create(spec_, oo));
    cpu_opt_.emplace(std::move(opt));
  }
  return Status::ok();
}

Status OptimizerDriver::update_all(const cpu::StepArgs& args) {
  TZ_ASSERT(ctx_.store != nullptr, "update before finalize");
  TZ_ASSERT(args.step >= 1, "update numbers are 1-based");
  return for_each_update([&](Unit& u) { return update_unit(u, args); });
}

Status OptimizerDriver::for_each_update(const std::function<Status(Unit&)>& fn) {
  for (std::size_t i = 0; i < ctx_.units.size(); ++i) {
    if (ctx_.units[i].frozen()) continue;
    if (ctx_.opt_place == Placement::kNvme) {
      if (const Unit* next = ctx_.next_trainable(i)) prefetch_states(*next);
    }
    TZ_RETURN_IF_ERROR(fn(ctx_.units[i]));
  }
  return Status::ok();
}

void OptimizerDriver::count_update_gather(const Unit& u) {
  TZ_ASSERT(u.id < ctx_.counters.update_gathers.size(), "update gather before finalize");
  ++ctx_.counters.update_gathers[u.id];
}

// The unit's master, states and gradient pinned where the optimizer runs, and waited for.
Status OptimizerDriver::pin_update_blocks(Unit& u, bool on_device, Lease& master, Lease* states,
                                          Lease& acc) {
  const Tier tier = on_device ? Tier::kDevice : Tier::kHost;
  TZ_ASSIGN_OR_RETURN(master, ctx_.pin_for(u, "step: master", u.master, tier, Access::kReadWrite));
  for (int i = 0; i < ctx_.states; ++i) {
    TZ_ASSIGN_OR_RETURN(states[i], ctx_.pin_for(u, "step: optimizer state", u.state[i], tier,
                                                Access::kReadWrite));
  }
  TZ_ASSIGN_OR_RETURN(acc, ctx_.pin_for(u, "step: gradient", u.grad_acc, tier, Access::kRead));
  {
    std::optional<TraceSpan> span;
    if (!on_device) span.emplace(kOptimizerTrack, "wait master, states ", u.spec.name);
    TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "step: master", master.wait()));
    for (int i = 0; i < ctx_.states; ++i) {
      TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "step: state", states[i].wait()));
    }
  }
  return ctx_.with_unit(u, "step: gradient", acc.wait());
}

Status OptimizerDriver::update_unit(Unit& u, const cpu::StepArgs& args) {
  TZ_ASSERT(!u.frozen() && u.master != kNoBlock, "update of a frozen unit");
  TZ_ASSERT(ctx_.opt_place == Placement::kDevice || cpu_opt_,
            "an offloaded optimizer runs on the CPU");
  gpu::Stream& st = ctx_.stream();
  const std::size_t es = dtype_size(ctx_.compute_dtype);
  const std::size_t s = u.layout.shard;
  const std::size_t n = u.opt_elems;
  const bool on_device = ctx_.opt_place == Placement::kDevice;
  Lease master, states[2], acc;
  TZ_RETURN_IF_ERROR(pin_update_blocks(u, on_device, master, states, acc));

  // The gradient the update reads.
  DType grad_dtype = DType::kF32;
  gpu::DeviceBuffer dev_full;
  TZ_ASSIGN_OR_RETURN(const void* grad, update_gradient(u, acc, on_device, dev_full, grad_dtype));
  const bool copy16 = ctx_.compute_dtype != DType::kF32;

  // Where the new compute-dtype parameters go: stages 0-2 the full device block (stage 0 all
  // of it, stages 1-2 this rank's slice, then all-gathered); stage 3 this rank's shard.
  const bool whole = ctx_.stage == 0 || ctx_.stage == 3;
  // The CPU optimizer writes a host- or NVMe-homed stage-3 shard in place in the host tier (the
  // next forward loads it from there); every other destination is the device copy.
  const Tier param_tier = !on_device && ctx_.stage == 3 && ctx_.param_place != Placement::kDevice
                              ? Tier::kHost
                              : Tier::kDevice;
  TZ_ASSIGN_OR_RETURN(Lease param, ctx_.pin_for(u, "step: parameters", u.param, param_tier,
                                                whole ? Access::kWrite : Access::kReadWrite));
  TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "step: parameters", param.wait()));
  auto* param_dst = static_cast<std::byte*>(param.data()) +
                    (whole ? 0 : static_cast<std::size_t>(ctx_.rank) * s * es);
  WrittenSums master_sums, state_sums[2], param_sums;

  if (on_device) {
    gpu::OptimizerStepArgs a = device_step_coeffs(spec_, [&] {
      cpu::StepArgs sa = args;
      sa.grad_dtype = grad_dtype;
      return sa;
    }());
    a.param = static_cast<float*>(master.data());
    a.grad = grad;
    a.grad_dtype = grad_dtype;
    for (int i = 0; i < ctx_.states; ++i) a.state[i] = static_cast<float*>(states[i].data());
    a.param_copy = copy16 ? param_dst : nullptr;
    a.copy_dtype = args.copy_dtype;
    a.n = n;
    TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "step: optimizer", ctx_.device.optimizer_step(a, st)));
    if (!copy16) {
      TZ_RETURN_IF_ERROR(ctx_.device.copy_async(param_dst, master.data(), n * 4,
                                                gpu::CopyKind::kDeviceToDevice, st));
    }
  } else {
    cpu::Shard shard;
    shard.param = static_cast<float*>(master.data());
    shard.grad = grad;
    for (int i = 0; i < ctx_.states; ++i) shard.state[i] = states[i].data();
    const bool in_place = param_tier == Tier::kHost;
    shard.param_copy = !copy16    ? nullptr
                       : in_place ? static_cast<void*>(param_dst)
                                  : static_cast<void*>(ctx_.stage16.data());
    shard.n = n;
    shard.param_sums = master_sums.ask(*ctx_.store, master);
    for (int i = 0; i < ctx_.states; ++i) {
      shard.state_sums[i] = state_sums[i].ask(*ctx_.store, states[i]);
    }
    if (copy16 && in_place && whole) shard.copy_sums = param_sums.ask(*ctx_.store, param);
    cpu::StepArgs sa = args;
    sa.grad_dtype = grad_dtype;
    const auto t_cpu = Clock::now();
    {
      // The cores' busy time, which the bound counts once with a host-memory device's compute.
      BusyScope busy(BusyUnion::host_cores());
      TraceSpan span(kOptimizerTrack, "step ", u.spec.name);
      TZ_RETURN_IF_ERROR(ctx_.with_unit(
          u, "step: cpu optimizer", cpu_opt_->step(std::span<const cpu::Shard>(&shard, 1), sa)));
    }
    ctx_.counters.optimizer_s += seconds_since(t_cpu);
    if (in_place) {
      if (!copy16) std::memcpy(param_dst, master.data(), n * 4);
    } else {
      const void* src = copy16 ? static_cast<const void*>(ctx_.stage16.data()) : master.data();
      TZ_RETURN_IF_ERROR(
          ctx_.device.copy_async(param_dst, src, n * es, gpu::CopyKind::kHostToDevice, st));
      ctx_.counters.copy_bytes += n * es;
    }
  }
  if (ctx_.stage == 1 || ctx_.stage == 2) {
    TZ_RETURN_IF_ERROR(
        ctx_.with_unit(u, "step: parameter all_gather",
                       ctx_.comm.all_gather(param_dst, param.data(), s, ctx_.compute_dtype, st)));
    count_update_gather(u);
  }
  // The host staging buffers and the leases' bytes are reused by the next unit: finish here.
  TZ_RETURN_IF_ERROR(ctx_.sync(st, "step '" + u.spec.name + "'"));
  param_sums.release(param);
  acc.release();
  for (int i = 0; i < ctx_.states; ++i) state_sums[i].release(states[i]);
  master_sums.release(master);
  return Status::ok();
}

// Stage 0: every rank's reduced shard gathered into the full gradient of the unit, in 16-bit
// when the shard holds one micro-batch (its values are exact 16-bit values, so the bits match
// stage 1's) and in fp32 otherwise. Returns the dtype; data in `dev_full`.
Result<DType> OptimizerDriver::gather_full_gradient(Unit& u, const Lease& acc,
                                                    gpu::DeviceBuffer& dev_full) {
  gpu::Stream& st = ctx_.stream();
  const std::size_t s = u.layout.shard;
  const DType dt = ctx_.accumulation_steps() == 1 ? ctx_.compute_dtype : DType::kF32;
  const std::size_t es = dtype_size(dt);
  TZ_ASSIGN_OR_RETURN(dev_full, ctx_.buffers.allocate(u.layout.padded * es));
  auto* mine = dev_full.as<std::byte>() + static_cast<std::size_t>(ctx_.rank) * s * es;
  const bool acc_on_device = ctx_.grad_place == Placement::kDevice;
  if (dt == ctx_.grad_dtype) {  // fp32, or a 16-bit accumulator (one micro-batch a step)
    TZ_RETURN_IF_ERROR(ctx_.device.copy_async(
        mine, acc.data(), s * es,
        acc_on_device ? gpu::CopyKind::kDeviceToDevice : gpu::CopyKind::kHostToDevice, st));
  } else if (acc_on_device) {
    TZ_RETURN_IF_ERROR(ctx_.device.cast(acc.data(), DType::kF32, mine, dt, s, st));
  } else {
    host_cast_from_f32(static_cast<const float*>(acc.data()), ctx_.stage16.data(), dt, s);
    TZ_RETURN_IF_ERROR(ctx_.device.copy_async(mine, ctx_.stage16.data(), s * es,
                                              gpu::CopyKind::kHostToDevice, st));
  }
  TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "step: gradient all_gather",
                                    ctx_.comm.all_gather(mine, dev_full.data(), s, dt, st)));
  count_update_gather(u);
  return dt;
}

// The gradient update_unit reads: the reduced shard (in EngineContext::grad_dtype), or stage 0's
// all-gathered full gradient (in `dev_full`, copied to the host staging buffer when the optimizer
// runs on the CPU); `grad_dtype` says its dtype.
Result<const void*> OptimizerDriver::update_gradient(Unit& u, const Lease& acc, bool on_device,
                                                     gpu::DeviceBuffer& dev_full,
                                                     DType& grad_dtype) {
  TZ_ASSERT(acc.data() != nullptr, "update_gradient needs the pinned gradient");
  gpu::Stream& st = ctx_.stream();
  const void* grad = acc.data();
  grad_dtype = ctx_.grad_dtype;
  if (ctx_.stage == 0) {
    TZ_ASSIGN_OR_RETURN(grad_dtype, gather_full_gradient(u, acc, dev_full));
    grad = dev_full.data();
    if (!on_device) {
      const std::size_t gb = u.layout.padded * dtype_size(grad_dtype);
      void* host_full = grad_dtype == DType::kF32 ? ctx_.stage32.data() : ctx_.stage16.data();
      ctx_.counters.copy_bytes +=
          gb + static_cast<std::uint64_t>(u.layout.shard) * dtype_size(grad_dtype);
      TZ_RETURN_IF_ERROR(
          ctx_.device.copy_async(host_full, dev_full.data(), gb, gpu::CopyKind::kDeviceToHost, st));
      TZ_RETURN_IF_ERROR(ctx_.sync(st, "step '" + u.spec.name + "'"));
      grad = host_full;
    }
  }
  return grad;
}

// The optimizer's arguments for update number `step` (1-based, skipped steps excluded) with
// gradient multiplier `multiplier`; the schedule's learning rate for it (DeepSpeed advances
// the schedule after each applied update).
cpu::StepArgs OptimizerDriver::update_args(double multiplier, std::int64_t step) const {
  TZ_ASSERT(step >= 1 && multiplier > 0, "update numbers are 1-based, multipliers positive");
  cpu::StepArgs args;
  args.step = step;
  args.grad_multiplier = static_cast<float>(multiplier);
  args.grad_dtype = ctx_.grad_dtype;  // the accumulators' (a device update sets its own)
  args.copy_dtype = ctx_.compute_dtype == DType::kF32 ? DType::kBF16 : ctx_.compute_dtype;
  args.lr_override = scheduled_lr(ctx_.config.scheduler, spec_.lr,
                                  ctx_.config.scheduler.last_batch_iteration + step - 1);
  return args;
}

// The compute-dtype parameters of `u` written from its master (stages 1-2: this rank's slice,
// then all-gathered), as update_unit writes the optimizer's copy.
Status OptimizerDriver::write_params_from_master(Unit& u) {
  TZ_ASSERT(!u.frozen(), "parameters from the master of a frozen unit");
  gpu::Stream& st = ctx_.stream();
  const std::size_t n = u.opt_elems;
  const bool on_device = ctx_.opt_place == Placement::kDevice;
  const bool copy16 = ctx_.compute_dtype != DType::kF32;
  TZ_ASSIGN_OR_RETURN(Lease master,
                      ctx_.pin_for(u, "eager rollback: master", u.master,
                                   on_device ? Tier::kDevice : Tier::kHost, Access::kRead));
  TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "eager rollback: master", master.wait()));
  if (!on_device) {
    const void* src = master.data();
    if (copy16) {
      host_cast_from_f32(static_cast<const float*>(master.data()), ctx_.stage16.data(),
                         ctx_.compute_dtype, n);
      src = ctx_.stage16.data();
    }
    Status s = write_params(u, src);
    master.release();
    return s;
  }
  const bool whole = ctx_.stage == 0 || ctx_.stage == 3;
  TZ_ASSIGN_OR_RETURN(Lease param,
                      ctx_.pin_for(u, "eager rollback: parameters", u.param, Tier::kDevice,
                                   whole ? Access::kWrite : Access::kReadWrite));
  TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "eager rollback: parameters", param.wait()));
  const std::size_t es = dtype_size(ctx_.compute_dtype);
  auto* dst = static_cast<std::byte*>(param.data()) +
              (whole ? 0 : static_cast<std::size_t>(ctx_.rank) * u.layout.shard * es);
  if (copy16) {
    TZ_RETURN_IF_ERROR(ctx_.with_unit(
        u, "eager rollback: cast",
        ctx_.device.cast(master.data(), DType::kF32, dst, ctx_.compute_dtype, n, st)));
  } else {
    TZ_RETURN_IF_ERROR(
        ctx_.device.copy_async(dst, master.data(), n * 4, gpu::CopyKind::kDeviceToDevice, st));
  }
  if (ctx_.stage == 1 || ctx_.stage == 2) {
    TZ_RETURN_IF_ERROR(ctx_.with_unit(
        u, "eager rollback: parameter all_gather",
        ctx_.comm.all_gather(dst, param.data(), u.layout.shard, ctx_.compute_dtype, st)));
    count_update_gather(u);
  }
  TZ_RETURN_IF_ERROR(ctx_.sync(st, "eager rollback '" + u.spec.name + "'"));
  param.release();
  master.release();
  return Status::ok();
}

// This rank's compute-dtype parameters of `u` (opt_elems elements of host memory in
// `src`) into the parameter block where the next forward finds them: in place in the host
// tier for a host- or NVMe-homed stage-3 shard, else the device copy; stages 1-2 write their
// slice and all-gather the full unit.
Status OptimizerDriver::write_params(Unit& u, const void* src) {
  TZ_ASSERT(!u.frozen() && src != nullptr, "written parameters of a frozen unit or from nowhere");
  gpu::Stream& st = ctx_.stream();
  const std::size_t es = dtype_size(ctx_.compute_dtype);
  const std::size_t n = u.opt_elems;
  const bool whole = ctx_.stage == 0 || ctx_.stage == 3;
  const Tier param_tier =
      ctx_.stage == 3 && ctx_.param_place != Placement::kDevice ? Tier::kHost : Tier::kDevice;
  TZ_ASSIGN_OR_RETURN(Lease param, ctx_.pin_for(u, "parameters", u.param, param_tier,
                                                whole ? Access::kWrite : Access::kReadWrite));
  TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "parameters", param.wait()));
  auto* dst = static_cast<std::byte*>(param.data()) +
              (whole ? 0 : static_cast<std::size_t>(ctx_.rank) * u.layout.shard * es);
  if (param_tier == Tier::kHost) {
    std::memcpy(dst, src, n * es);
  } else {
    TZ_RETURN_IF_ERROR(
        ctx_.with_unit(u, "parameters: copy to device",
                       ctx_.device.copy_async(dst, src, n * es, gpu::CopyKind::kHostToDevice, st)));
    ctx_.counters.copy_bytes += n * es;
  }
  if (ctx_.stage == 1 || ctx_.stage == 2) {
    TZ_RETURN_IF_ERROR(ctx_.with_unit(
        u, "parameter all_gather",
        ctx_.comm.all_gather(dst, param.data(), u.layout.shard, ctx_.compute_dtype, st)));
    count_update_gather(u);
  }
  // `src` may be a staging buffer the caller reuses: finish here.
  TZ_RETURN_IF_ERROR(ctx_.sync(st, "parameters of '" + u.spec.name + "'"));
  param.release();
  return Status::ok();
}

Result<double> OptimizerDriver::update_unit_on_host(Unit& u, const cpu::StepArgs& args,
                                                    const void* grad, void* param_copy,
                                                    const std::string& what, Lease* param) {
  TZ_ASSERT(!u.frozen() && cpu_opt_ && grad != nullptr && param_copy != nullptr,
            "a host update needs a trainable unit, the CPU optimizer and its buffers");
  const std::string master_what = what + ": master";
  const std::string state_what = what + ": optimizer state";
  const std::string step_what = what + ": cpu optimizer";
  TZ_ASSIGN_OR_RETURN(Lease master, ctx_.pin_for(u, master_what.c_str(), u.master, Tier::kHost,
                                                 Access::kReadWrite));
  Lease states[2];
  for (int s = 0; s < ctx_.states; ++s) {
    TZ_ASSIGN_OR_RETURN(states[s], ctx_.pin_for(u, state_what.c_str(), u.state[s],
                                                Tier::kHost, Access::kReadWrite));
  }
  {
    TraceSpan span(kOptimizerTrack, "wait master, states ", u.spec.name);
    TZ_RETURN_IF_ERROR(ctx_.with_unit(u, master_what.c_str(), master.wait()));
    for (int s = 0; s < ctx_.states; ++s) {
      TZ_RETURN_IF_ERROR(ctx_.with_unit(u, state_what.c_str(), states[s].wait()));
    }
  }
  const bool copy16 = ctx_.compute_dtype != DType::kF32;
  cpu::Shard shard;
  shard.param = static_cast<float*>(master.data());
  shard.grad = grad;
  for (int s = 0; s < ctx_.states; ++s) shard.state[s] = states[s].data();
  shard.param_copy = copy16 ? param_copy : nullptr;
  shard.n = u.opt_elems;
  WrittenSums master_sums, state_sums[2], param_sums;
  shard.param_sums = master_sums.ask(*ctx_.store, master);
  for (int s = 0; s < ctx_.states; ++s) {
    shard.state_sums[s] = state_sums[s].ask(*ctx_.store, states[s]);
  }
  if (copy16 && param != nullptr) {
    TZ_ASSERT(param->data() == param_copy, "the parameters' lease is not param_copy's block");
    shard.copy_sums = param_sums.ask(*ctx_.store, *param);
  }
  const auto t0 = Clock::now();
  {
    // The cores' busy time, which the bound counts once with a host-memory device's compute (the
    // update runs beside the next forward's kernels).
    BusyScope busy(BusyUnion::host_cores());
    TraceSpan span(kOptimizerTrack, "step ", u.spec.name);
    TZ_RETURN_IF_ERROR(ctx_.with_unit(
        u, step_what.c_str(), cpu_opt_->step(std::span<const cpu::Shard>(&shard, 1), args)));
    if (!copy16) std::memcpy(param_copy, master.data(), u.opt_elems * 4);
  }
  const double seconds = seconds_since(t0);
  if (param != nullptr) param_sums.release(*param);
  for (int s = 0; s < ctx_.states; ++s) state_sums[s].release(states[s]);
  master_sums.release(master);
  return seconds;
}

void OptimizerDriver::keep_states(const Unit& u) {
  ctx_.store->keep(u.master, Tier::kHost).ignore();
  for (int i = 0; i < ctx_.states; ++i) ctx_.store->keep(u.state[i], Tier::kHost).ignore();
}

void OptimizerDriver::write_back_states(const Unit& u) {
  ctx_.store->write_back(u.master, Tier::kHost).ignore();
  for (int i = 0; i < ctx_.states; ++i) ctx_.store->write_back(u.state[i], Tier::kHost).ignore();
}

void OptimizerDriver::prefetch_states(const Unit& u) {
  TZ_ASSERT(!u.frozen(), "prefetch of a frozen unit's states");
  ctx_.store->prefetch(u.master, Tier::kHost).ignore();
  for (int i = 0; i < ctx_.states; ++i) ctx_.store->prefetch(u.state[i], Tier::kHost).ignore();
}

}  // namespace tz::zero::impl
