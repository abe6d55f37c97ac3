// The engine's memory plan as a pure function: from the config, the units' flat layouts, the
// world size and the budgets, every byte the engine will hold per tier, by term, and the options
// of the store, the pinned pool and the swap space that finalize() creates from it. Engine and
// `tierzero estimate` call the same function, so what estimate predicts is what the engine plans.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/dtype.h"
#include "core/status.h"
#include "cpu/pinned_pool.h"
#include "store/stats.h"
#include "store/store.h"
#include "zero/engine.h"
#include "zero/layout.h"

namespace tz::zero {

// Everything the plan depends on besides the config's sizes (prefetch bucket, persistence
// threshold, budgets, aio block size) and the units.
struct PlanInputs {
  int stage = 0;                            // 0..3
  DType compute_dtype = DType::kBF16;       // the 16-bit (or fp32) parameters and gradients
  Placement optimizer = Placement::kDevice;  // fp32 master and optimizer states
  Placement param = Placement::kDevice;      // parameters (kHost/kNvme only at stage 3)
  Placement grad = Placement::kDevice;       // the gradient shards: with the optimizer
  int optimizer_states = 2;                 // state arrays beside the master (Adam 2, SGD 0-1)
  int world_size = 1;
  std::uint64_t activation_bytes = 0;       // EngineOptions::activation_bytes
  std::uint64_t host_budget_bytes = 0;      // EngineOptions override; 0 = tierzero.host_budget
  std::uint64_t device_budget_bytes = 0;    // the device's own budget (tierzero.device_budget
                                            // wins when non-zero)
  std::size_t nvme_paths = 1;               // swap files the NVMe-homed state is striped over
  // The process's memory before the engine holds any (process_baseline_bytes()); 0 leaves the
  // term out (a plan of the tiers alone).
  std::uint64_t process_baseline_bytes = 0;
  // Host memory a caller holds beside the engine's after the plan is checked
  // (EngineOptions::probe_host_bytes); 0 leaves the term out.
  std::uint64_t probe_host_bytes = 0;
  // GPU library memory on CudaDevice (gpu/workspaces.h): cuBLAS's workspace (from the device
  // pool) and NCCL's buffers (its own, an estimate); 0 on HostDevice.
  std::uint64_t cublas_workspace_bytes = 0;
  std::uint64_t nccl_buffer_bytes = 0;
};

// The dtype of the gradient shards (the accumulators the reduce writes and the update reads)
// homed at `home`: fp32 where a step adds micro-batches or the device holds them; with one
// micro-batch a step a host- or NVMe-homed shard is the reduced compute-dtype gradient itself,
// so it is kept in that dtype: the same values in half the bytes to hold, spill and read back.
DType gradient_accumulator_dtype(DType compute_dtype, Placement home,
                                 std::uint64_t accumulation_steps);

// Whether a stage-3 gather pins the unit's shard in the device tier and computes on it (as
// stages 0-2 pin their full blocks) instead of all-gathering into a buffer: on one rank the shard
// is the whole unit, so the all-gather would be a copy of it. Persistent units keep their buffer.
inline bool gather_pins_shard(int stage, int world_size) { return stage == 3 && world_size == 1; }

// What the engine's init() derives from the options: stage, precision, placements and the
// optimizer's state count. The same kInvalidArgument errors as Engine::create for a bad stage,
// offload device, parameter offload below stage 3, fp16 with bf16 or an unknown optimizer.
// `world_size` >= 1; `device_budget_bytes` as in PlanInputs; nvme_paths from swap_paths().
Result<PlanInputs> plan_inputs(const EngineOptions& options, int world_size,
                               std::uint64_t device_budget_bytes);

// The store's bound on NVMe bytes in flight (StoreOptions::max_io_in_flight_bytes) for jobs of
// `chunk_bytes` over `paths` swap files: twice what the kernel holds (aio.queue_depth requests
// per file), so that a reap refills the kernel's queue at once from the engine's own, and at
// least four chunks. gpt2-774m with both offloads on NVMe, eager: the disk waited for the store's
// mover between completions at one depth (bench/RESULTS.md, seventeenth session).
std::uint64_t io_in_flight_bytes(const Config& config, std::size_t paths,
                                 std::uint64_t chunk_bytes);

// The directories the swap files go to, as the engine picks them: EngineOptions::nvme_path when
// set, else the nvme_path of each offload section whose device is nvme (each path once).
std::vector<std::string> swap_paths(const EngineOptions& options);

// One line of the plan: `bytes` held in `tier` for one purpose. Names are stable (plan_json keys,
// `tierzero estimate` rows).
struct PlanTerm {
  store::Tier tier = store::Tier::kDevice;
  std::string name;
  std::uint64_t bytes = 0;
};

struct MemoryPlan {
  std::vector<PlanTerm> terms;  // per tier, in the order plan_json lists them
  TierBytes home;               // bytes of the units' blocks by home tier
  // Per unit (same order as the layouts): stage 3, below stage3_param_persistence_threshold
  // elements, so gathered once per step and kept.
  std::vector<bool> persistent;
  // Where the gradient shards are homed: PlanInputs::grad, or NVMe when the optimizer is
  // there and a configured host budget cannot hold them beside the host tier's minimum.
  Placement grad = Placement::kDevice;
  DType grad_dtype = DType::kF32;  // their dtype (gradient_accumulator_dtype)
  std::uint64_t device_budget_bytes = 0;  // resolved: tierzero.device_budget or the device's
  std::uint64_t host_budget_bytes = 0;    // resolved: the override, tierzero.host_budget or the
                                          // default (host-homed state + NVMe working set)
  store::StoreOptions store;              // budgets, chunk and staging of the tiered store
  PinnedPoolOptions pool;                 // the engine's pinned pool (budget = host plan + slack)
  std::uint64_t stage16_bytes = 0;        // engine host staging: one 16-bit unit
  std::uint64_t stage32_bytes = 0;        // and one fp32 unit
  std::uint64_t swap_bytes_per_path = 0;  // 0 when nothing is homed on NVMe
  std::uint64_t swap_stripe_bytes = 0;
  // tierzero.overlap's buffers (eager's rollback snapshot, delayed's pending update), also a
  // term; 0 in exact mode or for eager without clipping and fp16.
  std::uint64_t overlap_bytes = 0;
  // The pinned pool the mode allocates its host buffers from: overlap_bytes plus one largest
  // buffer per slab (a buffer never spans two slabs), that slack a process term.
  PinnedPoolOptions overlap_pool{.budget_bytes = 0};  // budget 0: no host buffers

  // Host memory the process holds outside the store's tiers (docs/estimate.md, "The process's
  // memory"): its baseline and the pinned pool's slack. Kept apart from the host tier, which
  // tierzero.host_budget bounds and Engine::peak_bytes() measures; the process's peak RSS is
  // planned as device (on a host-memory device) + host + these.
  std::vector<PlanTerm> process;

  std::uint64_t tier_bytes(store::Tier tier) const;  // sum of the tier's terms
  TierBytes bytes() const;                           // every tier's sum
  std::uint64_t process_bytes() const;               // sum of `process`
};

// The resident memory (VmRSS) of this process the first time it is called: the binary, the
// shared libraries and their static data, and whatever the process held by then. The engine
// calls it when it is created, `tierzero estimate` before it plans; 0 where /proc cannot be read.
std::uint64_t process_baseline_bytes();

// The plan for `units` (the registered units' layouts, in registration order, for
// `in.world_size` ranks). kOutOfMemory naming the tier, the bytes needed and the budget (and the
// setting to change) when the device tier's irreducible minimum exceeds the device budget or the
// host tier's the host budget; kInvalidArgument for an empty unit list. The engine homes the
// gradient shards where MemoryPlan::grad says.
Result<MemoryPlan> plan_memory(const PlanInputs& in, const Config& config,
                               std::span<const UnitLayout> units);

// The store tier a placement names.
store::Tier tier_of(Placement p);
// An offload section's device ("none", "cpu", "nvme") as a placement; kInvalidArgument naming
// `key` otherwise.
Result<Placement> parse_offload(const std::string& device, const char* key);

// DESIGN.md's memory table for the inputs: params es*Φ, grads es*Φ, optimizer 4*(1+states)*Φ;
// stage 1 divides the optimizer by N, stage 2 also the gradients, stage 3 also the parameters;
// each term counted in the tier its placement names. With bf16 and Adam: 4Φ+12Φ/N, 2Φ+14Φ/N,
// 16Φ/N, and 16Φ at stage 0. `frozen_params` of the `params` (UnitSpec::frozen) count in the
// parameter term only: a bf16 base at stage 3 adds 2Φ_frozen/N where offload_param says.
TierBytes formula_bytes(const PlanInputs& in, std::uint64_t params,
                        std::uint64_t frozen_params = 0);

}  // namespace tz::zero
