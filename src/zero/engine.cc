// The ZeRO engine (engine.h): one rank's units, their shards as blocks of the tiered store, the
// gather/grad/reduce protocol of a micro-batch and the optimizer step of stages 0-3 with the
// optimizer on the device, the CPU or streamed from NVMe. docs/zero.md describes the design;
// engine_impl.h lists the component classes EngineImpl composes and their files. This file: the
// model API's small types, Engine::create, and EngineImpl's entry points (init, registration,
// finalize, weights in and out, the micro-batch calls, step, params_xxh3) and its block helpers.
#include "zero/engine.h"

#include <algorithm>

#include "core/host_probe.h"
#include "core/log.h"
#include "core/xxhash.h"
#include "cpu/simd.h"
#include "gpu/workspaces.h"
#include "store/stack.h"
#include "zero/engine_impl.h"
#include "zero/schedule.h"

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

nlohmann::ordered_json BoundTerms::to_json() const {
  auto seconds = [](double v) { return v < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(v); };
  nlohmann::ordered_json j;
  j["compute"] = seconds(compute_s);
  j["optimizer"] = seconds(optimizer_s);
  j["shared_busy"] = seconds(shared_busy_s);
  j["nvme"] = seconds(nvme_s);
  j["copy"] = seconds(copy_s);
  return j;
}

namespace impl {

Status EngineImpl::init() {
  TZ_ASSERT(!finalized_ && !overlap_, "init once, before finalize");
  ctx_.stage = config_.zero.stage;
  if (ctx_.stage < 0 || ctx_.stage > 3) {
    return Status::invalid_argument("zero_optimization.stage: expected 0..3, got " +
                                    std::to_string(ctx_.stage));
  }
  if (config_.fp16.enabled && config_.bf16) {
    return Status::invalid_argument("fp16.enabled and bf16.enabled: choose one");
  }
  ctx_.compute_dtype = config_.fp16.enabled ? DType::kF16
                       : config_.bf16       ? DType::kBF16
                                            : DType::kF32;
  TZ_RETURN_IF_ERROR(init_placements());
  TZ_ASSIGN_OR_RETURN(const Overlap overlap,
                      overlap_from_config(config_, ctx_.opt_place, ctx_.stage));
  overlap_ = OverlapMode::create(overlap, OverlapDeps{ctx_, driver_, coordinator_});
  ctx_.grad_place = ctx_.opt_place == Placement::kDevice ? Placement::kDevice : Placement::kHost;
  if (config_.gradient_accumulation_steps < 1) {
    return Status::invalid_argument("gradient_accumulation_steps: must be >= 1");
  }
  return driver_.init();
}

// The optimizer's and the parameters' placements and the NVMe swap paths.
Status EngineImpl::init_placements() {
  TZ_ASSIGN_OR_RETURN(ctx_.opt_place, parse_offload(config_.zero.offload_optimizer.device,
                                                    "zero_optimization.offload_optimizer.device"));
  TZ_ASSIGN_OR_RETURN(ctx_.param_place, parse_offload(config_.zero.offload_param.device,
                                                      "zero_optimization.offload_param.device"));
  if (ctx_.param_place != Placement::kDevice && ctx_.stage != 3) {
    return Status::invalid_argument(
        "zero_optimization.offload_param.device: parameter offload needs "
        "zero_optimization.stage 3 (got stage " +
        std::to_string(ctx_.stage) + ")");
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
    if (ctx_.opt_place == Placement::kNvme) add_path(config_.zero.offload_optimizer.nvme_path);
    if (ctx_.param_place == Placement::kNvme) add_path(config_.zero.offload_param.nvme_path);
  }
  if (ctx_.opt_place == Placement::kNvme && nvme_paths_.empty()) {
    return Status::invalid_argument(
        "zero_optimization.offload_optimizer.nvme_path: needed with offload_optimizer.device "
        "nvme (or pass --nvme-path)");
  }
  if (ctx_.param_place == Placement::kNvme && nvme_paths_.empty()) {
    return Status::invalid_argument(
        "zero_optimization.offload_param.nvme_path: needed with offload_param.device nvme (or "
        "pass --nvme-path)");
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
  for (const Unit& u : ctx_.units) {
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
  Unit& u = ctx_.units.emplace_back();
  u.id = static_cast<UnitId>(ctx_.units.size() - 1);
  u.spec = std::move(spec);
  u.layout = plan_unit_layout(u.spec, ctx_.world);
  u.opt_elems = u.frozen() ? 0 : ctx_.stage == 0 ? u.layout.padded : u.layout.shard;
  return u.id;
}

Status EngineImpl::finalize() {
  if (finalized_) return Status::invalid_argument("finalize(): called twice");
  if (ctx_.units.empty()) return Status::invalid_argument("finalize(): no units registered");
  if (std::all_of(ctx_.units.begin(), ctx_.units.end(), [](const Unit& u) { return u.frozen(); })) {
    return Status::invalid_argument("finalize(): every registered unit is frozen (nothing to "
                                    "train; register at least one unit without UnitSpec::frozen)");
  }
  TZ_ASSERT(overlap_ != nullptr && ctx_.store == nullptr, "finalize after init, once");
  // The memory plan (zero/plan.h) is a pure function of the config, the layouts and the
  // budgets, shared with `tierzero estimate`; it sizes everything allocated below.
  std::vector<UnitLayout> layouts;
  layouts.reserve(ctx_.units.size());
  for (const Unit& u : ctx_.units) layouts.push_back(u.layout);
  PlanInputs in;
  in.stage = ctx_.stage;
  in.compute_dtype = ctx_.compute_dtype;
  in.optimizer = ctx_.opt_place;
  in.param = ctx_.param_place;
  in.grad = ctx_.grad_place;
  in.optimizer_states = ctx_.states;
  in.world_size = ctx_.world;
  in.activation_bytes = options_.activation_bytes;
  in.host_budget_bytes = options_.host_budget_bytes;
  in.device_budget_bytes = ctx_.device.memory_stats().budget_bytes;
  in.nvme_paths = std::max<std::size_t>(1, nvme_paths_.size());
  in.process_baseline_bytes = process_baseline_bytes();
  if (options_.probe_host_bytes) {
    in.probe_host_bytes = options_.probe_host_bytes(ctx_.device.host_accessible());
  }
  const gpu::DeviceWorkspaces ws =
      gpu::device_workspaces(ctx_.device, ctx_.world, ctx_.comm.backend() == "nccl");
  in.cublas_workspace_bytes = ws.cublas;
  in.nccl_buffer_bytes = ws.nccl;
  TZ_ASSIGN_OR_RETURN(MemoryPlan mp, plan_memory(in, config_, layouts));
  for (std::size_t i = 0; i < ctx_.units.size(); ++i) ctx_.units[i].persistent = mp.persistent[i];
  accounting_.set_plan(mp);
  ctx_.grad_place = mp.grad;  // NVMe when a configured host budget cannot hold the gradient shards
  ctx_.grad_dtype = mp.grad_dtype;
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
  TZ_ASSIGN_OR_RETURN(store::TieredStack stack, store::build_stack(sd, ctx_.device));
  pool_ = std::move(stack.pool);
  store_ = std::move(stack.store);
  ctx_.store = store_.get();
  ctx_.buffers.set_limits(store_.get(), accounting_.tier_plan(Tier::kDevice));
  TZ_ASSIGN_OR_RETURN(ctx_.stage16, pool_->allocate(mp.stage16_bytes));
  TZ_ASSIGN_OR_RETURN(ctx_.stage32, pool_->allocate(mp.stage32_bytes));
  coordinator_.finalize();
  TZ_RETURN_IF_ERROR(reducer_.finalize());
  TZ_RETURN_IF_ERROR(create_blocks());
  TZ_RETURN_IF_ERROR(overlap_->finalize(mp.overlap_bytes, mp.overlap_pool));
  accounting_.set_pools(pool_.get(), overlap_->pool());
  if (mp.home.nvme > 0) accounting_.set_disks(swap_devices());
  finalized_ = true;
  return Status::ok();
}

// The block devices under the NVMe swap paths, each once, for the step report's `disks`; a path
// on no block device (tmpfs, overlayfs) has none and is left out.
std::vector<std::string> EngineImpl::swap_devices() const {
  std::vector<std::string> devices;
  for (const std::string& p : nvme_paths_) {
    Result<std::string> d = block_device_of(p);
    if (!d.is_ok()) {
      TZ_LOG_DEBUG("swap path %s: %s", p.c_str(), d.status().to_string().c_str());
      continue;
    }
    if (std::find(devices.begin(), devices.end(), *d) == devices.end()) devices.push_back(*d);
  }
  return devices;
}

// Every unit's blocks in the store, homed where the placements say. Blocks read as zeros until
// written, so parameters, states and gradients start at zero.
Status EngineImpl::create_blocks() {
  const Tier opt_tier = tier_of(ctx_.opt_place);
  const Tier grad_tier = tier_of(ctx_.grad_place);
  const Tier param_tier = tier_of(ctx_.param_place);
  for (Unit& u : ctx_.units) {
    const std::string base = u.spec.name + ".r" + std::to_string(ctx_.rank);
    TZ_ASSIGN_OR_RETURN(u.param,
                        store_->create_block(ctx_.param_bytes(u), param_tier, base + ".param"));
    if (u.frozen()) continue;  // parameters only: no master, states or gradient
    TZ_ASSIGN_OR_RETURN(u.master,
                        store_->create_block(u.opt_elems * 4, opt_tier, base + ".master"));
    for (int s = 0; s < ctx_.states; ++s) {
      TZ_ASSIGN_OR_RETURN(u.state[s], store_->create_block(u.opt_elems * 4, opt_tier,
                                                           base + ".state" + std::to_string(s)));
    }
    TZ_ASSIGN_OR_RETURN(u.grad_acc,
                        store_->create_block(ctx_.grad_bytes(u), grad_tier, base + ".grad"));
  }
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
  TZ_RETURN_IF_ERROR(overlap_->wait());
  Unit& u = ctx_.units[id];
  TZ_ASSIGN_OR_RETURN(BlockId block, state_block(u, which));
  TZ_RETURN_IF_ERROR(read_ahead_after(id, which));
  if (u.frozen()) return get_frozen_tensor(u, tensor, out);
  const std::size_t off = u.layout.offsets[tensor];
  const std::size_t n = u.spec.tensors[tensor].numel();
  if (ctx_.stage == 0) {
    return ctx_.with_unit(u, "get_tensor", read_block(block, off * 4, out.data(), n * 4));
  }
  return gather_range(u, block, DType::kF32, off, n, out.data(), "get_tensor");
}

// A sharded block (masters and states from stage 1, parameters at stage 3): every rank puts the
// same window of its shard into the all-gather, the smallest that covers its part of
// [off, off + n) on each rank holding some of it. A tensor inside one shard moves world x its own
// size; one rank reads only the tensor, with no device hop. Gathering whole shards moved the whole
// unit for each of its tensors: a checkpoint or the final hash copied each unit once per tensor.
Status EngineImpl::gather_range(const Unit& u, BlockId block, DType dtype, std::size_t off,
                                std::size_t n, void* out, const char* what) {
  const std::size_t es = dtype_size(dtype);
  const std::size_t s = u.layout.shard;
  TZ_ASSERT(n > 0 && off + n <= s * static_cast<std::size_t>(ctx_.world),
            "gather_range outside the unit");
  // One rank holds the whole unit: the range straight out of its block, as at stage 0.
  if (ctx_.world == 1) return ctx_.with_unit(u, what, read_block(block, off * es, out, n * es));
  const std::size_t first = off / s;
  const std::size_t last = (off + n - 1) / s;
  std::size_t win_lo = s;
  std::size_t win_hi = 0;
  for (std::size_t r = first; r <= last; ++r) {
    win_lo = std::min(win_lo, std::max(off, r * s) - r * s);
    win_hi = std::max(win_hi, std::min(off + n, (r + 1) * s) - r * s);
  }
  const std::size_t win = win_hi - win_lo;
  const auto rank = static_cast<std::size_t>(ctx_.rank);
  TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer gathered,
                      ctx_.buffers.allocate(static_cast<std::size_t>(ctx_.world) * win * es));
  auto* base = gathered.as<std::byte>();
  TZ_RETURN_IF_ERROR(ctx_.with_unit(
      u, what, read_block_to_device(block, win_lo * es, base + rank * win * es, win * es)));
  gpu::Stream& st = ctx_.stream();
  TZ_RETURN_IF_ERROR(ctx_.comm.all_gather(base + rank * win * es, base, win, dtype, st));
  for (std::size_t r = first; r <= last; ++r) {
    const std::size_t lo = std::max(off, r * s);
    const std::size_t hi = std::min(off + n, (r + 1) * s);
    TZ_RETURN_IF_ERROR(ctx_.device.copy_async(static_cast<std::byte*>(out) + (lo - off) * es,
                                              base + (r * win + lo - r * s - win_lo) * es,
                                              (hi - lo) * es, gpu::CopyKind::kDeviceToHost, st));
  }
  return ctx_.sync(st, std::string(what) + " '" + u.spec.name + "'");
}

// Readers of tensors (checkpoints, the final hash, weight saves) walk the units in order: the
// same block of the next unit of the same kind starts loading into the host tier while this
// one's tensors are read, so its NVMe read overlaps their copies and the reader's writes.
Status EngineImpl::read_ahead_after(UnitId id, TensorState which) {
  const bool frozen = ctx_.units[id].frozen();
  for (UnitId next = id + 1; next < ctx_.units.size(); ++next) {
    const Unit& n = ctx_.units[next];
    if (n.frozen() != frozen) continue;
    TZ_ASSIGN_OR_RETURN(const BlockId block, state_block(n, which));
    if (home_tier(block) != Tier::kNvme) return Status::ok();
    return store_->prefetch(block, Tier::kHost);
  }
  return Status::ok();
}

// A frozen unit's parameters: the full block (stages 0-2) or every rank's shard all-gathered
// (stage 3), in the compute dtype, widened to fp32.
Status EngineImpl::get_frozen_tensor(Unit& u, std::size_t tensor, std::span<float> out) {
  const std::size_t es = dtype_size(ctx_.compute_dtype);
  const std::size_t off = u.layout.offsets[tensor];
  const std::size_t n = u.spec.tensors[tensor].numel();
  std::vector<std::byte> raw(n * es);
  if (ctx_.stage < 3) {
    TZ_RETURN_IF_ERROR(read_block(u.param, off * es, raw.data(), n * es));
  } else {
    TZ_RETURN_IF_ERROR(
        gather_range(u, u.param, ctx_.compute_dtype, off, n, raw.data(), "get_tensor"));
  }
  if (ctx_.compute_dtype == DType::kF32) {
    std::memcpy(out.data(), raw.data(), n * 4);
  } else {
    cpu::convert_16_to_f32(raw.data(), ctx_.compute_dtype, out.data(), n);
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
  // delayed: the previous step's update ran during this step's forward and backward; its
  // parameters become the ones the next forward sees (streamed exact: it has finished).
  TZ_RETURN_IF_ERROR(overlap_->publish());

  // Global norm and overflow flag from every rank's reduced shards, in unit order.
  TZ_ASSIGN_OR_RETURN(gpu::NormAccumulator total, reducer_.global_norm());
  StepInputs in;
  in.sum_squares = total.sum_squares;
  in.nonfinite_count = total.nonfinite_count;
  in.loss_scale = report.loss_scale;
  in.world_size = ctx_.world;
  in.accumulation_steps = k;
  in.max_norm = config_.gradient_clipping;
  in.overlap = overlap_->kind();
  const StepDecision decision = decide_step(in);
  const bool overflow = decision.skip;
  report.grad_norm = decision.grad_norm;
  // DeepSpeed steps the schedule only after an applied update.
  report.lr = scheduled_lr(config_.scheduler, driver_.spec().lr,
                           config_.scheduler.last_batch_iteration + updates_done_);
  report.skipped = overflow;
  report.rolled_back = decision.roll_back;
  scaler_.update(overflow);
  // The mode rolls back eager's early updates when the decision says so, then runs the update.
  if (decision.counts_update()) ++updates_done_;
  TZ_RETURN_IF_ERROR(overlap_->apply(decision, steps_done_ + 1, updates_done_));
  if (overflow) {
    TZ_LOG_WARN("step %lld: Inf/NaN in the gradient on some rank; update skipped (loss scale %g "
                "-> %g)", static_cast<long long>(steps_done_ + 1), report.loss_scale,
                scaler_.scale());
  }
  // Persistent stage-3 units are gathered again once per step, skipped steps too, so every
  // step moves the same bytes (comm_formula).
  coordinator_.invalidate_all();
  // A streamed update zeroes each accumulator once it has read it.
  if (!overlap_->update_pending()) TZ_RETURN_IF_ERROR(reducer_.zero_gradients());
  TZ_RETURN_IF_ERROR(ctx_.sync(ctx_.stream(), "step"));
  ctx_.buffers.reap(true);
  reducer_.finish_step();
  overlap_->finish_step();
  report.trace_followed = store_->following_trace();
  store_->mark_step();
  ++steps_done_;
  accounting_.close_step_report(report, t_opt, steps_done_);
  return report;
}

// step()'s preconditions: every unit reduced k times since the last step, none still gathered or
// holding a gradient buffer.
Status EngineImpl::check_step_ready(int k) const {
  TZ_ASSERT(finalized_, "check_step_ready before finalize");
  for (const Unit& u : ctx_.units) {
    const int reduces = reducer_.reduces(u.id);
    if (reduces != (u.frozen() ? 0 : k)) {
      return Status::invalid_argument(
          "step(): unit '" + u.spec.name + "' was reduced " + std::to_string(reduces) +
          " times since the last step on rank " + std::to_string(ctx_.rank) + ", expected " +
          std::to_string(k) + " (gradient_accumulation_steps)");
    }
    if (coordinator_.gathered(u.id) || reducer_.holds_buffer(u.id)) {
      return Status::invalid_argument("step(): unit '" + u.spec.name +
                                      "' is still gathered or holds a gradient buffer");
    }
  }
  return Status::ok();
}

const UnitSpec& EngineImpl::unit_spec(UnitId unit) const {
  TZ_ASSERT(unit < ctx_.units.size(), "unit_spec: unknown unit id");
  return ctx_.units[unit].spec;
}

const UnitLayout& EngineImpl::layout(UnitId unit) const {
  TZ_ASSERT(unit < ctx_.units.size(), "layout: unknown unit id");
  return ctx_.units[unit].layout;
}

Status EngineImpl::check_unit(UnitId id, const char* what) const {
  if (!finalized_) return Status::invalid_argument(std::string(what) + ": before finalize()");
  if (id >= ctx_.units.size()) {
    return Status::invalid_argument(std::string(what) + ": unknown unit id " +
                                    std::to_string(id));
  }
  return Status::ok();
}

Status EngineImpl::check_tensor(UnitId id, std::size_t tensor, std::size_t n, const char* what) const {
  TZ_RETURN_IF_ERROR(check_unit(id, what));
  const Unit& u = ctx_.units[id];
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
      if (ctx_.states >= 1) return u.state[0];
      break;
    case TensorState::kState1:
      if (ctx_.states >= 2) return u.state[1];
      break;
  }
  return Status::invalid_argument("tensor state " + std::string(tensor_state_name(which)) +
                                  ": the optimizer " + config_.optimizer.type + " keeps " +
                                  std::to_string(ctx_.states) + " state arrays");
}

// One copy between host memory and a block in its home tier: from `src` into the block when it
// is set, else out of the block into `dst`. Synchronous. Tensor access (set_tensor, get_tensor,
// checkpoints) comes between steps in no repeating order: its pins stay out of the store's trace,
// which the next step would otherwise leave at its first pin.
Status EngineImpl::host_block_copy(BlockId block, std::size_t offset, const void* src, void* dst,
                                   std::size_t bytes) {
  const store::UntracedPins untraced;
  const bool into = src != nullptr;
  const Tier pin_tier = home_tier(block) == Tier::kDevice ? Tier::kDevice : Tier::kHost;
  TZ_ASSIGN_OR_RETURN(Lease l,
                      store_->pin(block, pin_tier, into ? Access::kReadWrite : Access::kRead));
  TZ_RETURN_IF_ERROR(l.wait());
  std::byte* at = static_cast<std::byte*>(l.data()) + offset;
  if (pin_tier == Tier::kHost) {
    std::memcpy(into ? at : dst, into ? src : at, bytes);
  } else {
    gpu::Stream& st = ctx_.stream();
    TZ_RETURN_IF_ERROR(ctx_.device.copy_async(
        into ? at : dst, into ? src : at, bytes,
        into ? gpu::CopyKind::kHostToDevice : gpu::CopyKind::kDeviceToHost, st));
    TZ_RETURN_IF_ERROR(ctx_.sync(st, into ? "write_block" : "read_block"));
  }
  l.release();
  return Status::ok();
}

// A block's bytes into device memory (synchronously complete on return); untraced as
// host_block_copy.
Status EngineImpl::read_block_to_device(BlockId block, std::size_t offset, void* dst, std::size_t bytes) {
  const store::UntracedPins untraced;
  const Tier tier = home_tier(block);
  const Tier pin_tier = tier == Tier::kDevice ? Tier::kDevice : Tier::kHost;
  TZ_ASSIGN_OR_RETURN(Lease l, store_->pin(block, pin_tier, Access::kRead));
  TZ_RETURN_IF_ERROR(l.wait());
  const auto* src = static_cast<const std::byte*>(l.data()) + offset;
  gpu::Stream& st = ctx_.stream();
  TZ_RETURN_IF_ERROR(ctx_.device.copy_async(
      dst, src, bytes,
      pin_tier == Tier::kHost ? gpu::CopyKind::kHostToDevice : gpu::CopyKind::kDeviceToDevice, st));
  TZ_RETURN_IF_ERROR(ctx_.sync(st, "read_block"));
  l.release();
  return Status::ok();
}

Tier EngineImpl::home_tier(BlockId block) const {
  // Blocks are created per unit in a fixed pattern; the homes follow from the placements.
  for (const Unit& u : ctx_.units) {
    if (block == u.param) return tier_of(ctx_.param_place);
    if (u.frozen()) continue;
    if (block == u.grad_acc) return tier_of(ctx_.grad_place);
    if (block == u.master || (ctx_.states >= 1 && block == u.state[0]) ||
        (ctx_.states >= 2 && block == u.state[1])) {
      return tier_of(ctx_.opt_place);
    }
  }
  TZ_ASSERT(false, "unknown block");
  return Tier::kHost;
}

// --- One micro-batch: checks and the step's window here, the work in the components ----------
Result<UnitViews> EngineImpl::gather(UnitId id) {
  TZ_RETURN_IF_ERROR(check_unit(id, "gather"));
  if (coordinator_.gathered(id)) return coordinator_.add_ref(id);
  TZ_RETURN_IF_ERROR(flush_frozen_loads());
  accounting_.open_step();
  // A streamed update of the previous step may still be writing this unit's parameters.
  TZ_RETURN_IF_ERROR(overlap_->wait_unit(ctx_.unit(id)));
  return coordinator_.gather(ctx_.unit(id));
}

Status EngineImpl::release(UnitId id) {
  TZ_RETURN_IF_ERROR(check_unit(id, "release"));
  Unit& u = ctx_.unit(id);
  if (!coordinator_.gathered(id)) {
    return Status::invalid_argument("release '" + u.spec.name + "': not gathered");
  }
  return coordinator_.release(u);
}

Result<UnitViews> EngineImpl::grad(UnitId id) {
  TZ_RETURN_IF_ERROR(check_unit(id, "grad"));
  Unit& u = ctx_.unit(id);
  TZ_RETURN_IF_ERROR(check_trainable(u, "grad"));
  if (reducer_.holds_buffer(id)) return reducer_.buffer_views(id);
  TZ_RETURN_IF_ERROR(flush_frozen_loads());
  accounting_.open_step();
  TZ_RETURN_IF_ERROR(overlap_->wait_unit(u));  // its accumulator is zeroed by that update
  return reducer_.grad(u);
}

// The reducer's work, then the overlap mode's once the unit's last micro-batch is in (eager
// updates it now).
Status EngineImpl::reduce(UnitId id) {
  TZ_RETURN_IF_ERROR(check_unit(id, "reduce"));
  Unit& u = ctx_.unit(id);
  TZ_RETURN_IF_ERROR(check_trainable(u, "reduce"));
  if (!reducer_.holds_buffer(id)) {
    return Status::invalid_argument("reduce '" + u.spec.name + "': no grad() buffer handed out");
  }
  TZ_ASSIGN_OR_RETURN(const bool last, reducer_.reduce(u));
  if (!last) return Status::ok();
  return overlap_->on_reduced(u, scaler_.scale(), updates_done_ + 1);
}

Status EngineImpl::flush_frozen_loads() {
  if (!frozen_unflushed_) return Status::ok();
  frozen_unflushed_ = false;
  return store_->flush();
}

Result<std::uint64_t> EngineImpl::params_xxh3() {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) return Status::out_of_memory("params_xxh3: XXH3_createState");
  XXH3_64bits_reset(state);
  Status status = Status::ok();
  std::vector<float> values;
  for (UnitId id = 0; id < ctx_.units.size() && status.is_ok(); ++id) {
    if (ctx_.units[id].frozen()) continue;  // engine.h: trainable units only
    for (std::size_t t = 0; t < ctx_.units[id].spec.tensors.size(); ++t) {
      values.resize(ctx_.units[id].spec.tensors[t].numel());
      status = get_tensor(id, t, values, TensorState::kMaster);
      if (!status.is_ok()) break;
      XXH3_64bits_update(state, values.data(), values.size() * sizeof(float));
    }
  }
  const std::uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!status.is_ok()) return status;
  return h;
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
