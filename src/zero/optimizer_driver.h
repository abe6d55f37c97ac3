// The optimizer driver (DESIGN.md, zero/): one unit's update where the config puts the optimizer
// (the device, the CPU, or the CPU with its states streamed from NVMe), every trainable unit's
// update in registration order with the next unit's NVMe states read ahead, and the new 16-bit
// parameters written to their home tier (stages 1-2 all-gather the updated slices). It owns the
// optimizer's spec and the CPU optimizer. The overlap modes (overlap.h) decide when it runs.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "cpu/optimizer.h"
#include "zero/engine_context.h"

namespace tz::zero::impl {

class OptimizerDriver {
 public:
  explicit OptimizerDriver(EngineContext& ctx) : ctx_(ctx) {}
  OptimizerDriver(const OptimizerDriver&) = delete;
  OptimizerDriver& operator=(const OptimizerDriver&) = delete;

  // The optimizer from the config (ctx.states set from it) and, when it is offloaded, the CPU
  // optimizer. Errors: kInvalidArgument naming the key (bf16 states on the device), the CPU
  // optimizer's.
  Status init();

  const cpu::OptimizerSpec& spec() const { return spec_; }

  // The CPU optimizer (null when the optimizer runs on the device). delayed's background update
  // calls it while the rank's thread does not.
  cpu::CpuOptimizer* cpu_optimizer() { return cpu_opt_ ? &*cpu_opt_ : nullptr; }

  // The optimizer's arguments for update number `update` (1-based, skipped steps excluded) with
  // gradient multiplier `multiplier`; the schedule's learning rate for it (DeepSpeed advances
  // the schedule after each applied update).
  cpu::StepArgs update_args(double multiplier, std::int64_t update) const;

  // Every trainable unit's update now, in registration order (NVMe-homed states: the next unit's
  // read while this one updates).
  Status update_all(const cpu::StepArgs& args);

  // One trainable unit's update from its reduced gradient: master and states in place, the new
  // parameters written where the next forward finds them.
  Status update_unit(Unit& u, const cpu::StepArgs& args);

  // The compute-dtype parameters of `u` written from its master (stages 1-2: this rank's slice,
  // then all-gathered), as update_unit writes the optimizer's copy.
  Status write_params_from_master(Unit& u);

  // This rank's compute-dtype parameters of `u` (opt_elems elements of host memory in
  // `src`) into the parameter block where the next forward finds them: in place in the host
  // tier for a host- or NVMe-homed stage-3 shard, else the device copy; stages 1-2 write their
  // slice and all-gather the full unit.
  Status write_params(Unit& u, const void* src);

  // The unit's master and states start loading into the host tier (NVMe-homed states).
  void prefetch_states(const Unit& u);
  // The unit's master and states, current in the host tier, kept there until their next pin
  // (Store::keep).
  void keep_states(const Unit& u);

  // The unit's master and states, updated in the host tier, start going home now (Store::
  // write_back), so that their eviction later frees room at once.
  void write_back_states(const Unit& u);

  // Every trainable unit in registration order through `fn`, the next trainable unit's
  // NVMe-homed states read ahead while `fn` works on this one (the previous unit's write-back is
  // already in flight from its unpin); stops at the first error. update_all and the overlap
  // modes' workers walk the units with it.
  Status for_each_update(const std::function<Status(Unit&)>& fn);

  // The CPU optimizer's update of one unit off the rank's thread (the overlap modes' workers):
  // master and states pinned in the host tier, the gradient shard `grad` (opt_elems elements
  // of args.grad_dtype, host memory), the new compute-dtype parameters written to `param_copy`
  // (opt_elems elements). Touches only the store and the CPU optimizer: no stream, no
  // collective, no step counter. `what` names the caller in errors. `param`: the host write
  // pin `param_copy` is the start of, released here (hashed, Lease::release_hashed) once the
  // update succeeded. Returns the CPU optimizer's seconds.
  Result<double> update_unit_on_host(Unit& u, const cpu::StepArgs& args, const void* grad,
                                     void* param_copy, const std::string& what,
                                     Lease* param = nullptr);

 private:
  // Stage 0: every rank's reduced shard gathered into the full gradient of the unit, in 16-bit
  // when the shard holds one micro-batch (its values are exact 16-bit values, so the bits match
  // stage 1's) and in fp32 otherwise. Returns the dtype; data in `dev_full`.
  Result<DType> gather_full_gradient(Unit& u, const Lease& acc, gpu::DeviceBuffer& dev_full);

  Result<const void*> update_gradient(Unit& u, const Lease& acc, bool on_device,
                                      gpu::DeviceBuffer& dev_full, DType& grad_dtype);

  Status pin_update_blocks(Unit& u, bool on_device, Lease& master, Lease* states, Lease& acc);

  // One all-gather of the unit's updated parameters (or stage 0's gradient) this step.
  void count_update_gather(const Unit& u);

  EngineContext& ctx_;
  cpu::OptimizerSpec spec_;
  std::optional<cpu::CpuOptimizer> cpu_opt_;
};

}  // namespace tz::zero::impl
