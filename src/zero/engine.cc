// The ZeRO engine (engine.h): one rank's units, their shards as blocks of the tiered store, the
// gather/grad/reduce protocol of a micro-batch and the optimizer step of stages 0-3 with the
// optimizer on the device, the CPU or streamed from NVMe. docs/zero.md describes the design;
// engine_impl.h lists which file holds which component. This file: the model API's small types,
// Engine::create, and EngineImpl's entry points (init, registration, finalize, weights in and out,
// step) and its shared helpers.
#include "zero/engine.h"

#include "cpu/simd.h"
#include "gpu/workspaces.h"
#include "store/stack.h"
#include "zero/engine_impl.h"

namespace tz::zero {

const TensorView& UnitViews::by_name(std::string_view name) const {
  for (const TensorView& v : tensors) {
    if (v.spec->name == name) return v;
  }
  TZ_ASSERT(false, "no tensor of that name in the unit");
  return tensors.front();
}

std::string_view placement_name(Placement placement) {
  switch (placement) {
    case Placement::kDevice:
      return "device";
    case Placement::kHost:
      return "host";
    case Placement::kNvme:
      return "nvme";
  }
  return "?";
}

std::string_view tensor_state_name(TensorState which) {
  switch (which) {
    case TensorState::kMaster:
      return "master";
    case TensorState::kState0:
      return "state0";
    case TensorState::kState1:
      return "state1";
  }
  return "?";
}

nlohmann::ordered_json TierBytes::to_json() const {
  nlohmann::ordered_json j;
  j["device"] = device;
  j["host"] = host;
  j["nvme"] = nvme;
  return j;
}

namespace impl {

Status EngineImpl::init() {
  stage_ = config_.zero.stage;
  if (stage_ < 0 || stage_ > 3) {
    return Status::invalid_argument("zero_optimization.stage: expected 0..3, got " +
                                    std::to_string(stage_));
  }
  if (config_.fp16.enabled && config_.bf16) {
    return Status::invalid_argument("fp16.enabled and bf16.enabled: choose one");
  }
  compute_dtype_ = config_.fp16.enabled ? DType::kF16 : config_.bf16 ? DType::kBF16 : DType::kF32;
  TZ_ASSIGN_OR_RETURN(opt_place_, parse_offload(config_.zero.offload_optimizer.device,
                                                "zero_optimization.offload_optimizer.device"));
  TZ_ASSIGN_OR_RETURN(param_place_, parse_offload(config_.zero.offload_param.device,
                                                  "zero_optimization.offload_param.device"));
  if (param_place_ != Placement::kDevice && stage_ != 3) {
    return Status::invalid_argument(
        "zero_optimization.offload_param.device: parameter offload needs "
        "zero_optimization.stage 3 (got stage " + std::to_string(stage_) + ")");
  }
  // NVMe swap paths: EngineOptions::nvme_path overrides both sections' nvme_path.
  auto add_path = [this](const std::string& p) {
    if (!p.empty() && std::find(nvme_paths_.begin(), nvme_paths_.end(), p) == nvme_paths_.end()) {
      nvme_paths_.push_back(p);
    }
  };
  if (!options_.nvme_path.empty()) {
    add_path(options_.nvme_path);
  } else {
    if (opt_place_ == Placement::kNvme) add_path(config_.zero.offload_optimizer.nvme_path);
    if (param_place_ == Placement::kNvme) add_path(config_.zero.offload_param.nvme_path);
  }
  if (opt_place_ == Placement::kNvme && nvme_paths_.empty()) {
    return Status::invalid_argument(
        "zero_optimization.offload_optimizer.nvme_path: needed with offload_optimizer.device "
        "nvme (or pass --nvme-path)");
  }
  if (param_place_ == Placement::kNvme && nvme_paths_.empty()) {
    return Status::invalid_argument(
        "zero_optimization.offload_param.nvme_path: needed with offload_param.device nvme (or "
        "pass --nvme-path)");
  }
  TZ_RETURN_IF_ERROR(init_overlap());
  grad_place_ = opt_place_ == Placement::kDevice ? Placement::kDevice : Placement::kHost;
  if (config_.gradient_accumulation_steps < 1) {
    return Status::invalid_argument("gradient_accumulation_steps: must be >= 1");
  }
  TZ_ASSIGN_OR_RETURN(spec_, cpu::spec_from_config(config_));
  states_ = cpu::state_count(spec_);
  if (opt_place_ == Placement::kDevice && spec_.state_dtype != DType::kF32) {
    return Status::invalid_argument(
        "tierzero.state_dtype: bf16 optimizer states need the CPU optimizer "
        "(zero_optimization.offload_optimizer.device cpu or nvme)");
  }
  if (opt_place_ != Placement::kDevice) {
    cpu::OptimizerOptions oo;
    oo.threads = static_cast<int>(config_.tierzero.optimizer_threads);
    // Ranks as threads of one process share the cores: binding every rank's arena to the same
    // cores would serialize them behind one another's pins.
    oo.pin_threads = comm_.backend() != "local" || world_ == 1;
    TZ_ASSIGN_OR_RETURN(cpu::CpuOptimizer opt, cpu::CpuOptimizer::create(spec_, oo));
    cpu_opt_.emplace(std::move(opt));
  }
  return Status::ok();
}

// --- Registration ----------------------------------------------------------------------------
Result<UnitId> EngineImpl::register_unit(UnitSpec spec) {
  if (finalized_) {
    return Status::invalid_argument("register_unit '" + spec.name + "': after finalize()");
  }
  if (spec.tensors.empty()) {
    return Status::invalid_argument("register_unit '" + spec.name + "': no tensors");
  }
  for (const Unit& u : units_) {
    if (u.spec.name == spec.name) {
      return Status::invalid_argument("register_unit: duplicate unit name '" + spec.name + "'");
    }
  }
  for (std::size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    bool bad = t.shape.empty();
    for (std::int64_t d : t.shape) bad = bad || d <= 0;
    if (bad) {
      return Status::invalid_argument("register_unit '" + spec.name + "': tensor '" + t.name +
                                      "' has an empty or non-positive shape");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (spec.tensors[j].name == t.name) {
        return Status::invalid_argument("register_unit '" + spec.name +
                                        "': duplicate tensor name '" + t.name + "'");
      }
    }
  }
  Unit& u = units_.emplace_back();
  u.spec = std::move(spec);
  u.layout = plan_unit_layout(u.spec, world_);
  u.opt_elems = u.frozen() ? 0 : stage_ == 0 ? u.layout.padded : u.layout.shard;
  return static_cast<UnitId>(units_.size() - 1);
}

Status EngineImpl::finalize() {
  if (finalized_) return Status::invalid_argument("finalize(): called twice");
  if (units_.empty()) return Status::invalid_argument("finalize(): no units registered");
  if (std::all_of(units_.begin(), units_.end(), [](const Unit& u) { return u.frozen(); })) {
    return Status::invalid_argument("finalize(): every registered unit is frozen (nothing to "
                                    "train; register at least one unit without UnitSpec::frozen)");
  }
  // The memory plan (zero/plan.h) is a pure function of the config, the layouts and the
  // budgets, shared with `tierzero estimate`; it sizes everything allocated below.
  std::vector<UnitLayout> layouts;
  layouts.reserve(units_.size());
  for (const Unit& u : units_) {
    layouts.push_back(u.layout);
    param_count_ += u.layout.numel;
    if (!u.spec.frozen) trainable_param_count_ += u.layout.numel;
  }
  PlanInputs in;
  in.stage = stage_;
  in.compute_dtype = compute_dtype_;
  in.optimizer = opt_place_;
  in.param = param_place_;
  in.grad = grad_place_;
  in.optimizer_states = states_;
  in.world_size = world_;
  in.activation_bytes = options_.activation_bytes;
  in.host_budget_bytes = options_.host_budget_bytes;
  in.device_budget_bytes = device_.memory_stats().budget_bytes;
  in.nvme_paths = std::max<std::size_t>(1, nvme_paths_.size());
  in.process_baseline_bytes = process_baseline_bytes();
  const gpu::DeviceWorkspaces ws =
      gpu::device_workspaces(device_, world_, comm_.backend() == "nccl");
  in.cublas_workspace_bytes = ws.cublas;
  in.nccl_buffer_bytes = ws.nccl;
  TZ_ASSIGN_OR_RETURN(MemoryPlan mp, plan_memory(in, config_, layouts));
  for (std::size_t i = 0; i < units_.size(); ++i) units_[i].persistent = mp.persistent[i];
  plan_ = mp.terms;
  process_plan_ = mp.process;
  overlap_bytes_ = mp.overlap_bytes;
  grad_place_ = mp.grad;  // NVMe when a configured host budget cannot hold the gradient shards
  const std::size_t es = dtype_size(compute_dtype_);
  const Tier opt_tier = tier_of(opt_place_);
  const Tier grad_tier = tier_of(grad_place_);
  const Tier param_tier = tier_of(param_place_);
  // The tiered stack (store/stack.h): the pool and its registration, the I/O engine chosen for
  // the swap paths, the swap space and the store.
  store::StackDescription sd;
  sd.pool = mp.pool;
  sd.store = mp.store;
  sd.io_hooks = options_.io_hooks;
  if (mp.home.nvme > 0) {
    sd.swap = store::swap_description(config_, nvme_paths_);
    sd.swap->swap.stripe_bytes = mp.swap_stripe_bytes;
    sd.swap->swap.bytes_per_path = mp.swap_bytes_per_path;
  }
  TZ_ASSIGN_OR_RETURN(store::TieredStack stack, store::build_stack(sd, device_));
  pool_ = std::move(stack.pool);
  store_ = std::move(stack.store);
  TZ_ASSIGN_OR_RETURN(stage16_, pool_->allocate(mp.stage16_bytes));
  TZ_ASSIGN_OR_RETURN(stage32_, pool_->allocate(mp.stage32_bytes));
  TZ_ASSIGN_OR_RETURN(norm_acc_, device_.allocate(sizeof(gpu::NormAccumulator)));
  TZ_ASSIGN_OR_RETURN(scalars_, device_.allocate(static_cast<std::size_t>(world_) * 2 *
                                                  kScalarPieces * sizeof(float)));

  for (Unit& u : units_) {
    const std::string base = u.spec.name + ".r" + std::to_string(rank_);
    const std::uint64_t param_bytes = (stage_ == 3 ? u.layout.shard : u.layout.padded) * es;
    TZ_ASSIGN_OR_RETURN(u.param, store_->create_block(param_bytes, param_tier, base + ".param"));
    if (u.frozen()) continue;  // parameters only: no master, states or gradient
    TZ_ASSIGN_OR_RETURN(u.master, store_->create_block(u.opt_elems * 4, opt_tier, base + ".master"));
    for (int s = 0; s < states_; ++s) {
      TZ_ASSIGN_OR_RETURN(u.state[s], store_->create_block(u.opt_elems * 4, opt_tier,
                                                           base + ".state" + std::to_string(s)));
    }
    TZ_ASSIGN_OR_RETURN(u.grad_acc,
                        store_->create_block(u.layout.shard * 4, grad_tier, base + ".grad"));
    // Blocks read as zeros until written, so parameters, states and gradients start at zero.
  }
  TZ_RETURN_IF_ERROR(finalize_overlap());
  finalized_ = true;
  return Status::ok();
}

// --- Weights in and out ------------------------------------------------------------------------
Status EngineImpl::set_tensor(UnitId id, std::size_t tensor, std::span<const float> values,
                  TensorState which) {
  TZ_RETURN_IF_ERROR(check_tensor(id, tensor, values.size(), "set_tensor"));
  return set_tensor_slice(id, tensor, 0, values, which);  // the whole tensor is one slice
}

Status EngineImpl::get_tensor(UnitId id, std::size_t tensor, std::span<float> out,
                  TensorState which) {
  TZ_RETURN_IF_ERROR(check_tensor(id, tensor, out.size(), "get_tensor"));
  // delayed: the state after the pending update (the masters and states a checkpoint saves);
  // its parameters are still published only at the next step(), so the run is unchanged.
  TZ_RETURN_IF_ERROR(wait_pending_update());
  Unit& u = units_[id];
  TZ_ASSIGN_OR_RETURN(BlockId block, state_block(u, which));
  if (u.frozen()) return get_frozen_tensor(u, tensor, out);
  const std::size_t off = u.layout.offsets[tensor];
  const std::size_t n = u.spec.tensors[tensor].numel();
  if (stage_ == 0) return read_block(block, off * 4, out.data(), n * 4);
  // All-gather the fp32 shards into a device buffer, then copy the tensor out.
  const std::size_t s = u.layout.shard;
  TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer full, allocate_device(u.layout.padded * 4));
  auto* base = full.as<std::byte>();
  TZ_RETURN_IF_ERROR(read_block_to_device(block, 0, base + static_cast<std::size_t>(rank_) * s * 4,
                                          s * 4));
  gpu::Stream& st = device_.compute_stream();
  TZ_RETURN_IF_ERROR(comm_.all_gather(base + static_cast<std::size_t>(rank_) * s * 4, base, s,
                                      DType::kF32, st));
  TZ_RETURN_IF_ERROR(device_.copy_async(out.data(), base + off * 4, n * 4,
                                        gpu::CopyKind::kDeviceToHost, st));
  TZ_RETURN_IF_ERROR(sync(st, "get_tensor '" + u.spec.name + "'"));
  return Status::ok();
}

// A frozen unit's parameters: the full block (stages 0-2) or every rank's shard all-gathered
// (stage 3), in the compute dtype, widened to fp32.
Status EngineImpl::get_frozen_tensor(Unit& u, std::size_t tensor, std::span<float> out) {
  const std::size_t es = dtype_size(compute_dtype_);
  const std::size_t off = u.layout.offsets[tensor];
  const std::size_t n = u.spec.tensors[tensor].numel();
  std::vector<std::byte> raw(n * es);
  if (stage_ < 3) {
    TZ_RETURN_IF_ERROR(read_block(u.param, off * es, raw.data(), n * es));
  } else {
    const std::size_t s = u.layout.shard;
    TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer full, allocate_device(u.layout.padded * es));
    auto* base = full.as<std::byte>();
    std::byte* mine = base + static_cast<std::size_t>(rank_) * s * es;
    TZ_RETURN_IF_ERROR(read_block_to_device(u.param, 0, mine, s * es));
    gpu::Stream& st = device_.compute_stream();
    TZ_RETURN_IF_ERROR(comm_.all_gather(mine, base, s, compute_dtype_, st));
    TZ_RETURN_IF_ERROR(device_.copy_async(raw.data(), base + off * es, n * es,
                                          gpu::CopyKind::kDeviceToHost, st));
    TZ_RETURN_IF_ERROR(sync(st, "get_tensor '" + u.spec.name + "'"));
  }
  if (compute_dtype_ == DType::kF32) {
    std::memcpy(out.data(), raw.data(), n * 4);
  } else {
    cpu::convert_16_to_f32(raw.data(), compute_dtype_, out.data(), n);
  }
  return Status::ok();
}

nlohmann::ordered_json EngineImpl::scalar_state() const {
  nlohmann::ordered_json j;
  j["steps_done"] = steps_done_;
  j["updates_done"] = updates_done_;
  j["loss_scaler"] = scaler_.state();
  return j;
}

Status EngineImpl::restore_scalar_state(const nlohmann::json& state) {
  if (steps_done_ != 0) {
    return Status::invalid_argument("restore_scalar_state: only before the first step");
  }
  if (!state.is_object() || !state.contains("steps_done") || !state.contains("updates_done") ||
      !state.contains("loss_scaler")) {
    return Status::invalid_argument(
        "restore_scalar_state: expected an object with steps_done, updates_done, loss_scaler");
  }
  TZ_RETURN_IF_ERROR(scaler_.restore(state["loss_scaler"]));
  steps_done_ = state["steps_done"].get<std::int64_t>();
  updates_done_ = state["updates_done"].get<std::int64_t>();
  return Status::ok();
}

Result<StepReport> EngineImpl::step() {
  if (!finalized_) return Status::invalid_argument("step(): before finalize()");
  const int k = gradient_accumulation_steps();
  TZ_RETURN_IF_ERROR(check_step_ready(k));
  TZ_RETURN_IF_ERROR(flush_frozen_loads());
  const auto t_opt = Clock::now();
  StepReport report;
  report.loss_scale = scaler_.scale();
  gpu::Stream& st = device_.compute_stream();
  // delayed: the previous step's update ran during this step's forward and backward; its
  // parameters become the ones the next forward sees.
  TZ_RETURN_IF_ERROR(publish_pending_update());

  // Global norm and overflow flag from every rank's reduced shards, in unit order.
  TZ_ASSIGN_OR_RETURN(gpu::NormAccumulator local, local_norm());
  TZ_ASSIGN_OR_RETURN(gpu::NormAccumulator total, all_reduce_norm(local));
  StepInputs in;
  in.sum_squares = total.sum_squares;
  in.nonfinite_count = total.nonfinite_count;
  in.loss_scale = report.loss_scale;
  in.world_size = world_;
  in.accumulation_steps = k;
  in.max_norm = config_.gradient_clipping;
  in.overlap = overlap_;
  const StepDecision decision = decide_step(in);
  const bool overflow = decision.skip;
  report.grad_norm = decision.grad_norm;
  // DeepSpeed steps the schedule only after an applied update.
  report.lr = scheduled_lr(config_.scheduler, spec_.lr,
                           config_.scheduler.last_batch_iteration + updates_done_);
  report.skipped = overflow;
  report.rolled_back = decision.roll_back;
  scaler_.update(overflow);
  if (decision.roll_back) TZ_RETURN_IF_ERROR(roll_back_early_updates(overflow));
  TZ_RETURN_IF_ERROR(apply_update(decision));
  if (overflow) {
    TZ_LOG_WARN("step %lld: Inf/NaN in the gradient on some rank; update skipped (loss scale %g "
                "-> %g)", static_cast<long long>(steps_done_ + 1), report.loss_scale,
                scaler_.scale());
  }
  // Persistent stage-3 units are gathered again once per step, skipped steps too, so every
  // step moves the same bytes (comm_formula).
  for (Unit& u : units_) u.persistent_valid = false;
  TZ_RETURN_IF_ERROR(zero_gradients());
  TZ_RETURN_IF_ERROR(sync(st, "step"));
  reap_deferred(true);
  for (Unit& u : units_) {
    u.reduces = 0;
    u.updated_early = false;
  }
  eager_args_.reset();
  store_->mark_step();
  ++steps_done_;
  close_step_report(report, t_opt);
  return report;
}

// step()'s preconditions: every unit reduced k times since the last step, none still gathered or
// holding a gradient buffer.
Status EngineImpl::check_step_ready(int k) const {
  TZ_ASSERT(finalized_, "check_step_ready before finalize");
  for (const Unit& u : units_) {
    if (u.reduces != (u.frozen() ? 0 : k)) {
      return Status::invalid_argument(
          "step(): unit '" + u.spec.name + "' was reduced " + std::to_string(u.reduces) +
          " times since the last step on rank " + std::to_string(rank_) + ", expected " +
          std::to_string(k) + " (gradient_accumulation_steps)");
    }
    if (u.gather_refs != 0 || !u.grad_buffer.empty()) {
      return Status::invalid_argument("step(): unit '" + u.spec.name +
                                      "' is still gathered or holds a gradient buffer");
    }
  }
  return Status::ok();
}

int EngineImpl::gradient_accumulation_steps() const {
  return static_cast<int>(config_.gradient_accumulation_steps);
}

const UnitSpec& EngineImpl::unit_spec(UnitId unit) const {
  TZ_ASSERT(unit < units_.size(), "unit_spec: unknown unit id");
  return units_[unit].spec;
}

const UnitLayout& EngineImpl::layout(UnitId unit) const {
  TZ_ASSERT(unit < units_.size(), "layout: unknown unit id");
  return units_[unit].layout;
}

Status EngineImpl::check_unit(UnitId id, const char* what) const {
  if (!finalized_) return Status::invalid_argument(std::string(what) + ": before finalize()");
  if (id >= units_.size()) {
    return Status::invalid_argument(std::string(what) + ": unknown unit id " +
                                    std::to_string(id));
  }
  return Status::ok();
}

Status EngineImpl::check_tensor(UnitId id, std::size_t tensor, std::size_t n, const char* what) const {
  TZ_RETURN_IF_ERROR(check_unit(id, what));
  const Unit& u = units_[id];
  if (tensor >= u.spec.tensors.size()) {
    return Status::invalid_argument(std::string(what) + " '" + u.spec.name +
                                    "': no tensor " + std::to_string(tensor));
  }
  if (n != u.spec.tensors[tensor].numel()) {
    return Status::invalid_argument(std::string(what) + " '" + u.spec.name + "." +
                                    u.spec.tensors[tensor].name + "': expected " +
                                    std::to_string(u.spec.tensors[tensor].numel()) +
                                    " values, got " + std::to_string(n));
  }
  return Status::ok();
}

Status EngineImpl::check_trainable(const Unit& u, const char* what) const {
  if (!u.frozen()) return Status::ok();
  return Status::invalid_argument(std::string(what) + " '" + u.spec.name +
                                  "': the unit is frozen (registered without gradients or "
                                  "optimizer state)");
}

// The block of `which` for a trainable unit; a frozen unit's kMaster is its parameter block
// (get_frozen_tensor reads it), its optimizer states are kInvalidArgument.
Result<BlockId> EngineImpl::state_block(const Unit& u, TensorState which) const {
  if (u.frozen()) {
    if (which == TensorState::kMaster) return u.param;
    return check_trainable(u, ("tensor state " + std::string(tensor_state_name(which))).c_str());
  }
  switch (which) {
    case TensorState::kMaster:
      return u.master;
    case TensorState::kState0:
      if (states_ >= 1) return u.state[0];
      break;
    case TensorState::kState1:
      if (states_ >= 2) return u.state[1];
      break;
  }
  return Status::invalid_argument("tensor state " + std::string(tensor_state_name(which)) +
                                  ": the optimizer " + config_.optimizer.type + " keeps " +
                                  std::to_string(states_) + " state arrays");
}

// Prefixes an error with the unit and rank.
Status EngineImpl::with_unit(const Unit& u, const char* what, Status s) const {
  if (s.is_ok()) return s;
  return std::move(s).with_context("unit '" + u.spec.name + "' shard " + std::to_string(rank_) +
                                   " of " + std::to_string(world_) + " (rank " +
                                   std::to_string(rank_) + "), " + what);
}

Status EngineImpl::sync(gpu::Stream& st, const std::string& what) {
  Status s = st.synchronize();
  if (s.is_ok()) s = comm_.async_error();
  if (s.is_ok()) return s;
  return std::move(s).with_context(what + " on rank " + std::to_string(rank_));
}

// Host bytes into a block at `offset`, in its home tier (device blocks through a copy).
Status EngineImpl::write_block(BlockId block, std::size_t offset, const void* src, std::size_t bytes) {
  return host_block_copy(block, offset, src, nullptr, bytes);
}

Status EngineImpl::read_block(BlockId block, std::size_t offset, void* dst, std::size_t bytes) {
  return host_block_copy(block, offset, nullptr, dst, bytes);
}

// One copy between host memory and a block in its home tier: from `src` into the block when it
// is set, else out of the block into `dst`. Synchronous.
Status EngineImpl::host_block_copy(BlockId block, std::size_t offset, const void* src, void* dst,
                                   std::size_t bytes) {
  const bool into = src != nullptr;
  const Tier pin_tier = home_tier(block) == Tier::kDevice ? Tier::kDevice : Tier::kHost;
  TZ_ASSIGN_OR_RETURN(Lease l,
                      store_->pin(block, pin_tier, into ? Access::kReadWrite : Access::kRead));
  TZ_RETURN_IF_ERROR(l.wait());
  std::byte* at = static_cast<std::byte*>(l.data()) + offset;
  if (pin_tier == Tier::kHost) {
    std::memcpy(into ? at : dst, into ? src : at, bytes);
  } else {
    gpu::Stream& st = device_.compute_stream();
    TZ_RETURN_IF_ERROR(device_.copy_async(
        into ? at : dst, into ? src : at, bytes,
        into ? gpu::CopyKind::kHostToDevice : gpu::CopyKind::kDeviceToHost, st));
    TZ_RETURN_IF_ERROR(sync(st, into ? "write_block" : "read_block"));
  }
  l.release();
  return Status::ok();
}

// A block's bytes into device memory (synchronously complete on return).
Status EngineImpl::read_block_to_device(BlockId block, std::size_t offset, void* dst, std::size_t bytes) {
  const Tier tier = home_tier(block);
  const Tier pin_tier = tier == Tier::kDevice ? Tier::kDevice : Tier::kHost;
  TZ_ASSIGN_OR_RETURN(Lease l, store_->pin(block, pin_tier, Access::kRead));
  TZ_RETURN_IF_ERROR(l.wait());
  const auto* src = static_cast<const std::byte*>(l.data()) + offset;
  gpu::Stream& st = device_.compute_stream();
  TZ_RETURN_IF_ERROR(device_.copy_async(
      dst, src, bytes,
      pin_tier == Tier::kHost ? gpu::CopyKind::kHostToDevice : gpu::CopyKind::kDeviceToDevice,
      st));
  TZ_RETURN_IF_ERROR(sync(st, "read_block"));
  l.release();
  return Status::ok();
}

Tier EngineImpl::home_tier(BlockId block) const {
  // Blocks are created per unit in a fixed pattern; the homes follow from the placements.
  for (const Unit& u : units_) {
    if (block == u.param) return tier_of(param_place_);
    if (u.frozen()) continue;
    if (block == u.grad_acc) return tier_of(grad_place_);
    if (block == u.master || (states_ >= 1 && block == u.state[0]) ||
        (states_ >= 2 && block == u.state[1])) {
      return tier_of(opt_place_);
    }
  }
  TZ_ASSERT(false, "unknown block");
  return Tier::kHost;
}

}  // namespace impl

Result<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options, gpu::Device& device,
                                               comm::Comm& comm) {
  (void)process_baseline_bytes();  // the process's memory before any engine holds some
  auto engine = std::make_unique<impl::EngineImpl>(options, device, comm);
  TZ_RETURN_IF_ERROR(engine->init());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace tz::zero
