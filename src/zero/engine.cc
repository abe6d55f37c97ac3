// The ZeRO engine (engine.h): one rank's units, their shards as blocks of the tiered store, the
// gather/grad/reduce protocol of a micro-batch and the optimizer step of stages 0-3 with the
// optimizer on the device, the CPU or streamed from NVMe. docs/zero.md describes the design.
//
// Every stage reduces a unit's full gradient with the same reduce-scatter (ReduceOp::kSum, in the
// compute dtype, over the same padded layout) into this rank's shard and accumulates it in fp32,
// and every stage computes the global norm from those shards in unit order, so the update each
// element sees is the same in every stage and every placement: fp32 masters are bit-identical.
#include "zero/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include <xxhash.h>

#include "comm/local_comm.h"
#include "core/assert.h"
#include "core/log.h"
#include "cpu/optimizer.h"
#include "cpu/pinned_pool.h"
#include "gpu/host_device.h"
#include "gpu/pinned_registration.h"
#include "store/stack.h"
#include "store/store.h"
#include "zero/layout.h"
#include "zero/loss_scaler.h"
#include "zero/optimizer_args.h"
#include "zero/plan.h"
#include "zero/schedule.h"
#include "zero/step_decision.h"

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

namespace {

using store::Access;
using store::BlockId;
using store::Lease;
using store::Tier;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// fp32 += a 16-bit or fp32 gradient on the host, the same IEEE sums as device_accumulate_coeffs.
void host_accumulate(float* acc, const void* grad, DType dtype, std::size_t n) {
  switch (dtype) {
    case DType::kF32: {
      const auto* g = static_cast<const float*>(grad);
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] + g[i];
      return;
    }
    case DType::kBF16: {
      const auto* g = static_cast<const bf16*>(grad);
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] + bf16_to_f32(g[i]);
      return;
    }
    case DType::kF16: {
      const auto* g = static_cast<const fp16*>(grad);
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] + fp16_to_f32(g[i]);
      return;
    }
  }
}

// fp32 -> dtype on the host (round to nearest even, as Device::cast).
void host_cast_from_f32(const float* src, void* dst, DType dtype, std::size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      auto* d = static_cast<bf16*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<fp16*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_fp16(src[i]);
      return;
    }
  }
}

// A collective scalar reduction that is exact and identical on every rank: rank r writes its
// values, each split into four 16-bit pieces stored as small integers in fp32, into slot r of an
// otherwise zero buffer; an fp32 sum all-reduce of integers below 2^24 with zeros is exact, so
// every rank decodes every rank's exact values and combines them in rank order.
constexpr std::size_t kScalarPieces = 4;
void encode_u64(std::uint64_t x, float* out) {
  for (std::size_t i = 0; i < kScalarPieces; ++i) {
    out[i] = static_cast<float>((x >> (16 * i)) & 0xffffu);
  }
}
std::uint64_t decode_u64(const float* in) {
  std::uint64_t x = 0;
  for (std::size_t i = 0; i < kScalarPieces; ++i) {
    x |= static_cast<std::uint64_t>(in[i]) << (16 * i);
  }
  return x;
}

struct DeferredFree {
  std::unique_ptr<gpu::Event> done;
  gpu::DeviceBuffer buffer;
};

// delayed mode's background update: one job at a time on a thread the engine owns. The job only
// pins store blocks and runs the CPU optimizer (the store and the optimizer are safe to call from
// another thread); it never touches a stream or a collective, so the rank's calls still pair up
// across ranks in the same order.
class UpdateWorker {
 public:
  UpdateWorker() : thread_([this] { loop(); }) {}
  ~UpdateWorker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  // Starts `job`; the previous one must have been waited for.
  void submit(std::function<Status()> job) {
    {
      std::lock_guard lock(mu_);
      TZ_ASSERT(!busy_, "UpdateWorker::submit while a job is pending");
      job_ = std::move(job);
      busy_ = true;
    }
    wake_.notify_all();
  }

  // Blocks until the submitted job (if any) has finished; returns its status once.
  Status wait() {
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return !busy_; });
    return std::exchange(result_, Status::ok());
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || job_ != nullptr; });
      if (job_ == nullptr) return;  // stop_ with nothing left to run
      std::function<Status()> job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      Status s = job();  // no lock held: the job waits on store moves
      lock.lock();
      result_ = std::move(s);
      busy_ = false;
      done_.notify_all();
    }
  }

  std::mutex mu_;  // guards every member below; never held while a job runs
  std::condition_variable wake_;
  std::condition_variable done_;
  std::function<Status()> job_;
  bool busy_ = false;
  bool stop_ = false;
  Status result_ = Status::ok();
  std::thread thread_;  // last: started after the members it reads
};

struct Unit {
  UnitSpec spec;
  UnitLayout layout;
  std::size_t opt_elems = 0;  // elements of master and states on this rank (P in stage 0, else S)
  BlockId param = 0;          // stage 3: this rank's shard; stages 0-2: the full unit
  BlockId master = 0;
  BlockId state[2] = {0, 0};
  BlockId grad_acc = 0;  // fp32 reduced gradient shard, accumulated over micro-batches
  // gather state
  int gather_refs = 0;
  Lease param_lease;            // stages 0-2: the full block pinned while gathered
  gpu::DeviceBuffer gathered;   // stage 3: the all-gathered unit
  // Stage 3, numel below stage3_param_persistence_threshold: gathered once per step and kept.
  bool persistent = false;
  bool persistent_valid = false;
  UnitViews views;
  // gradient state
  gpu::DeviceBuffer grad_buffer;
  UnitViews grad_views;
  int reduces = 0;  // reduce() calls since the last step
  // delayed: the step's reduced fp32 gradient shard the background update reads (the
  // accumulator is zeroed for the next step meanwhile) and the 16-bit parameters it writes, which
  // the next step() publishes.
  PinnedBuffer delayed_grad;
  PinnedBuffer delayed_params;
  // eager: master and optimizer states as they were before the early update (host for the CPU
  // optimizer, device for the device one), kept when clipping or loss scaling may undo it.
  PinnedBuffer snapshot_host;
  gpu::DeviceBuffer snapshot_device;
  bool updated_early = false;
  // Stages 0-2: all-gathers of the unit's updated parameters (stage 0: of its reduced gradient)
  // this step, for comm_formula.
  std::uint64_t update_gathers = 0;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineOptions& options, gpu::Device& device, comm::Comm& comm)
      : options_(options),
        config_(options.config),
        device_(device),
        comm_(comm),
        rank_(comm.rank()),
        world_(comm.world_size()),
        scaler_(options.config.fp16) {}

  ~EngineImpl() override {
    // Work that still reads engine buffers must finish before they go: a pending delayed
    // update (its status has nowhere to go) and the device's streams.
    if (worker_) worker_->wait().ignore();
    worker_.reset();
    device_.synchronize().ignore();
    for (Unit& u : units_) {
      u.param_lease.release();
      u.gathered.reset();
      u.grad_buffer.reset();
      u.snapshot_device.reset();
      u.snapshot_host.reset();  // the overlap pool must outlive its buffers
      u.delayed_grad.reset();
      u.delayed_params.reset();
    }
    deferred_.clear();
    store_.reset();
    stage16_.reset();
    stage32_.reset();
  }

  Status init() {
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
  Result<UnitId> register_unit(UnitSpec spec) override {
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
    u.opt_elems = stage_ == 0 ? u.layout.padded : u.layout.shard;
    return static_cast<UnitId>(units_.size() - 1);
  }

  Status finalize() override {
    if (finalized_) return Status::invalid_argument("finalize(): called twice");
    if (units_.empty()) return Status::invalid_argument("finalize(): no units registered");
    // The memory plan (zero/plan.h) is a pure function of the config, the layouts and the
    // budgets, shared with `tierzero estimate`; it sizes everything allocated below.
    std::vector<UnitLayout> layouts;
    layouts.reserve(units_.size());
    for (const Unit& u : units_) {
      layouts.push_back(u.layout);
      param_count_ += u.layout.numel;
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
    TZ_ASSIGN_OR_RETURN(MemoryPlan mp, plan_memory(in, config_, layouts));
    for (std::size_t i = 0; i < units_.size(); ++i) units_[i].persistent = mp.persistent[i];
    plan_ = mp.terms;
    overlap_bytes_ = mp.overlap_bytes;
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
  Status set_tensor(UnitId id, std::size_t tensor, std::span<const float> values,
                    TensorState which) override {
    TZ_RETURN_IF_ERROR(check_tensor(id, tensor, values.size(), "set_tensor"));
    // delayed: the pending update finishes and is published first, so the value set here is
    // not overwritten by parameters computed before it.
    TZ_RETURN_IF_ERROR(publish_pending_update());
    Unit& u = units_[id];
    TZ_ASSIGN_OR_RETURN(BlockId block, state_block(u, which));
    const std::size_t off = u.layout.offsets[tensor];
    const std::size_t n = u.spec.tensors[tensor].numel();
    if (stage_ == 0) {
      TZ_RETURN_IF_ERROR(write_block(block, off * 4, values.data(), n * 4));
    } else {
      auto [b, e] = u.layout.shard_part(u.spec.tensors, tensor, rank_);
      if (e > b) {
        const std::size_t shard_off = off + b - static_cast<std::size_t>(rank_) * u.layout.shard;
        TZ_RETURN_IF_ERROR(write_block(block, shard_off * 4, values.data() + b, (e - b) * 4));
      }
    }
    if (which != TensorState::kMaster) return Status::ok();
    // The compute-dtype parameters follow the master (a persistent gathered copy is refreshed
    // at its next gather).
    u.persistent_valid = false;
    const std::size_t es = dtype_size(compute_dtype_);
    std::vector<std::byte> converted(n * es);
    host_cast_from_f32(values.data(), converted.data(), compute_dtype_, n);
    if (stage_ < 3) return write_block(u.param, off * es, converted.data(), n * es);
    auto [b, e] = u.layout.shard_part(u.spec.tensors, tensor, rank_);
    if (e == b) return Status::ok();
    const std::size_t shard_off = off + b - static_cast<std::size_t>(rank_) * u.layout.shard;
    return write_block(u.param, shard_off * es, converted.data() + b * es, (e - b) * es);
  }

  Status get_tensor(UnitId id, std::size_t tensor, std::span<float> out,
                    TensorState which) override {
    TZ_RETURN_IF_ERROR(check_tensor(id, tensor, out.size(), "get_tensor"));
    // delayed: the state after the pending update (the masters and states a checkpoint saves);
    // its parameters are still published only at the next step(), so the run is unchanged.
    TZ_RETURN_IF_ERROR(wait_pending_update());
    Unit& u = units_[id];
    TZ_ASSIGN_OR_RETURN(BlockId block, state_block(u, which));
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

  nlohmann::ordered_json scalar_state() const override {
    nlohmann::ordered_json j;
    j["steps_done"] = steps_done_;
    j["updates_done"] = updates_done_;
    j["loss_scaler"] = scaler_.state();
    return j;
  }

  Status restore_scalar_state(const nlohmann::json& state) override {
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

  // --- One micro-batch ---------------------------------------------------------------------------
  Result<UnitViews> gather(UnitId id) override {
    TZ_RETURN_IF_ERROR(check_unit(id, "gather"));
    Unit& u = units_[id];
    if (u.gather_refs > 0) {
      ++u.gather_refs;
      return u.views;
    }
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

  Status release(UnitId id) override {
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

  Result<UnitViews> grad(UnitId id) override {
    TZ_RETURN_IF_ERROR(check_unit(id, "grad"));
    Unit& u = units_[id];
    if (!u.grad_buffer.empty()) return u.grad_views;
    open_step();
    const std::size_t bytes = u.layout.padded * dtype_size(compute_dtype_);
    TZ_ASSIGN_OR_RETURN(u.grad_buffer, allocate_device(bytes));
    TZ_RETURN_IF_ERROR(
        device_.memset_async(u.grad_buffer.data(), 0, bytes, device_.compute_stream()));
    u.grad_views = make_views(u, u.grad_buffer.data(), compute_dtype_);
    return u.grad_views;
  }

  Status reduce(UnitId id) override {
    TZ_RETURN_IF_ERROR(check_unit(id, "reduce"));
    Unit& u = units_[id];
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

  Result<StepReport> step() override {
    if (!finalized_) return Status::invalid_argument("step(): before finalize()");
    const int k = gradient_accumulation_steps();
    for (const Unit& u : units_) {
      if (u.reduces != k) {
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
    switch (decision.update) {
      case StepUpdate::kNone:
        break;
      case StepUpdate::kEarlyKept:
        ++updates_done_;  // the early updates were this step's
        break;
      case StepUpdate::kAllUnitsNow: {
        const cpu::StepArgs args = update_args(decision.multiplier, ++updates_done_);
        for (std::size_t i = 0; i < units_.size(); ++i) {
          // NVMe-homed optimizer state: the next unit's reads start while this one updates (the
          // previous unit's write-back is already in flight from its unpin).
          if (opt_place_ == Placement::kNvme && i + 1 < units_.size()) {
            prefetch_states(units_[i + 1]);
          }
          TZ_RETURN_IF_ERROR(update_unit(units_[i], args));
        }
        break;
      }
      case StepUpdate::kBackground:
        TZ_RETURN_IF_ERROR(start_delayed_update(update_args(decision.multiplier, ++updates_done_)));
        break;
    }
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
    report.step = steps_done_;
    report.stall_optimizer_s = seconds_since(t_opt) + early_update_s_;
    early_update_s_ = 0;
    report.stall_gather_s = stall_gather_s_;
    report.stall_reduce_s = stall_reduce_s_;
    report.stall_s = report.stall_gather_s + report.stall_reduce_s + report.stall_optimizer_s;
    stall_gather_s_ = stall_reduce_s_ = 0;
    open_step();
    report.step_s = seconds_since(step_start_);
    step_open_ = false;
    report.bytes_in_use = bytes_in_use();
    report.peak_bytes = peak_bytes();
    const comm::CommCounters now = comm_.counters();
    for (std::size_t op = 0; op < comm::kCollectiveOpCount; ++op) {
      const auto o = static_cast<comm::CollectiveOp>(op);
      report.comm_bytes[std::string(comm::collective_op_name(o))] =
          now.ops[op].bytes_sent - comm_base_.ops[op].bytes_sent;
    }
    report.comm_formula_bytes = comm_formula();
    for (Unit& u : units_) u.update_gathers = 0;
    const store::StoreStats ss = store_->stats();
    report.nvme_read_bytes = ss.nvme_read_bytes() - nvme_read_base_;
    report.nvme_write_bytes = ss.nvme_write_bytes() - nvme_write_base_;
    const std::uint64_t link_bytes = ss.link(store::Link::kHostToDevice).bytes +
                                     ss.link(store::Link::kDeviceToHost).bytes +
                                     ss.link(store::Link::kNvmeToDevice).bytes +
                                     ss.link(store::Link::kDeviceToNvme).bytes;
    report.bound_s = step_bound(report, link_bytes - copy_link_base_ + copy_bytes_);
    optimizer_s_ = 0;
    copy_bytes_ = 0;
    return report;
  }

  // --- What the model needs to know -------------------------------------------------------------
  gpu::Device& device() override { return device_; }
  gpu::Stream& compute_stream() override { return device_.compute_stream(); }
  DType compute_dtype() const override { return compute_dtype_; }
  double loss_scale() const override { return scaler_.scale(); }
  int gradient_accumulation_steps() const override {
    return static_cast<int>(config_.gradient_accumulation_steps);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::int64_t steps_done() const override { return steps_done_; }
  std::uint64_t param_count() const override { return param_count_; }
  std::size_t unit_count() const override { return units_.size(); }
  const UnitSpec& unit_spec(UnitId unit) const override {
    TZ_ASSERT(unit < units_.size(), "unit_spec: unknown unit id");
    return units_[unit].spec;
  }
  const UnitLayout& layout(UnitId unit) const override {
    TZ_ASSERT(unit < units_.size(), "layout: unknown unit id");
    return units_[unit].layout;
  }
  int optimizer_state_count() const override { return states_; }
  const EngineOptions& options() const override { return options_; }

  // --- Accounting ---------------------------------------------------------------------------------
  nlohmann::ordered_json plan_json() const override {
    nlohmann::ordered_json j;
    j["stage"] = stage_;
    j["world_size"] = world_;
    j["params"] = param_count_;
    j["compute_dtype"] = std::string(dtype_name(compute_dtype_));
    j["offload_optimizer"] = std::string(placement_name(opt_place_));
    j["offload_param"] = std::string(placement_name(param_place_));
    j["plan_bytes"] = plan_bytes().to_json();
    for (const PlanTerm& t : plan_) {
      j["terms"][store::tier_name(t.tier)][t.name] = t.bytes;
    }
    j["formula_bytes"] = formula_bytes().to_json();
    j["formula"] = "DESIGN.md: params " + std::to_string(dtype_size(compute_dtype_)) +
                   "P, grads " + std::to_string(dtype_size(compute_dtype_)) + "P, optimizer " +
                   std::to_string(4 * (1 + states_)) +
                   "P (fp32 master + states); stage 1 shards the optimizer, stage 2 + grads, "
                   "stage 3 + params, by N; offload moves a term to its tier";
    return j;
  }

  // DESIGN.md's memory table for this config: what each tier would hold by the formula.
  TierBytes formula_bytes() const {
    const double phi = static_cast<double>(param_count_);
    const double n = world_;
    const double es = static_cast<double>(dtype_size(compute_dtype_));
    const double params = stage_ == 3 ? es * phi / n : es * phi;
    const double grads = stage_ >= 2 ? es * phi / n : es * phi;
    const double opt = 4.0 * (1 + states_) * phi / (stage_ >= 1 ? n : 1.0);
    double tiers[3] = {0, 0, 0};
    tiers[static_cast<int>(tier_of(param_place_))] += params;
    tiers[static_cast<int>(tier_of(grad_place_))] += grads;
    tiers[static_cast<int>(tier_of(opt_place_))] += opt;
    TierBytes b;
    b.device = static_cast<std::uint64_t>(tiers[0]);
    b.host = static_cast<std::uint64_t>(tiers[1]);
    b.nvme = static_cast<std::uint64_t>(tiers[2]);
    return b;
  }

  std::uint64_t tier_plan(Tier t) const {
    std::uint64_t sum = 0;
    for (const PlanTerm& p : plan_) {
      if (p.tier == t) sum += p.bytes;
    }
    return sum;
  }

  TierBytes plan_bytes() const override {
    TierBytes b;
    b.device = tier_plan(Tier::kDevice);
    b.host = tier_plan(Tier::kHost);
    b.nvme = tier_plan(Tier::kNvme);
    return b;
  }

  TierBytes peak_bytes() const override {
    TierBytes b;
    b.device = device_.memory_stats().peak_bytes;
    if (pool_) b.host = pool_->stats().peak_bytes;
    if (overlap_pool_) b.host += overlap_pool_->stats().peak_bytes;
    if (store_) b.nvme = store_->stats().tier(Tier::kNvme).peak_bytes;
    return b;
  }

  Result<std::uint64_t> params_xxh3() override {
    XXH3_state_t* state = XXH3_createState();
    if (state == nullptr) return Status::out_of_memory("params_xxh3: XXH3_createState");
    XXH3_64bits_reset(state);
    Status status = Status::ok();
    std::vector<float> values;
    for (UnitId id = 0; id < units_.size() && status.is_ok(); ++id) {
      for (std::size_t t = 0; t < units_[id].spec.tensors.size(); ++t) {
        values.resize(units_[id].spec.tensors[t].numel());
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

 private:
  TierBytes bytes_in_use() const {
    TierBytes b;
    b.device = device_.memory_stats().in_use_bytes;
    if (pool_) b.host = pool_->stats().in_use_bytes;
    if (overlap_pool_) b.host += overlap_pool_->stats().in_use_bytes;
    if (store_) b.nvme = store_->used_bytes(Tier::kNvme);
    return b;
  }

  // The step's accounting window opens at its first gather or grad (set_tensor and checkpoint
  // traffic between steps is not the step's).
  void open_step() {
    if (step_open_) return;
    step_open_ = true;
    step_start_ = Clock::now();
    comm_base_ = comm_.counters();
    const store::StoreStats ss = store_->stats();
    nvme_read_base_ = ss.nvme_read_bytes();
    nvme_write_base_ = ss.nvme_write_bytes();
    copy_link_base_ = ss.link(store::Link::kHostToDevice).bytes +
                      ss.link(store::Link::kDeviceToHost).bytes +
                      ss.link(store::Link::kNvmeToDevice).bytes +
                      ss.link(store::Link::kDeviceToNvme).bytes;
    optimizer_s_ = 0;
    copy_bytes_ = 0;
    compute_busy_base_ = device_.compute_stream().busy_seconds();
  }

  // The step's lower bound (DESIGN.md): max(compute, NVMe bytes / NVMe bandwidth, host<->device
  // bytes / copy bandwidth, CPU optimizer time). Compute is the step's time outside the engine's
  // calls (the model's own work), or the compute stream's busy time where the device can tell
  // (HostDevice: the model's kernels run on the stream's thread while the engine waits in its
  // calls, so the time outside them is only the enqueueing). On a host-accessible device compute
  // and the CPU optimizer run on the same cores, so those two add. A bandwidth of 0 (unknown)
  // drops its term.
  double step_bound(const StepReport& r, std::uint64_t copy_bytes) const {
    const double engine_s = r.stall_gather_s + r.stall_reduce_s + r.stall_optimizer_s;
    double compute_s = std::max(0.0, r.step_s - engine_s);
    const double busy = device_.compute_stream().busy_seconds();
    if (busy >= 0 && compute_busy_base_ >= 0) compute_s = std::max(compute_s, busy - compute_busy_base_);
    double bound = device_.host_accessible() ? compute_s + optimizer_s_ : std::max(compute_s, optimizer_s_);
    if (options_.nvme_read_bytes_per_s > 0 && options_.nvme_write_bytes_per_s > 0) {
      bound = std::max(bound, static_cast<double>(r.nvme_read_bytes) / options_.nvme_read_bytes_per_s +
                                  static_cast<double>(r.nvme_write_bytes) / options_.nvme_write_bytes_per_s);
    }
    if (options_.copy_bytes_per_s > 0) {
      bound = std::max(bound, static_cast<double>(copy_bytes) / options_.copy_bytes_per_s);
    }
    return bound;
  }

  Status check_unit(UnitId id, const char* what) const {
    if (!finalized_) return Status::invalid_argument(std::string(what) + ": before finalize()");
    if (id >= units_.size()) {
      return Status::invalid_argument(std::string(what) + ": unknown unit id " +
                                      std::to_string(id));
    }
    return Status::ok();
  }

  Status check_tensor(UnitId id, std::size_t tensor, std::size_t n, const char* what) const {
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

  Result<BlockId> state_block(const Unit& u, TensorState which) const {
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

  // A store pin whose error names the unit, shard and what it was for.
  Result<Lease> pin_for(const Unit& u, const char* what, BlockId block, Tier tier, Access access) {
    auto l = store_->pin(block, tier, access);
    if (!l.is_ok()) return with_unit(u, what, l.status());
    return l;
  }

  // Prefixes an error with the unit and rank.
  Status with_unit(const Unit& u, const char* what, Status s) const {
    if (s.is_ok()) return s;
    return std::move(s).with_context("unit '" + u.spec.name + "' shard " + std::to_string(rank_) +
                                     " of " + std::to_string(world_) + " (rank " +
                                     std::to_string(rank_) + "), " + what);
  }

  Status sync(gpu::Stream& st, const std::string& what) {
    Status s = st.synchronize();
    if (s.is_ok()) s = comm_.async_error();
    if (s.is_ok()) return s;
    return std::move(s).with_context(what + " on rank " + std::to_string(rank_));
  }

  UnitViews make_views(const Unit& u, void* base, DType dtype) const {
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
  Status defer_free(gpu::DeviceBuffer buffer) {
    if (buffer.empty()) return Status::ok();
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> ev, device_.create_event());
    TZ_RETURN_IF_ERROR(ev->record(device_.compute_stream()));
    deferred_.push_back(DeferredFree{std::move(ev), std::move(buffer)});
    reap_deferred(false);
    return Status::ok();
  }

  void reap_deferred(bool all) {
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
  Result<gpu::DeviceBuffer> allocate_device(std::size_t bytes) {
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
  std::uint64_t store_device_room() const {
    if (!store_) return 0;
    const store::TierStats t = store_->stats().tier(Tier::kDevice);
    const std::uint64_t held = t.used_bytes + t.cached_bytes;
    return t.budget_bytes > held ? t.budget_bytes - held : 0;
  }

  // Host bytes into a block at `offset`, in its home tier (device blocks through a copy).
  Status write_block(BlockId block, std::size_t offset, const void* src, std::size_t bytes) {
    const Tier tier = home_tier(block);
    const Tier pin_tier = tier == Tier::kDevice ? Tier::kDevice : Tier::kHost;
    TZ_ASSIGN_OR_RETURN(Lease l, store_->pin(block, pin_tier, Access::kReadWrite));
    TZ_RETURN_IF_ERROR(l.wait());
    auto* dst = static_cast<std::byte*>(l.data()) + offset;
    if (pin_tier == Tier::kHost) {
      std::memcpy(dst, src, bytes);
      l.release();
      return Status::ok();
    }
    gpu::Stream& st = device_.compute_stream();
    TZ_RETURN_IF_ERROR(device_.copy_async(dst, src, bytes, gpu::CopyKind::kHostToDevice, st));
    TZ_RETURN_IF_ERROR(sync(st, "write_block"));
    l.release();
    return Status::ok();
  }

  Status read_block(BlockId block, std::size_t offset, void* dst, std::size_t bytes) {
    const Tier tier = home_tier(block);
    const Tier pin_tier = tier == Tier::kDevice ? Tier::kDevice : Tier::kHost;
    TZ_ASSIGN_OR_RETURN(Lease l, store_->pin(block, pin_tier, Access::kRead));
    TZ_RETURN_IF_ERROR(l.wait());
    const auto* src = static_cast<const std::byte*>(l.data()) + offset;
    if (pin_tier == Tier::kHost) {
      std::memcpy(dst, src, bytes);
      l.release();
      return Status::ok();
    }
    gpu::Stream& st = device_.compute_stream();
    TZ_RETURN_IF_ERROR(device_.copy_async(dst, src, bytes, gpu::CopyKind::kDeviceToHost, st));
    TZ_RETURN_IF_ERROR(sync(st, "read_block"));
    l.release();
    return Status::ok();
  }

  // A block's bytes into device memory (synchronously complete on return).
  Status read_block_to_device(BlockId block, std::size_t offset, void* dst, std::size_t bytes) {
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

  Tier home_tier(BlockId block) const {
    // Blocks are created per unit in a fixed pattern; the homes follow from the placements.
    for (const Unit& u : units_) {
      if (block == u.param) return tier_of(param_place_);
      if (block == u.grad_acc) return tier_of(grad_place_);
      if (block == u.master || (states_ >= 1 && block == u.state[0]) ||
          (states_ >= 2 && block == u.state[1])) {
        return tier_of(opt_place_);
      }
    }
    TZ_ASSERT(false, "unknown block");
    return Tier::kHost;
  }

  Result<gpu::NormAccumulator> local_norm() {
    gpu::Stream& st = device_.compute_stream();
    gpu::NormAccumulator host_acc;
    TZ_RETURN_IF_ERROR(device_.memset_async(norm_acc_.data(), 0, sizeof(gpu::NormAccumulator), st));
    auto* dev_acc = norm_acc_.as<gpu::NormAccumulator>();
    // A device that can read host memory sums host shards with the same kernel as device ones,
    // so the sum (and so the clip coefficient) does not depend on where the shards live.
    const bool device_sums = grad_place_ == Placement::kDevice || device_.host_accessible();
    std::vector<Lease> leases;
    for (const Unit& u : units_) {
      const Tier pin_tier = grad_place_ == Placement::kDevice ? Tier::kDevice : Tier::kHost;
      TZ_ASSIGN_OR_RETURN(Lease l, store_->pin(u.grad_acc, pin_tier, Access::kRead));
      TZ_RETURN_IF_ERROR(with_unit(u, "norm", l.wait()));
      if (device_sums) {
        TZ_RETURN_IF_ERROR(
            device_.sum_squares(l.data(), DType::kF32, u.layout.shard, dev_acc, st));
        leases.push_back(std::move(l));
      } else {
        const auto* g = static_cast<const float*>(l.data());
        for (std::size_t i = 0; i < u.layout.shard; ++i) {
          if (std::isfinite(g[i])) {
            host_acc.sum_squares += static_cast<double>(g[i]) * g[i];
          } else {
            ++host_acc.nonfinite_count;
          }
        }
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

  Result<gpu::NormAccumulator> all_reduce_norm(const gpu::NormAccumulator& local) {
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
  Result<DType> gather_full_gradient(Unit& u, const Lease& acc, gpu::DeviceBuffer& dev_full) {
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

  Status update_unit(Unit& u, const cpu::StepArgs& args) {
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
    const void* grad = acc.data();
    DType grad_dtype = DType::kF32;
    gpu::DeviceBuffer dev_full;
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

  // --- Overlap modes (docs/zero.md, "Overlap modes") ---------------------------------------------
  Status init_overlap() {
    const std::string& mode = config_.tierzero.overlap;
    if (mode == "exact") {
      overlap_ = Overlap::kExact;
    } else if (mode == "eager") {
      overlap_ = Overlap::kEager;
      // Only clipping and loss scaling (with its overflow skips) can change a step's multiplier
      // after the early updates; without them the speculation cannot be wrong but for a
      // non-finite gradient the model itself produced (step() reports that as an error).
      eager_snapshot_ = config_.gradient_clipping > 0 || config_.fp16.enabled;
    } else if (mode == "delayed") {
      if (opt_place_ == Placement::kDevice) {
        return Status::invalid_argument(
            "tierzero.overlap: \"delayed\" runs step t's update on the CPU during step t+1's "
            "forward and backward, so it needs zero_optimization.offload_optimizer.device cpu "
            "or nvme (here the optimizer is on the device: use \"exact\" or \"eager\")");
      }
      if (stage_ == 0) {
        return Status::invalid_argument(
            "tierzero.overlap: \"delayed\" needs zero_optimization.stage >= 1 (stage 0 "
            "all-gathers the gradient for the update, a collective the background update "
            "cannot issue)");
      }
      overlap_ = Overlap::kDelayed;
    } else {
      return Status::invalid_argument("tierzero.overlap: expected exact, eager or delayed, got '" +
                                      mode + "'");
    }
    return Status::ok();
  }

  // The buffers of eager's rollback snapshot and of delayed's pending update (plan_memory counts
  // them: overlap_bytes_). They sit beside the store's tiers (their own pinned pool, or device
  // allocations for eager with the optimizer on the device).
  Status finalize_overlap() {
    if (overlap_bytes_ == 0) return Status::ok();
    const bool delayed = overlap_ == Overlap::kDelayed;
    const std::size_t es = dtype_size(compute_dtype_);
    const std::uint64_t state_bytes_per_elem = 4ull * (1 + static_cast<std::uint64_t>(states_));
    if (!delayed && opt_place_ == Placement::kDevice) {
      for (Unit& u : units_) {
        TZ_ASSIGN_OR_RETURN(u.snapshot_device, allocate_device(u.opt_elems * state_bytes_per_elem));
      }
      return Status::ok();
    }
    PinnedPoolOptions po;
    po.budget_bytes = overlap_bytes_;
    const std::uint64_t slab_unit = 2u << 20;
    po.slab_bytes = std::min<std::uint64_t>(
        1ull << 30, (overlap_bytes_ + slab_unit - 1) / slab_unit * slab_unit);
    po.prefault = false;
    TZ_ASSIGN_OR_RETURN(PinnedPool pool, PinnedPool::create(po));
    overlap_pool_ = std::make_unique<PinnedPool>(std::move(pool));
    TZ_RETURN_IF_ERROR(gpu::register_pinned_pool(device_, *overlap_pool_));
    for (Unit& u : units_) {
      if (delayed) {
        TZ_ASSIGN_OR_RETURN(u.delayed_grad, overlap_pool_->allocate(u.layout.shard * 4));
        TZ_ASSIGN_OR_RETURN(u.delayed_params, overlap_pool_->allocate(u.opt_elems * es));
      } else {
        TZ_ASSIGN_OR_RETURN(u.snapshot_host,
                            overlap_pool_->allocate(u.opt_elems * state_bytes_per_elem));
      }
    }
    if (delayed) worker_ = std::make_unique<UpdateWorker>();
    return Status::ok();
  }

  // The optimizer's arguments for update number `step` (1-based, skipped steps excluded) with
  // gradient multiplier `multiplier`; the schedule's learning rate for it (DeepSpeed advances
  // the schedule after each applied update).
  cpu::StepArgs update_args(double multiplier, std::int64_t step) const {
    cpu::StepArgs args;
    args.step = step;
    args.grad_multiplier = static_cast<float>(multiplier);
    args.grad_dtype = DType::kF32;
    args.copy_dtype = compute_dtype_ == DType::kF32 ? DType::kBF16 : compute_dtype_;
    args.lr_override =
        scheduled_lr(config_.scheduler, spec_.lr, config_.scheduler.last_batch_iteration + step - 1);
    return args;
  }

  // eager: the unit's update as soon as its last micro-batch's gradient is reduced, with the
  // multiplier the step has when it neither clips nor overflows (1 / (scale N k)); step()
  // checks that and rolls back otherwise. The snapshot is taken first when a rollback can come.
  Status update_early(Unit& u) {
    const auto t0 = Clock::now();
    if (!eager_args_) {
      const double divisor =
          scaler_.scale() * static_cast<double>(world_) * gradient_accumulation_steps();
      eager_args_ = update_args(1.0 / divisor, updates_done_ + 1);
    }
    if (eager_snapshot_) TZ_RETURN_IF_ERROR(copy_snapshot(u, /*to_snapshot=*/true));
    TZ_RETURN_IF_ERROR(update_unit(u, *eager_args_));
    u.updated_early = true;
    early_update_s_ += seconds_since(t0);
    return Status::ok();
  }

  // eager: the unit's master and optimizer states into its snapshot, or back from it.
  Status copy_snapshot(Unit& u, bool to_snapshot) {
    const bool on_device = opt_place_ == Placement::kDevice;
    const Tier tier = on_device ? Tier::kDevice : Tier::kHost;
    const std::size_t bytes = u.opt_elems * 4;
    gpu::Stream& st = device_.compute_stream();
    std::byte* snap = on_device ? u.snapshot_device.as<std::byte>() : u.snapshot_host.data();
    const char* what = to_snapshot ? "eager: snapshot" : "eager: rollback";
    for (int i = 0; i <= states_; ++i) {
      const BlockId block = i == 0 ? u.master : u.state[i - 1];
      TZ_ASSIGN_OR_RETURN(Lease l, pin_for(u, what, block, tier,
                                           to_snapshot ? Access::kRead : Access::kWrite));
      TZ_RETURN_IF_ERROR(with_unit(u, what, l.wait()));
      std::byte* kept = snap + static_cast<std::size_t>(i) * bytes;
      void* dst = to_snapshot ? static_cast<void*>(kept) : l.data();
      const void* src = to_snapshot ? l.data() : static_cast<const void*>(kept);
      if (on_device) {
        TZ_RETURN_IF_ERROR(with_unit(
            u, what, device_.copy_async(dst, src, bytes, gpu::CopyKind::kDeviceToDevice, st)));
        l.release(&st);
      } else {
        std::memcpy(dst, src, bytes);
        l.release();
      }
    }
    return Status::ok();
  }

  // eager, when the step clips or overflows: every unit updated early gets its master and states
  // back, then step() redoes the update exactly (clipping) or skips it (overflow: the parameters
  // are re-derived from the restored master, the cast the optimizer's copy makes, so they get
  // the bits they had before the early update).
  Status roll_back_early_updates(bool overflow) {
    if (!eager_snapshot_) {
      return Status::corrupt(
          "step " + std::to_string(steps_done_ + 1) + " on rank " + std::to_string(rank_) +
          ": a non-finite gradient under tierzero.overlap \"eager\" without gradient_clipping or "
          "fp16 loss scaling, so without a rollback snapshot: the units were updated as their "
          "gradients arrived and their weights are no longer finite. Resume from a checkpoint, "
          "with \"exact\" (which skips such steps) or with clipping or fp16 on (then eager keeps "
          "a snapshot and rolls back)");
    }
    for (Unit& u : units_) {
      if (!u.updated_early) continue;
      TZ_RETURN_IF_ERROR(copy_snapshot(u, /*to_snapshot=*/false));
      if (overflow) TZ_RETURN_IF_ERROR(write_params_from_master(u));
    }
    return sync(device_.compute_stream(), "eager rollback");
  }

  // The compute-dtype parameters of `u` written from its master (stages 1-2: this rank's slice,
  // then all-gathered), as update_unit writes the optimizer's copy.
  Status write_params_from_master(Unit& u) {
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
  Status write_params(Unit& u, const void* src) {
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

  // delayed: hands the step's update to the worker. The reduced gradient shards are copied out of
  // the accumulators (zeroed for the next step right after); the worker updates master and
  // states in place and writes the 16-bit parameters to Unit::delayed_params.
  Status start_delayed_update(const cpu::StepArgs& args) {
    TZ_ASSERT(!update_running_ && !update_unpublished_, "delayed update started twice");
    for (Unit& u : units_) {
      TZ_ASSIGN_OR_RETURN(Lease acc, pin_for(u, "delayed: gradient", u.grad_acc, Tier::kHost,
                                             Access::kRead));
      TZ_RETURN_IF_ERROR(with_unit(u, "delayed: gradient", acc.wait()));
      std::memcpy(u.delayed_grad.data(), acc.data(), u.layout.shard * 4);
      acc.release();
    }
    update_running_ = true;
    worker_->submit([this, args] { return run_delayed_update(args); });
    return Status::ok();
  }

  // The worker's job: every unit's update in registration order (NVMe state read ahead one unit,
  // as in exact mode). Touches only the store (thread-safe), the CPU optimizer (the rank's
  // thread does not call it while a job runs), the units' delayed buffers and
  // worker_optimizer_s_ (read by the rank's thread after wait()).
  Status run_delayed_update(const cpu::StepArgs& args) {
    const bool copy16 = compute_dtype_ != DType::kF32;
    for (std::size_t i = 0; i < units_.size(); ++i) {
      if (opt_place_ == Placement::kNvme && i + 1 < units_.size()) prefetch_states(units_[i + 1]);
      Unit& u = units_[i];
      TZ_ASSIGN_OR_RETURN(Lease master, pin_for(u, "delayed update: master", u.master,
                                                Tier::kHost, Access::kReadWrite));
      Lease states[2];
      for (int s = 0; s < states_; ++s) {
        TZ_ASSIGN_OR_RETURN(states[s], pin_for(u, "delayed update: optimizer state", u.state[s],
                                               Tier::kHost, Access::kReadWrite));
      }
      TZ_RETURN_IF_ERROR(with_unit(u, "delayed update: master", master.wait()));
      for (int s = 0; s < states_; ++s) {
        TZ_RETURN_IF_ERROR(with_unit(u, "delayed update: optimizer state", states[s].wait()));
      }
      cpu::Shard shard;
      shard.param = static_cast<float*>(master.data());
      shard.grad = u.delayed_grad.data();
      for (int s = 0; s < states_; ++s) shard.state[s] = states[s].data();
      shard.param_copy = copy16 ? u.delayed_params.data() : nullptr;
      shard.n = u.opt_elems;
      const auto t0 = Clock::now();
      TZ_RETURN_IF_ERROR(with_unit(u, "delayed update: cpu optimizer",
                                   cpu_opt_->step(std::span<const cpu::Shard>(&shard, 1), args)));
      if (!copy16) std::memcpy(u.delayed_params.data(), master.data(), u.opt_elems * 4);
      worker_optimizer_s_ += seconds_since(t0);
      for (int s = 0; s < states_; ++s) states[s].release();
      master.release();
    }
    return Status::ok();
  }

  // delayed: waits for the update in flight (the rank's thread stalls on the optimizer); its
  // error, if any, comes back here.
  Status wait_pending_update() {
    if (!update_running_) return Status::ok();
    Status s = worker_->wait();
    update_running_ = false;
    update_unpublished_ = s.is_ok();
    optimizer_s_ += worker_optimizer_s_;
    worker_optimizer_s_ = 0;
    return s;
  }

  // delayed: waits for the pending update and publishes its parameters (the next forward sees
  // them; persistent stage-3 units are gathered again).
  Status publish_pending_update() {
    TZ_RETURN_IF_ERROR(wait_pending_update());
    if (!update_unpublished_) return Status::ok();
    update_unpublished_ = false;
    for (Unit& u : units_) {
      TZ_RETURN_IF_ERROR(write_params(u, u.delayed_params.data()));
      u.persistent_valid = false;
    }
    return Status::ok();
  }

  // DESIGN.md's communication per rank per step for this config and model, in the ring's byte
  // counts (comm::ring_bytes): every micro-batch reduce-scatters each unit (the 16-bit gradient);
  // stage 3 all-gathers each unit in forward and again in backward (a persistent unit once per
  // step); stages 1-2 all-gather the updated 16-bit parameters, stage 0 the reduced gradient
  // (fp32 when k > 1), once per pass of updates over the unit (Unit::update_gathers: exact one,
  // none when the step is skipped; eager one more after a rollback; delayed one when the
  // previous step's update is published). all_reduce: the norm's scalars.
  nlohmann::ordered_json comm_formula() const {
    const auto k = static_cast<std::uint64_t>(gradient_accumulation_steps());
    const std::size_t es = dtype_size(compute_dtype_);
    std::uint64_t ag = 0, rs = 0;
    auto ring = [this](comm::CollectiveOp op, std::size_t count, std::size_t elem) {
      return comm::ring_bytes(op, world_, rank_, count, elem).bytes_sent;
    };
    for (const Unit& u : units_) {
      const std::size_t sh = u.layout.shard;
      rs += k * ring(comm::CollectiveOp::kReduceScatter, sh, es);
      if (stage_ == 3) {
        ag += (u.persistent ? 1 : 2 * k) * ring(comm::CollectiveOp::kAllGather, sh, es);
      } else {
        const std::size_t e = stage_ == 0 && k > 1 ? 4 : es;
        ag += u.update_gathers * ring(comm::CollectiveOp::kAllGather, sh, e);
      }
    }
    nlohmann::ordered_json j;
    j[std::string(comm::collective_op_name(comm::CollectiveOp::kAllGather))] = ag;
    j[std::string(comm::collective_op_name(comm::CollectiveOp::kReduceScatter))] = rs;
    j[std::string(comm::collective_op_name(comm::CollectiveOp::kAllReduce))] =
        ring(comm::CollectiveOp::kAllReduce, static_cast<std::size_t>(world_) * 2 * kScalarPieces, 4);
    return j;
  }

  void prefetch_states(const Unit& u) {
    store_->prefetch(u.master, Tier::kHost).ignore();
    for (int i = 0; i < states_; ++i) store_->prefetch(u.state[i], Tier::kHost).ignore();
  }

  Status zero_gradients() {
    gpu::Stream& st = device_.compute_stream();
    for (const Unit& u : units_) {
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

  EngineOptions options_;
  Config config_;
  gpu::Device& device_;
  comm::Comm& comm_;
  int rank_;
  int world_;
  int stage_ = 0;
  DType compute_dtype_ = DType::kF32;
  Placement opt_place_ = Placement::kDevice;
  Placement param_place_ = Placement::kDevice;
  Placement grad_place_ = Placement::kDevice;
  std::vector<std::string> nvme_paths_;
  cpu::OptimizerSpec spec_;
  int states_ = 0;
  std::optional<cpu::CpuOptimizer> cpu_opt_;
  LossScaler scaler_;

  std::deque<Unit> units_;  // stable addresses: views point at the specs
  std::vector<PlanTerm> plan_;
  double compute_busy_base_ = -1;  // the compute stream's busy_seconds() when the step opened
  bool finalized_ = false;
  std::uint64_t param_count_ = 0;
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<store::Store> store_;
  PinnedBuffer stage16_;
  PinnedBuffer stage32_;
  gpu::DeviceBuffer norm_acc_;
  gpu::DeviceBuffer scalars_;
  std::deque<DeferredFree> deferred_;

  std::int64_t steps_done_ = 0;
  std::int64_t updates_done_ = 0;  // the optimizer's step count (skipped steps excluded)
  bool step_open_ = false;
  Clock::time_point step_start_;
  double stall_gather_s_ = 0;
  double stall_reduce_s_ = 0;
  comm::CommCounters comm_base_;
  std::uint64_t nvme_read_base_ = 0;
  std::uint64_t copy_link_base_ = 0;
  std::uint64_t copy_bytes_ = 0;  // the engine's own host<->device copies this step
  double optimizer_s_ = 0;        // CPU optimizer and host gradient accumulation this step
  std::uint64_t nvme_write_base_ = 0;

  // Overlap modes (docs/zero.md).
  Overlap overlap_ = Overlap::kExact;
  bool eager_snapshot_ = false;               // eager: keep master and states to roll back
  std::optional<cpu::StepArgs> eager_args_;   // eager: the step's speculative update arguments
  double early_update_s_ = 0;                 // eager: time in early updates this step
  std::uint64_t overlap_bytes_ = 0;           // the plan's term for the two below
  std::unique_ptr<PinnedPool> overlap_pool_;  // host buffers of eager's snapshot / delayed
  std::unique_ptr<UpdateWorker> worker_;      // delayed: runs the previous step's update
  bool update_running_ = false;               // delayed: a job was submitted, not waited for
  bool update_unpublished_ = false;           // delayed: finished, parameters not yet published
  double worker_optimizer_s_ = 0;             // delayed: the worker's CPU optimizer time
};

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options, gpu::Device& device,
                                               comm::Comm& comm) {
  auto engine = std::make_unique<EngineImpl>(options, device, comm);
  TZ_RETURN_IF_ERROR(engine->init());
  return std::unique_ptr<Engine>(std::move(engine));
}

Status run_local_ranks(int world_size, std::uint64_t device_budget_bytes, const RankFn& fn) {
  TZ_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<comm::Comm>> comms,
                      comm::LocalComm::create_group(world_size));
  const std::uint64_t budget = device_budget_bytes > 0 ? device_budget_bytes : (4ull << 30);
  std::vector<Status> results(static_cast<std::size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      auto device = gpu::HostDevice::create(budget);
      Status s = device.is_ok() ? fn(r, **device, *comms[static_cast<std::size_t>(r)])
                                : device.status();
      results[static_cast<std::size_t>(r)] = std::move(s);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world_size; ++r) {
    Status& s = results[static_cast<std::size_t>(r)];
    if (!s.is_ok()) return std::move(s).with_context("rank " + std::to_string(r));
  }
  return Status::ok();
}

}  // namespace tz::zero
