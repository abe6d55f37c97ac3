// The ZeRO engine's model API (DESIGN.md, "One training step"): what a model sees of stages 0-3,
// the tiered store, the collectives and the optimizer. A model registers its parameters as units
// (a transformer block, the embeddings, the final norm), asks for a unit's full 16-bit (or fp32)
// parameters on the device before computing with them, hands back the unit's full gradient, and
// ends each optimizer step with step(). It never sees shards, tiers or ranks.
//
// One Engine per rank. Every rank registers the same units in the same order and makes the same
// sequence of calls (gather/release/grad/reduce/step, set_tensor/get_tensor): the collectives
// behind them pair up across ranks as NCCL's do. Calls come from one thread per rank (the rank's
// thread); the engine runs its own threads (the store's mover, the CPU optimizer's arena).
//
// Streams: the model computes on `compute_stream()`. gather() makes that stream wait for the
// parameters (nothing blocks on the host); release() and reduce() order the engine's use of the
// buffers after the work enqueued on the compute stream so far, so the model may enqueue its
// kernels and call them without synchronizing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "core/config.h"
#include "core/dtype.h"
#include "core/status.h"
#include "gpu/device.h"
#include "zero/local_ranks.h"  // run_local_ranks, which callers of the model API use to run ranks

namespace tz::store {
struct IoHooks;  // store/stack.h
}

namespace tz::zero {

using UnitId = std::uint32_t;

// One parameter tensor of a unit: a name unique within the unit ("attn.c_attn.weight") and its
// shape (row-major; numel = product of the dims, > 0).
struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t numel() const;
};

// A unit: the unit of flattening, sharding, gathering and offload (as FSDP's flat parameter per
// block). Its tensors are laid out in order in one flat buffer, each starting at a multiple of
// kTensorAlignElems elements; the flat buffer is padded so that it splits into world_size equal
// shards whose byte sizes suit O_DIRECT (multiples of 4 KiB in every dtype the engine keeps).
//
// A frozen unit (a LoRA base's block) is registered without gradients, fp32 master weights or
// optimizer state. Its parameters are stored only in the compute dtype (bf16/fp16, or fp32 when
// compute is fp32), sharded like other units' parameters, at the tier offload_param says (device,
// host, NVMe), gathered and released as today, and never reduced, updated or written back to
// their home tier after set_tensor (the store keeps its blocks read-only: never dirty, dropped
// rather than written on eviction). grad()/reduce() on it are kInvalidArgument naming the unit (a
// model bug: backward through a frozen unit computes input gradients only). set_tensor(kMaster)
// sets its compute-dtype parameters (rounded as other units' 16-bit copies are); get_tensor(
// kMaster) returns them widened to fp32; optimizer states are kInvalidArgument. Norms, clipping,
// overflow checks, the optimizer, the overlap modes, params_xxh3 and checkpoints see only
// trainable units.
struct UnitSpec {
  std::string name;  // unique ("h.3", "wte"); names errors and store blocks
  std::vector<TensorSpec> tensors;
  bool frozen = false;
};
inline constexpr std::size_t kTensorAlignElems = 128;  // 256 bytes of 16-bit elements

// A unit's flat layout (tensor offsets, padding, shard size): zero/layout.h.
struct UnitLayout;

// A typed view of one tensor inside a gathered unit or a gradient buffer: a device pointer of
// `dtype` elements, valid until the matching release() / reduce().
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kBF16;
  const TensorSpec* spec = nullptr;
  std::size_t numel() const { return spec->numel(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// What gather() and grad() hand out: one view per tensor of the unit, in registration order.
struct UnitViews {
  std::vector<TensorView> tensors;
  const TensorView& operator[](std::size_t i) const { return tensors[i]; }
  // The view of the tensor named `name`; a programmer error (assert) when there is none.
  const TensorView& by_name(std::string_view name) const;
};

// Where each kind of state lives, as the config's offload sections say.
enum class Placement : std::uint8_t { kDevice, kHost, kNvme };
std::string_view placement_name(Placement placement);

struct EngineOptions {
  Config config;            // the resolved DeepSpeed-style config (stage, precision, optimizer,
                            // scheduler, clipping, accumulation, offload, budgets, overlap)
  std::string nvme_path;    // overrides both offload sections' nvme_path when non-empty
  std::uint64_t host_budget_bytes = 0;  // overrides tierzero.host_budget when non-zero
  // Bytes of activations the model will keep on the device per micro-batch (its own
  // allocations): counted in the plan's device term so plan and measured peak compare.
  std::uint64_t activation_bytes = 0;
  std::uint64_t seed = 1234;  // the engine's own randomness (none today; reserved for dropout)
  // Hooks on the swap space's I/O (fault tests: store/stack.h); empty = none.
  std::shared_ptr<const store::IoHooks> io_hooks;
  // Bandwidths for StepReport::bound_s (measured by the caller, e.g. bench zero); 0 = unknown,
  // the term is left out of the bound.
  double nvme_read_bytes_per_s = 0;
  double nvme_write_bytes_per_s = 0;
  double copy_bytes_per_s = 0;  // host <-> device
  // Host memory a caller holds beside the engine's for a while after the plan is checked (`train`
  // and `bench zero` measure the bound's bandwidths then: cli/bench_common.h
  // engine_ceilings_host_bytes), given whether the device is host memory; counted among the
  // plan's process terms. Empty: none.
  std::function<std::uint64_t(bool device_is_host_memory)> probe_host_bytes;
};

// Which per-parameter value get_tensor/set_tensor move: the fp32 master weights or one of the
// optimizer's state arrays (Adam: kState0 = m, kState1 = v; SGD momentum, Lion m, Adagrad sum:
// kState0), always as fp32 whatever the state dtype.
enum class TensorState : std::uint8_t { kMaster, kState0, kState1 };
std::string_view tensor_state_name(TensorState which);

// Per-tier byte counts (device, host, NVMe).
struct TierBytes {
  std::uint64_t device = 0;
  std::uint64_t host = 0;
  std::uint64_t nvme = 0;
  nlohmann::ordered_json to_json() const;
};

// The terms of a step's lower bound (DESIGN.md; docs/zero.md, "Accounting"), in seconds. A term
// below 0 is unknown (its bandwidth was not measured) or does not apply (the shared-cores union
// off a host-memory device); it is left out of the bound and written as null in JSON.
struct BoundTerms {
  double compute_s = 0;    // the model's own work
  double optimizer_s = 0;  // the CPU optimizer and host gradient accumulation
  // On a host-memory device (shared_cores): the time in the step's window during which this
  // process's cores ran a HostDevice compute stream's work or the CPU optimizer, whichever rank's
  // (core/busy_union.h BusyUnion::host_cores()): the two counted once where they overlap.
  double shared_busy_s = -1;
  // NVMe read bytes / read bandwidth + write bytes / write bandwidth, over the run's raise of the
  // probe's bandwidths (StepReport::nvme_ceiling_scale)
  double nvme_s = -1;
  double copy_s = -1;  // host <-> device bytes / copy bandwidth
  // Compute and the CPU optimizer run on the same cores (a host-memory device).
  bool shared_cores = false;
  // {"compute", "optimizer", "shared_busy", "nvme", "copy"}: seconds, null where below 0.
  nlohmann::ordered_json to_json() const;
};

// One swap path's block device during a step, as the kernel counts it (/proc/diskstats): every
// process's I/O on the device, the store's among it (docs/train.md, "Output").
struct DiskStep {
  std::string device;              // "vda", "nvme0n1p2"
  double busy_fraction = 0;        // of the step's time with a request at the device (io_ticks)
  double mean_in_flight = 0;       // requests at the device on average (time_in_queue / step)
  std::uint64_t read_bytes = 0;    // read from the device during the step
  std::uint64_t write_bytes = 0;   // written to it
};

// What one optimizer step did and cost, on this rank.
struct StepReport {
  std::int64_t step = 0;          // 1-based count of optimizer steps taken (skipped ones too)
  bool skipped = false;           // an Inf/NaN gradient: no update on any rank, scale lowered
  // tierzero.overlap "eager": the early updates were undone (the step clipped or overflowed) and
  // the step was redone exactly or skipped.
  bool rolled_back = false;
  double grad_norm = 0;           // global L2 norm of the unscaled gradient (before clipping)
  double lr = 0;                  // learning rate the update used (after the schedule)
  double loss_scale = 1;          // scale the step's backward used (1 without fp16)
  double step_s = 0;              // wall time from the previous step() (or first gather) to now
  double bound_s = 0;             // the step's lower bound (DESIGN.md) from this step's bytes
  // The term that set bound_s: "compute" (the model's work; on a host-memory device, where the
  // CPU optimizer shares the cores, the union of the two's busy time, BoundTerms::shared_busy_s),
  // "optimizer" (the CPU optimizer, on a device with cores of its own), "nvme" (NVMe bytes at the
  // measured disk bandwidths) or "copy" (host <-> device bytes at the copy bandwidth). Terms whose
  // bandwidth is 0 never set it.
  std::string bound_term = "compute";
  BoundTerms bound_terms;  // what bound_s was the max of
  // The factor by which this run's steps so far showed the disk faster than the bandwidth probe
  // (1: the probe held); BoundTerms::nvme_s is the bytes at the probe's bandwidths over it
  // (docs/train.md, "The step's bound").
  double nvme_ceiling_scale = 1;
  double stall_s = 0;             // time the rank's thread waited, by cause below
  double stall_gather_s = 0;
  double stall_reduce_s = 0;
  double stall_optimizer_s = 0;
  TierBytes bytes_in_use;         // now
  TierBytes peak_bytes;           // since the engine was created
  std::uint64_t nvme_read_bytes = 0;   // during this step
  std::uint64_t nvme_write_bytes = 0;  // during this step
  // Of those, the gradient accumulators' (0 unless they are homed on NVMe): bytes loaded
  // into the host cache from NVMe and written home. Each is written home at most once a step and
  // read back at most once, by its update: the norm is taken at the reduce, a zeroed one is
  // neither read nor written (Store::zero) and the first reduce of a step writes it unread.
  std::uint64_t gradient_nvme_read_bytes = 0;
  std::uint64_t gradient_nvme_write_bytes = 0;
  // Of nvme_write_bytes, those whose checksums the CPU optimizer took while it wrote them, in its
  // cache (store::Lease::release_hashed): the store wrote them without reading them again to hash.
  std::uint64_t writer_hashed_bytes = 0;
  // tierzero.overlap exact with the optimizer on NVMe: bytes of the update's first units' master
  // and optimizer states loaded from NVMe into the host during the backward, which reads them
  // ahead of the update (it must wait for the global norm; docs/zero.md, "exact, streamed"):
  // every load of those blocks into the host tier done between the backward's first reduce and
  // the step's decision (one still in flight then is not counted). eager with the worker and the
  // optimizer on NVMe: those of the backward's first units that were not kept, read ahead in the
  // forward once the previous step's queue of early updates was done: every load of those blocks
  // into the host tier between then and the step's first reduce (docs/zero.md, "eager").
  std::uint64_t state_read_ahead_bytes = 0;
  // The store followed the previous step's access trace through the whole step, so its prefetch
  // walk and Belady's eviction worked (docs/store.md, "Policies"); false for the first step and
  // for a step whose pins came in another order (the store fell back to LRU).
  bool trace_followed = false;
  // CPU seconds (user + system) the process used during the step, every thread of it (with
  // --ranks N as threads: all ranks'). Over step_s and the cores it says how busy the machine's
  // cores were, whatever the work: kernels, the CPU optimizer, the store's copies and checksums.
  double process_cpu_s = 0;
  // The swap paths' block devices during the step, one entry per device; empty without NVMe
  // offload or when the swap paths are on no block device (tmpfs, overlayfs). A device busy
  // well below 1 while the step waits for NVMe is not the disk's limit but the store's.
  std::vector<DiskStep> disks;
  // Bytes written into the home copies (whatever their tier) of frozen units' parameter blocks
  // and of trainable units' blocks (parameters, masters, states, gradient shards) during this
  // step, as the store counts them (store::BlockStats::home_write_bytes). The first is 0: a frozen
  // unit's parameters are written home once, when set_tensor loads them (the engine flushes
  // those writes before the next gather, grad or step, outside any step's window).
  std::uint64_t frozen_home_write_bytes = 0;
  std::uint64_t trainable_home_write_bytes = 0;
  // Bytes this rank sent per collective during this step, next to DESIGN.md's formula.
  nlohmann::ordered_json comm_bytes;
  nlohmann::ordered_json comm_formula_bytes;
};

class Engine {
 public:
  // `device` and `comm` must outlive the engine; comm's world size is the data-parallel degree.
  // Errors: kInvalidArgument naming the config key for a combination the engine does not support
  // (offload_param without stage 3, nvme offload without a path, ...); the store's, the
  // optimizer's and the swap space's errors.
  static Result<std::unique_ptr<Engine>> create(const EngineOptions& options, gpu::Device& device,
                                                comm::Comm& comm);
  virtual ~Engine() = default;

  // --- Registration (before finalize) ---------------------------------------------------------
  // Adds a unit; units are used in any order later, but registration order is the default
  // prefetch order before a trace exists. kInvalidArgument for a duplicate name, no tensors or a
  // zero-sized tensor.
  virtual Result<UnitId> register_unit(UnitSpec spec) = 0;
  // Plans every shard and buffer and allocates them (kOutOfMemory / kNoSpace naming the tier,
  // what is needed and the budget, when the state does not fit). Parameters start at zero.
  virtual Status finalize() = 0;

  // --- Weights in and out (after finalize; collective: every rank calls with the same args) --
  // Sets `which` of tensor `tensor` of `unit` from its full fp32 value (`values` holds numel
  // elements, the same on every rank); each rank keeps its shard. Setting kMaster also refreshes
  // the 16-bit parameters; the optimizer states are left as they are (zero after finalize).
  virtual Status set_tensor(UnitId unit, std::size_t tensor, std::span<const float> values,
                            TensorState which = TensorState::kMaster) = 0;
  // Gathers the full fp32 value of `which` of a tensor from every rank's shard into `out`
  // (numel elements) on every rank. kInvalidArgument for a state the optimizer does not keep.
  virtual Status get_tensor(UnitId unit, std::size_t tensor, std::span<float> out,
                            TensorState which = TensorState::kMaster) = 0;
  // Loading by parts, so a rank reads only what it keeps (model/hf_folder.h). tensor_range: the
  // elements [first, end) of tensor `tensor` of `unit` this rank keeps: the whole tensor at stages
  // 0-2 (every rank holds the full 16-bit parameters there), its shard's part at stage 3 (maybe
  // empty). set_tensor_slice: sets elements [first_elem, first_elem + values.size()) of `which`
  // on this rank only (NOT collective; any rank may call it any number of times): the part inside
  // this rank's range is kept, the rest ignored; setting every element of the range by slices
  // leaves the rank as set_tensor of the full value would. kInvalidArgument for an unknown unit or
  // tensor, a slice past the tensor, or a state the optimizer does not keep.
  virtual std::pair<std::size_t, std::size_t> tensor_range(UnitId unit,
                                                           std::size_t tensor) const = 0;
  virtual Status set_tensor_slice(UnitId unit, std::size_t tensor, std::size_t first_elem,
                                  std::span<const float> values,
                                  TensorState which = TensorState::kMaster) = 0;
  // The engine's scalar state (steps done, loss scaler, schedule position) for checkpoints, and
  // its restore (same config; before the first step).
  virtual nlohmann::ordered_json scalar_state() const = 0;
  virtual Status restore_scalar_state(const nlohmann::json& state) = 0;

  // --- One micro-batch ------------------------------------------------------------------------
  // The unit's full parameters in compute_dtype() on the device. The compute stream waits for
  // them; gathering a unit already gathered adds a reference (each gather needs its release).
  virtual Result<UnitViews> gather(UnitId unit) = 0;
  virtual Status release(UnitId unit) = 0;
  // The unit's full gradient buffer in compute_dtype(), zeroed, on the device: the model writes
  // (or accumulates into) d(loss_scale() * micro-batch mean loss)/d(param). One per unit at a
  // time; the same views are returned until reduce().
  virtual Result<UnitViews> grad(UnitId unit) = 0;
  // Reduces the unit's gradient across ranks (the same padded reduce-scatter in every stage) and
  // moves this rank's gradient shard home, accumulating in fp32 over micro-batches. The buffer is
  // returned to the engine. Exactly one reduce() per unit per micro-batch.
  virtual Status reduce(UnitId unit) = 0;
  // Ends an optimizer step after gradient_accumulation_steps micro-batches: overflow check,
  // global norm and clipping, loss-scale update, schedule, the update (where the config puts it,
  // in the configured overlap mode) and the new 16-bit parameters sent where the next forward
  // finds them. Errors name the unit, the rank and what failed; after an error the engine's state
  // of every earlier completed step is intact.
  virtual Result<StepReport> step() = 0;

  // --- What the model needs to know ---------------------------------------------------------
  virtual gpu::Device& device() = 0;
  virtual gpu::Stream& compute_stream() = 0;
  virtual DType compute_dtype() const = 0;    // bf16, fp16 or fp32, from the config
  virtual double loss_scale() const = 0;      // multiply the loss by this before backward
  virtual int gradient_accumulation_steps() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::int64_t steps_done() const = 0;  // optimizer steps completed (skipped included)
  virtual std::uint64_t param_count() const = 0;  // sum of every unit's numel (unpadded)
  // The same over trainable (not frozen) units only: what the optimizer updates.
  virtual std::uint64_t trainable_param_count() const = 0;
  // The registered units (for checkpoints): count, spec and flat layout of each (include
  // zero/layout.h for UnitLayout's members), the optimizer's state-array count (0, 1 or 2:
  // cpu::state_count of the spec) and the options the engine was created with.
  virtual std::size_t unit_count() const = 0;
  virtual const UnitSpec& unit_spec(UnitId unit) const = 0;
  virtual const UnitLayout& layout(UnitId unit) const = 0;
  virtual int optimizer_state_count() const = 0;
  virtual const EngineOptions& options() const = 0;
  // The bandwidths of StepReport::bound_s after creation (EngineOptions::nvme_read_bytes_per_s,
  // nvme_write_bytes_per_s, copy_bytes_per_s; 0 = unknown, the term is left out): a caller may
  // measure them once finalize() has checked the plan, so that a run the plan refuses spends no
  // time on the probe. Between steps (the next step's bound uses them).
  virtual void set_bound_bandwidths(double nvme_read_bytes_per_s, double nvme_write_bytes_per_s,
                                    double copy_bytes_per_s) = 0;

  // --- Accounting -------------------------------------------------------------------------------
  // The plan (what finalize allocated per tier, by term) and DESIGN.md's formula for the config.
  virtual nlohmann::ordered_json plan_json() const = 0;
  virtual TierBytes plan_bytes() const = 0;
  virtual TierBytes peak_bytes() const = 0;
  // xxHash3 of every rank's fp32 master weights gathered in unit order (collective), so runs can
  // be compared bit for bit. Trainable units only: a frozen base is never changed by training,
  // so an adapter's hash compares across stages and offloads whatever the base's placement.
  virtual Result<std::uint64_t> params_xxh3() = 0;

 protected:
  Engine() = default;
};

}  // namespace tz::zero
