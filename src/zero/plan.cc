// The engine's memory plan (plan.h): the per-tier terms and the store, pool and swap options,
// computed from the config and the units' layouts alone, so the engine's finalize() and
// `tierzero estimate` agree byte for byte. docs/estimate.md lists the terms and why each is sized
// as it is.
#include "zero/plan.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <string>

#include "core/assert.h"
#include "cpu/optimizer.h"
#include "gpu/device.h"
#include "store/stack.h"

namespace tz::zero {
namespace {

using store::Tier;

std::uint64_t round_up(std::uint64_t x, std::uint64_t m) { return (x + m - 1) / m * m; }

int tier_index(Placement p) { return static_cast<int>(tier_of(p)); }

// The engine's scalar buffers: every rank's values as four 16-bit pieces of two scalars.
constexpr std::uint64_t kScalarPieces = 4;

// The sum of the `k` largest values (all of them when there are fewer).
std::uint64_t largest_sum(std::vector<std::uint64_t> v, std::size_t k) {
  const std::size_t n = std::min(k, v.size());
  std::partial_sort(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n), v.end(),
                    std::greater<>());
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += v[i];
  return sum;
}

}  // namespace

Result<Placement> parse_offload(const std::string& device, const char* key) {
  if (device == "none") return Placement::kDevice;
  if (device == "cpu") return Placement::kHost;
  if (device == "nvme") return Placement::kNvme;
  return Status::invalid_argument(std::string(key) + ": expected none, cpu or nvme, got '" +
                                  device + "'");
}

Tier tier_of(Placement p) {
  switch (p) {
    case Placement::kDevice:
      return Tier::kDevice;
    case Placement::kHost:
      return Tier::kHost;
    case Placement::kNvme:
      return Tier::kNvme;
  }
  return Tier::kHost;
}

std::vector<std::string> swap_paths(const EngineOptions& options) {
  std::vector<std::string> paths;
  auto add = [&paths](const std::string& p) {
    if (!p.empty() && std::find(paths.begin(), paths.end(), p) == paths.end()) paths.push_back(p);
  };
  const ZeroConfig& z = options.config.zero;
  if (!options.nvme_path.empty()) {
    add(options.nvme_path);
  } else {
    if (z.offload_optimizer.device == "nvme") add(z.offload_optimizer.nvme_path);
    if (z.offload_param.device == "nvme") add(z.offload_param.nvme_path);
  }
  return paths;
}

DType gradient_accumulator_dtype(DType compute_dtype, Placement home,
                                 std::uint64_t accumulation_steps) {
  return accumulation_steps == 1 && home != Placement::kDevice ? compute_dtype : DType::kF32;
}

std::uint64_t io_in_flight_bytes(const Config& config, std::size_t paths,
                                 std::uint64_t chunk_bytes) {
  // The engine's capacity: aio.queue_depth requests per swap file, as the swap space opens it.
  const std::uint64_t kernel = store::swap_queue_requests(config, paths);
  return std::max(2 * kernel * chunk_bytes, 4 * chunk_bytes);
}

Result<PlanInputs> plan_inputs(const EngineOptions& options, int world_size,
                               std::uint64_t device_budget_bytes) {
  const Config& c = options.config;
  PlanInputs in;
  in.stage = c.zero.stage;
  if (in.stage < 0 || in.stage > 3) {
    return Status::invalid_argument("zero_optimization.stage: expected 0..3, got " +
                                    std::to_string(in.stage));
  }
  if (c.fp16.enabled && c.bf16) {
    return Status::invalid_argument("fp16.enabled and bf16.enabled: choose one");
  }
  in.compute_dtype = c.fp16.enabled ? DType::kF16 : c.bf16 ? DType::kBF16 : DType::kF32;
  TZ_ASSIGN_OR_RETURN(in.optimizer, parse_offload(c.zero.offload_optimizer.device,
                                                  "zero_optimization.offload_optimizer.device"));
  TZ_ASSIGN_OR_RETURN(in.param, parse_offload(c.zero.offload_param.device,
                                              "zero_optimization.offload_param.device"));
  if (in.param != Placement::kDevice && in.stage != 3) {
    return Status::invalid_argument(
        "zero_optimization.offload_param.device: parameter offload needs "
        "zero_optimization.stage 3 (got stage " + std::to_string(in.stage) + ")");
  }
  in.grad = in.optimizer == Placement::kDevice ? Placement::kDevice : Placement::kHost;
  TZ_ASSIGN_OR_RETURN(cpu::OptimizerSpec spec, cpu::spec_from_config(c));
  in.optimizer_states = cpu::state_count(spec);
  in.world_size = world_size;
  in.activation_bytes = options.activation_bytes;
  in.host_budget_bytes = options.host_budget_bytes;
  in.device_budget_bytes = device_budget_bytes;
  in.nvme_paths = std::max<std::size_t>(1, swap_paths(options).size());
  return in;
}

std::uint64_t MemoryPlan::tier_bytes(store::Tier tier) const {
  std::uint64_t sum = 0;
  for (const PlanTerm& t : terms) {
    if (t.tier == tier) sum += t.bytes;
  }
  return sum;
}

std::uint64_t MemoryPlan::process_bytes() const {
  std::uint64_t sum = 0;
  for (const PlanTerm& t : process) sum += t.bytes;
  return sum;
}

std::uint64_t process_baseline_bytes() {
  static const std::uint64_t baseline = [] {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::uint64_t{std::stoull(line.substr(6))} * 1024;
    }
    return std::uint64_t{0};
  }();
  return baseline;
}

TierBytes MemoryPlan::bytes() const {
  TierBytes b;
  b.device = tier_bytes(Tier::kDevice);
  b.host = tier_bytes(Tier::kHost);
  b.nvme = tier_bytes(Tier::kNvme);
  return b;
}

namespace {

// What one unit holds, block by block: the one place a unit's state is sized, so a kind of unit
// that holds less (no gradient, no optimizer state) changes this function and nothing else.
struct UnitBytes {
  std::uint64_t param = 0;      // compute-dtype parameters: this rank's shard at stage 3, the
                                // padded unit otherwise
  std::uint64_t grad = 0;       // the gradient shard (gradient_accumulator_dtype)
  std::uint64_t opt_elems = 0;  // elements master and states cover: the padded unit at stage 0,
                                // this rank's shard otherwise
  std::uint64_t optimizer = 0;  // fp32 master and states: opt_elems * 4 * (1 + states)
};

// A frozen unit (UnitSpec::frozen) holds its compute-dtype parameters only.
UnitBytes unit_bytes(const PlanInputs& in, const Config& config, const UnitLayout& u) {
  const std::uint64_t es = dtype_size(in.compute_dtype);
  const auto states = static_cast<std::uint64_t>(in.optimizer_states);
  UnitBytes b;
  b.param = (in.stage == 3 ? u.shard : u.padded) * es;
  if (u.frozen) return b;
  b.grad = static_cast<std::uint64_t>(u.shard) *
           dtype_size(gradient_accumulator_dtype(in.compute_dtype, in.grad,
                                                 config.gradient_accumulation_steps));
  b.opt_elems = in.stage == 0 ? u.padded : u.shard;
  b.optimizer = b.opt_elems * 4 * (1 + states);
  return b;
}

// Everything the terms are computed from, derived once from the inputs and the units.
struct PlanContext {
  const PlanInputs& in;
  const Config& config;
  std::span<const UnitLayout> units;
  std::uint64_t es = 0;
  std::vector<UnitBytes> unit = {};  // per unit, as `units`
  std::uint64_t max_padded = 0;            // largest trainable unit (staging, scratch)
  std::uint64_t max_frozen_gather = 0;     // stage 3: largest frozen unit's get_tensor buffer
  std::uint64_t max_param_block = 0;       // largest parameter block (frozen ones included)
  std::uint64_t max_opt = 0;                      // largest opt_elems
  std::uint64_t home[store::kTierCount] = {0, 0, 0};  // bytes of the blocks by home tier
  // Stage 3: units gathered and released at each use, and the bytes of those kept gathered.
  std::vector<std::uint64_t> streamed_padded = {};
  std::vector<std::uint64_t> grad_padded = {};  // trainable units: those with gradient buffers
  std::uint64_t persistent_bytes = 0;
  // tierzero.overlap's buffers (docs/zero.md, "Overlap modes").
  bool delayed = false;
  bool snapshot = false;            // eager with clipping or fp16: a rollback snapshot
  bool snapshot_on_device = false;  // with the optimizer on the device
};

PlanContext make_context(const PlanInputs& in, const Config& config,
                         std::span<const UnitLayout> units, MemoryPlan& plan) {
  PlanContext c{.in = in, .config = config, .units = units};
  c.es = dtype_size(in.compute_dtype);
  for (const UnitLayout& u : units) {
    const UnitBytes b = unit_bytes(in, config, u);
    c.unit.push_back(b);
    c.max_param_block = std::max(c.max_param_block, b.param);
    if (u.frozen) {
      if (in.stage == 3) c.max_frozen_gather = std::max(c.max_frozen_gather, u.padded * c.es);
    } else {
      c.max_padded = std::max<std::uint64_t>(c.max_padded, u.padded);
      c.grad_padded.push_back(u.padded);
    }
    c.max_opt = std::max(c.max_opt, b.opt_elems);
    c.home[tier_index(in.param)] += b.param;
    c.home[tier_index(in.optimizer)] += b.optimizer;
    c.home[tier_index(in.grad)] += b.grad;
    // Stage 3: units below stage3_param_persistence_threshold elements stay gathered.
    const bool persistent =
        in.stage == 3 && u.numel < config.zero.stage3_param_persistence_threshold;
    plan.persistent.push_back(persistent);
    if (persistent) {
      c.persistent_bytes += u.padded * c.es;
    } else {
      c.streamed_padded.push_back(u.padded);
    }
  }
  plan.home.device = c.home[0];
  plan.home.host = c.home[1];
  plan.home.nvme = c.home[2];
  const std::string& overlap = config.tierzero.overlap;
  c.delayed = overlap == "delayed";
  c.snapshot = overlap == "eager" && (config.gradient_clipping > 0 || config.fp16.enabled);
  c.snapshot_on_device = c.snapshot && in.optimizer == Placement::kDevice;
  return c;
}

void add_term(MemoryPlan& plan, Tier tier, std::string name, std::uint64_t bytes) {
  plan.terms.push_back(PlanTerm{tier, std::move(name), bytes});
}

// The device tier's terms, the shard cache at 0 (sized by size_device_cache); returns the
// cache's index in plan.terms.
std::size_t add_device_terms(const PlanContext& c, MemoryPlan& plan) {
  add_term(plan, Tier::kDevice, "home blocks (parameters, optimizer state, gradient shards)",
           c.home[0]);
  const std::size_t cache_index = plan.terms.size();
  add_term(plan, Tier::kDevice, "device cache of offloaded parameter shards", 0);
  add_term(plan, Tier::kDevice, "persistent gathered units (stage 3, below the threshold)",
           c.persistent_bytes);
  // A model holds at most two gathered units (GPT-2's tied wte and the current block) and two
  // gradient buffers (wte's lives through the backward) at once, plus one gathered unit released
  // while the compute stream still reads it: allocate_device() waits for such frees before the
  // device would pass the plan, so the caller runs ahead of the stream by one unit at most. A
  // gradient reduced on the device is freed the same way (a third buffer); one going to the host
  // (optimizer offloaded) is copied out synchronously and freed at once, so two are all there are.
  const bool grads_on_device = c.in.grad == Placement::kDevice;
  // On one rank a stage-3 gather computes on the shard pinned in the device tier (the cache or
  // its home there: shard_cache_range counts them), so there is no buffer to gather into.
  const bool buffered = c.in.stage == 3 && !gather_pins_shard(c.in.stage, c.in.world_size);
  const std::uint64_t gather = buffered ? largest_sum(c.streamed_padded, 3) * c.es : 0;
  const std::uint64_t grads = largest_sum(c.grad_padded, grads_on_device ? 3 : 2) * c.es;
  add_term(plan, Tier::kDevice, "gather buffers (3 largest units)", gather);
  add_term(plan, Tier::kDevice,
           grads_on_device ? "gradient buffers (3 largest units)"
                           : "gradient buffers (2 largest units)",
           grads);
  // Stage 0's gathered gradient (in step()) and get_tensor's fp32 unit (between steps) are never
  // live with the micro-batch buffers (step() refuses units still gathered or holding a
  // gradient; allocate_device() waits for the deferred frees when they would not fit beside
  // them), so only what they need beyond those buffers is counted. A frozen unit's get_tensor
  // all-gathers its compute-dtype parameters (stage 3).
  const std::uint64_t scratch = std::max(c.max_padded * 4, c.max_frozen_gather);
  add_term(plan, Tier::kDevice, "scratch beyond the buffers (stage-0 gradient, get_tensor)",
           scratch > gather + grads ? scratch - gather - grads : 0);
  add_term(plan, Tier::kDevice, "norm and scalar buffers",
           sizeof(gpu::NormAccumulator) +
               static_cast<std::uint64_t>(c.in.world_size) * 2 * kScalarPieces * 4);
  add_term(plan, Tier::kDevice, "model activations (EngineOptions::activation_bytes)",
           c.in.activation_bytes);
  // GPU libraries' memory (CudaDevice only, so HostDevice plans keep their terms).
  if (c.in.cublas_workspace_bytes > 0) {
    add_term(plan, Tier::kDevice, "cuBLAS workspace (cublasSetWorkspace, from the device pool)",
             c.in.cublas_workspace_bytes);
  }
  if (c.in.nccl_buffer_bytes > 0) {
    add_term(plan, Tier::kDevice,
             "NCCL buffers (estimate: NCCL_BUFFSIZE + LL + LL128 per channel and ring neighbour)",
             c.in.nccl_buffer_bytes);
  }
  return cache_index;
}

// The device cache's least and wanted bytes. Offloaded stage-3 shards are loaded into the
// device tier for gathering: the ones in use plus DeepSpeed's prefetch bucket
// (stage3_prefetch_bucket_size elements of the unit, this rank's 1/N of them), at most
// stage3_max_live_parameters, at most all of them. The walk needs two shards at once (the one
// gathered and the next loaded: the two largest); where the gather computes on the pinned shard
// (one rank: gather_pins_shard) the units the gather buffers would hold stay pinned there instead,
// so four (three gathered, as the gather buffers count, and the next loaded). Beyond those the
// cache shrinks to what the budget leaves, which changes only how often a shard is loaded again,
// not the math.
std::size_t cache_min_shards(const PlanInputs& in) {
  return gather_pins_shard(in.stage, in.world_size) ? 4 : 2;
}

struct CacheRange {
  std::uint64_t min = 0;
  std::uint64_t want = 0;
};

CacheRange shard_cache_range(const PlanContext& c) {
  if (c.in.stage != 3 || c.in.param == Placement::kDevice) return {};
  const ZeroConfig& z = c.config.zero;
  const std::uint64_t bucket =
      std::min(z.stage3_prefetch_bucket_size, z.stage3_max_live_parameters) /
      static_cast<std::uint64_t>(c.in.world_size) * c.es;
  std::vector<std::uint64_t> shards;
  std::uint64_t all = 0;
  for (const UnitLayout& u : c.units) {
    shards.push_back(u.shard * c.es);
    all += u.shard * c.es;
  }
  const std::uint64_t shard_bytes = largest_sum(shards, 1);
  CacheRange r;
  r.min = std::min(largest_sum(shards, cache_min_shards(c.in)), all);
  r.want = std::min(std::max<std::uint64_t>(r.min, round_up(bucket, shard_bytes)), all);
  return r;
}

// eager's rollback snapshot when it lives on the device with the optimizer: irreducible too.
std::uint64_t device_snapshot_bytes(const PlanContext& c) {
  if (!c.snapshot_on_device) return 0;
  std::uint64_t bytes = 0;
  for (const UnitBytes& b : c.unit) bytes += b.optimizer;
  return bytes;
}

// The refusal when the device tier's irreducible minimum passes the budget: every term at its
// least, named with its bytes, and the advice that starts with the largest of them.
Status device_refusal(const PlanContext& c, const MemoryPlan& plan, std::size_t cache_index,
                      std::uint64_t cache_min, std::uint64_t snapshot, std::uint64_t fixed) {
  std::vector<PlanTerm> terms = plan.terms;
  terms[cache_index].name = "device cache of offloaded parameter shards (" +
                            std::to_string(cache_min_shards(c.in)) + " largest shards)";
  terms[cache_index].bytes = cache_min;
  if (snapshot > 0) {
    terms.push_back(PlanTerm{Tier::kDevice,
                             "eager: rollback snapshot (master and optimizer states)", snapshot});
  }
  std::sort(terms.begin(), terms.end(),
            [](const PlanTerm& a, const PlanTerm& b) { return a.bytes > b.bytes; });
  std::string named;
  for (const PlanTerm& t : terms) {
    if (t.bytes == 0) continue;
    named += std::string(named.empty() ? "" : ", ") + t.name + " " + std::to_string(t.bytes);
  }
  std::string advice =
      c.home[0] > 0
          ? "offload the optimizer (zero_optimization.offload_optimizer.device cpu/nvme), raise "
            "zero_optimization.stage or offload the parameters"
      : snapshot > 0
          ? "offload the optimizer, turn gradient_clipping off, use tierzero.overlap \"exact\" or "
            "raise tierzero.device_budget"
          : "lower the micro batch or the sequence length (activations), split the largest "
            "units, or raise tierzero.device_budget";
  // The advice starts with the largest term: a plan that activations dominate is not helped
  // first by moving the optimizer.
  std::uint64_t activations = 0;
  for (const PlanTerm& t : plan.terms) {
    if (t.tier == Tier::kDevice && t.name.find("activations") != std::string::npos) {
      activations += t.bytes;
    }
  }
  if (c.home[0] > 0 && activations >= c.home[0]) {
    advice = "mostly activations (" + std::to_string(activations) +
             " bytes): turn on activation checkpointing (--checkpointing 1), lower the micro "
             "batch or the sequence length; then " + advice;
  }
  return Status::out_of_memory(
      "engine plan: the device tier needs at least " + std::to_string(fixed + cache_min) +
      " bytes, the irreducible minimum (" + named + "), over the device budget of " +
      std::to_string(plan.device_budget_bytes) + " bytes; " + advice);
}

// The device tier's irreducible terms first; the device cache of offloaded shards is the one
// tunable term and gets what the budget leaves after them (docs/estimate.md, "How the tunable
// terms are sized"). Returns the cache's bytes.
Result<std::uint64_t> size_device_cache(const PlanContext& c, MemoryPlan& plan,
                                        std::size_t cache_index) {
  const CacheRange cache = shard_cache_range(c);
  const std::uint64_t snapshot = device_snapshot_bytes(c);
  const std::uint64_t fixed = plan.tier_bytes(Tier::kDevice) + snapshot;
  if (fixed + cache.min > plan.device_budget_bytes) {
    return device_refusal(c, plan, cache_index, cache.min, snapshot, fixed);
  }
  const std::uint64_t bytes = std::min(cache.want, plan.device_budget_bytes - fixed);
  plan.terms[cache_index].bytes = bytes;
  return bytes;
}

// NVMe-homed blocks are worked on in the host tier: the largest unit's NVMe-homed state
// (optimizer state, parameter shard, gradient shard, as their homes say; a 16 KiB multiple), one
// unit of the units in flight.
std::uint64_t max_unit_nvme_bytes(const PlanContext& c) {
  std::uint64_t max_unit = 0;
  for (const UnitBytes& u : c.unit) {
    std::uint64_t b = 0;
    if (c.in.optimizer == Placement::kNvme) b += u.optimizer;
    if (c.in.param == Placement::kNvme) b += u.param;
    if (c.in.grad == Placement::kNvme) b += u.grad;
    max_unit = std::max(max_unit, round_up(b, 4096 * 4));
  }
  return max_unit;
}

// The store's chunk and staging, and the engine's host staging buffers next to it: a 16-bit
// unit (gradient shards coming home and parameter copies going out) and an fp32 unit (stage 0's
// gathered gradient). Returns the staging bytes, which a configured host budget includes.
std::uint64_t size_store_staging(const PlanContext& c, MemoryPlan& plan,
                                 std::uint64_t device_cache) {
  store::StoreOptions& so = plan.store;
  so.device_budget_bytes = c.home[0] + device_cache;
  so.chunk_bytes = std::clamp<std::uint64_t>(
      round_up(std::max(c.max_opt * 4, c.max_param_block), 4096), 64u << 10, 8u << 20);
  if (c.home[2] > 0) {
    so.chunk_bytes = std::min<std::uint64_t>(so.chunk_bytes, store::swap_block_bytes(c.config));
  }
  so.staging_buffers = 4;
  so.checksums = c.config.tierzero.nvme_checksums;
  so.max_io_in_flight_bytes = io_in_flight_bytes(c.config, c.in.nvme_paths, so.chunk_bytes);
  plan.stage16_bytes = round_up(c.max_padded * c.es, 4096);
  plan.stage32_bytes = round_up(c.max_padded * 4, 4096);
  return so.staging_buffers * so.chunk_bytes + plan.stage16_bytes + plan.stage32_bytes;
}

// The store's host budget. A configured host budget is the whole host tier: the store's blocks
// get what the staging buffers leave. Unset, the store gets the host-homed state and four units
// of NVMe-homed state in flight (the one updated, the next one read ahead, the previous one being
// written back, and one more for the forward's parameter loads). NVMe-homed state needs room for
// at least two units at once (the one worked on and the next read ahead).
Result<std::uint64_t> size_host_budget(const PlanContext& c, std::uint64_t staging_bytes) {
  const std::uint64_t max_unit_nvme = max_unit_nvme_bytes(c);
  const std::uint64_t host_need =
      round_up(c.home[1], 4096) + (c.home[2] > 0 ? 2 * max_unit_nvme : 0);
  const std::uint64_t configured =
      c.in.host_budget_bytes > 0 ? c.in.host_budget_bytes : c.config.tierzero.host_budget;
  if (configured == 0) return round_up(c.home[1], 4096) + 4 * max_unit_nvme + (1u << 20);
  if (configured < host_need + staging_bytes) {
    return Status::out_of_memory(
        "engine plan: the host tier needs at least " + std::to_string(host_need + staging_bytes) +
        " bytes (" + std::to_string(c.home[1]) + " of host-homed state, " +
        std::to_string(host_need - round_up(c.home[1], 4096)) +
        " for two units of NVMe-homed state, " + std::to_string(staging_bytes) +
        " of staging), over the host budget of " + std::to_string(configured) +
        " bytes; raise tierzero.host_budget or offload the optimizer to NVMe");
  }
  return configured - staging_bytes;
}

void add_host_and_nvme_terms(const PlanContext& c, MemoryPlan& plan) {
  const store::StoreOptions& so = plan.store;
  add_term(plan, Tier::kHost, "home blocks (host-homed state)", c.home[1]);
  // The store caches only NVMe-homed blocks in the host tier, so it holds at most all of them,
  // whatever room its budget leaves (a budget far above the NVMe state is not a fill).
  add_term(plan, Tier::kHost, "host cache of NVMe-homed blocks",
           std::min(plan.host_budget_bytes - c.home[1], c.home[2]));
  add_term(plan, Tier::kHost, "store staging buffers", so.staging_buffers * so.chunk_bytes);
  add_term(plan, Tier::kHost, "engine staging (16-bit unit, fp32 unit)",
           plan.stage16_bytes + plan.stage32_bytes);
  add_term(plan, Tier::kNvme, "home blocks (NVMe-homed state)", c.home[2]);
}

// A pinned pool that hands out `handed_out` bytes at once in buffers of at most `max_block`
// bytes. Its slack covers the 4 KiB rounding and fragmentation: a buffer never spans two slabs,
// and blocks of several sizes that come and go leave free pieces smaller than the next block; one
// largest block more per slab keeps a piece that fits.
PinnedPoolOptions pool_with_slack(std::uint64_t handed_out, std::uint64_t max_block) {
  const std::uint64_t block_slack = round_up(max_block, 4096);
  // Slabs of 1 GiB, or of 8 blocks when a block is over half of that (a 394 M-element
  // embedding's fp32 state is 1.6 GB): the slack of one block per slab then stays an eighth of
  // the pool, and the loop below converges (a slab no larger than its slack never does).
  const std::uint64_t slab_cap =
      2 * block_slack <= (1ull << 30) ? 1ull << 30 : round_up(8 * block_slack, 2u << 20);
  PinnedPoolOptions po;
  std::uint64_t slabs = 1;
  for (;;) {
    po.budget_bytes = handed_out + slabs * block_slack;
    po.slab_bytes = std::min(slab_cap, round_up(po.budget_bytes, 2u << 20));
    const std::uint64_t need = (po.budget_bytes + po.slab_bytes - 1) / po.slab_bytes;
    if (need <= slabs) break;
    slabs = need;
  }
  po.prefault = false;
  return po;
}

// The engine's pinned pool: the host plan and 2 MiB, with pool_with_slack's slack for the
// largest block the store moves. The plan's host term is what is handed out of it.
void size_pool(const PlanContext& c, MemoryPlan& plan) {
  std::uint64_t max_block = 0;
  for (const UnitBytes& u : c.unit) {
    max_block = std::max<std::uint64_t>({max_block, u.opt_elems * 4, u.grad, u.param});
  }
  plan.pool = pool_with_slack(plan.tier_bytes(Tier::kHost) + (2u << 20), max_block);
}

// The swap files: every block's extent is 4 KiB-rounded; stripes add at most one per path of
// slack each.
void size_swap(const PlanContext& c, MemoryPlan& plan) {
  if (c.home[2] == 0) return;
  const auto states = static_cast<std::uint64_t>(c.in.optimizer_states);
  plan.swap_stripe_bytes = store::default_swap_stripe_bytes();
  const std::uint64_t need = c.home[2] + c.units.size() * (states + 3) * 4096ull;
  plan.swap_bytes_per_path =
      round_up(need / c.in.nvme_paths + plan.swap_stripe_bytes, plan.swap_stripe_bytes) +
      4 * plan.swap_stripe_bytes;
}

// tierzero.overlap (docs/zero.md, "Overlap modes"): eager keeps a rollback snapshot of master
// and states when clipping or fp16 loss scaling can undo its early updates (device memory with
// the optimizer there, else pinned host memory); delayed keeps the pending update's gradient
// shards (UnitBytes::grad) and compute-dtype parameters in pinned host memory. Both come from
// their own pool beside the store's tiers, so nothing above depends on them.
void add_overlap_term(const PlanContext& c, MemoryPlan& plan) {
  if (!c.delayed && !c.snapshot) return;
  const bool on_device = c.snapshot_on_device;
  std::uint64_t max_block = 0;
  for (const UnitBytes& u : c.unit) {
    if (c.delayed) {
      const std::uint64_t grad = round_up(u.grad, 4096);
      const std::uint64_t param = round_up(u.opt_elems * c.es, 4096);
      plan.overlap_bytes += grad + param;
      max_block = std::max({max_block, grad, param});
    } else {
      plan.overlap_bytes += on_device ? u.optimizer : round_up(u.optimizer, 4096);
      max_block = std::max(max_block, round_up(u.optimizer, 4096));
    }
  }
  add_term(plan, on_device ? Tier::kDevice : Tier::kHost,
           c.delayed ? "delayed: pending update's gradient shards and 16-bit parameters"
                     : "eager: rollback snapshot (master and optimizer states)",
           plan.overlap_bytes);
  if (!on_device) {
    plan.overlap_pool = pool_with_slack(plan.overlap_bytes, max_block);
    plan.process.push_back(PlanTerm{Tier::kHost,
                                    "overlap pool slack (a buffer never spans two slabs)",
                                    plan.overlap_pool.budget_bytes - plan.overlap_bytes});
  }
  // The device cache was sized with the snapshot counted, so the tier stays within budget.
  TZ_ASSERT(!on_device || plan.tier_bytes(Tier::kDevice) <= plan.device_budget_bytes,
            "plan_memory: the device tier passes its budget after the rollback snapshot");
}

// The host tier's least bytes for `in`: its homed state, two units of NVMe-homed state in flight
// and the staging.
std::uint64_t host_minimum(const PlanInputs& in, const Config& config,
                           std::span<const UnitLayout> units) {
  MemoryPlan scratch;
  const PlanContext c = make_context(in, config, units, scratch);
  return round_up(c.home[1], 4096) + (c.home[2] > 0 ? 2 * max_unit_nvme_bytes(c) : 0) +
         size_store_staging(c, scratch, 0);
}

// The home of the gradient shards. With the optimizer on NVMe they are homed on the host
// (read and written every micro-batch, no I/O) unless a configured host budget cannot hold them
// beside the host tier's minimum; then they are homed on NVMe with the optimizer state and
// worked on in the host cache like it (as DeepSpeed's optimizer swapper swaps gradients), when
// that lowers the minimum: the whole shards leave the host, two units' come back in flight.
Placement gradient_home(const PlanInputs& in, const Config& config,
                        std::span<const UnitLayout> units) {
  const std::uint64_t configured =
      in.host_budget_bytes > 0 ? in.host_budget_bytes : config.tierzero.host_budget;
  if (in.optimizer != Placement::kNvme || in.grad != Placement::kHost || configured == 0) {
    return in.grad;
  }
  const std::uint64_t on_host = host_minimum(in, config, units);
  if (on_host <= configured) return Placement::kHost;
  PlanInputs nvme = in;
  nvme.grad = Placement::kNvme;
  return host_minimum(nvme, config, units) < on_host ? Placement::kNvme : Placement::kHost;
}

// Host memory outside the tiers. The process's baseline, measured (process_baseline_bytes()):
// with the CUDA libraries linked it is mostly cuBLASLt's text and static data, which no formula
// of this engine predicts. The pinned pool's slack: the pool's slabs are mapped at its budget
// (the host tier plus one largest block per slab and 2 MiB, size_pool), and a page once touched
// stays resident, so fragmentation can touch all of it. The caller's bandwidth probe, when it runs
// after the plan is checked: its buffers are held while the engine's pools are.
void add_process_terms(const PlanContext& c, MemoryPlan& plan) {
  if (c.in.process_baseline_bytes > 0) {
    plan.process.push_back(PlanTerm{
        Tier::kHost, "process baseline (binary, libraries, static data: RSS before the engine)",
        c.in.process_baseline_bytes});
  }
  plan.process.push_back(PlanTerm{Tier::kHost,
                                  "pinned pool slack (block rounding, fragmentation, 2 MiB)",
                                  plan.pool.budget_bytes - plan.tier_bytes(Tier::kHost)});
  if (c.in.probe_host_bytes > 0) {
    plan.process.push_back(PlanTerm{
        Tier::kHost, "bound bandwidth probe (memcpy or disk staging, before the first step)",
        c.in.probe_host_bytes});
  }
}

}  // namespace

Result<MemoryPlan> plan_memory(const PlanInputs& requested, const Config& config,
                               std::span<const UnitLayout> units) {
  if (units.empty()) return Status::invalid_argument("finalize(): no units registered");
  TZ_ASSERT(requested.world_size >= 1, "plan_memory: world_size must be >= 1");
  PlanInputs in = requested;
  in.grad = gradient_home(requested, config, units);
  MemoryPlan plan;
  plan.grad = in.grad;
  plan.grad_dtype =
      gradient_accumulator_dtype(in.compute_dtype, in.grad, config.gradient_accumulation_steps);
  const PlanContext c = make_context(in, config, units, plan);
  plan.device_budget_bytes =
      config.tierzero.device_budget > 0 ? config.tierzero.device_budget : in.device_budget_bytes;
  const std::size_t cache_index = add_device_terms(c, plan);
  TZ_ASSIGN_OR_RETURN(const std::uint64_t device_cache, size_device_cache(c, plan, cache_index));
  const std::uint64_t staging_bytes = size_store_staging(c, plan, device_cache);
  TZ_ASSIGN_OR_RETURN(plan.host_budget_bytes, size_host_budget(c, staging_bytes));
  plan.store.host_budget_bytes = plan.host_budget_bytes;
  add_host_and_nvme_terms(c, plan);
  size_pool(c, plan);
  add_process_terms(c, plan);
  size_swap(c, plan);
  add_overlap_term(c, plan);
  return plan;
}

TierBytes formula_bytes(const PlanInputs& in, std::uint64_t params, std::uint64_t frozen_params) {
  TZ_ASSERT(frozen_params <= params, "formula_bytes: more frozen parameters than parameters");
  const double all = static_cast<double>(params);
  const double phi = static_cast<double>(params - frozen_params);
  const double n = in.world_size;
  const double es = static_cast<double>(dtype_size(in.compute_dtype));
  const double p = in.stage == 3 ? es * all / n : es * all;
  const double g = in.stage >= 2 ? es * phi / n : es * phi;
  const double o = 4.0 * (1 + in.optimizer_states) * phi / (in.stage >= 1 ? n : 1.0);
  double tiers[3] = {0, 0, 0};
  tiers[tier_index(in.param)] += p;
  tiers[tier_index(in.grad)] += g;
  tiers[tier_index(in.optimizer)] += o;
  TierBytes b;
  b.device = static_cast<std::uint64_t>(tiers[0]);
  b.host = static_cast<std::uint64_t>(tiers[1]);
  b.nvme = static_cast<std::uint64_t>(tiers[2]);
  return b;
}

}  // namespace tz::zero
