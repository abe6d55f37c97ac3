// The memory plan (zero/plan.h) on small unit lists against bytes computed by hand in the test
// from the layout rules (tensors at 128-element offsets, shards of 2048-element multiples) and
// the terms docs/estimate.md lists; the out-of-memory errors name the tier, the bytes and the
// setting to change; DESIGN.md's formula for every stage.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "cpu/pinned_pool.h"
#include "gpu/device.h"
#include "zero/layout.h"
#include "zero/plan.h"

namespace tz::zero {
namespace {

using store::Tier;

std::uint64_t term_of(const MemoryPlan& plan, Tier tier, const std::string& prefix) {
  std::uint64_t sum = 0;
  int found = 0;
  for (const PlanTerm& t : plan.terms) {
    if (t.tier == tier && t.name.rfind(prefix, 0) == 0) {
      sum += t.bytes;
      ++found;
    }
  }
  EXPECT_EQ(found, 1) << "term '" << prefix << "' in tier " << store::tier_name(tier);
  return sum;
}

std::uint64_t term_of_process(const MemoryPlan& plan, const std::string& prefix) {
  std::uint64_t bytes = 0;
  for (const PlanTerm& t : plan.process) {
    if (t.name.rfind(prefix, 0) == 0) bytes += t.bytes;
  }
  return bytes;
}

UnitSpec unit(const std::string& name, std::vector<std::int64_t> numels) {
  UnitSpec s;
  s.name = name;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    s.tensors.push_back(TensorSpec{"t" + std::to_string(i), {numels[i]}});
  }
  return s;
}

// Two units for two ranks: "a" (5000 + 300 elements: 5420 with alignment, padded to 8192, shards
// of 4096) below the default persistence threshold of 100000, and "b" (200000 elements, padded
// to 200704, shards of 100352) above it.
std::vector<UnitLayout> two_units_two_ranks() {
  std::vector<UnitLayout> v;
  v.push_back(plan_unit_layout(unit("a", {5000, 300}), 2));
  v.push_back(plan_unit_layout(unit("b", {200000}), 2));
  return v;
}

// One single-tensor unit "u<numel>" of each size, laid out for `world` ranks.
std::vector<UnitLayout> units_for(int world, std::initializer_list<std::int64_t> numels) {
  std::vector<UnitLayout> v;
  for (const std::int64_t n : numels) {
    v.push_back(plan_unit_layout(unit("u" + std::to_string(n), {n}), world));
  }
  return v;
}

std::vector<UnitLayout> one_rank_units(std::initializer_list<std::int64_t> numels) {
  return units_for(1, numels);
}

TEST(ZeroPlan, LayoutsAreTheOnesTheTestAssumes) {
  const auto u = two_units_two_ranks();
  EXPECT_EQ(u[0].numel, 5300u);
  EXPECT_EQ(u[0].padded, 8192u);
  EXPECT_EQ(u[0].shard, 4096u);
  EXPECT_EQ(u[1].padded, 200704u);
  EXPECT_EQ(u[1].shard, 100352u);
}

// Stage 3, bf16, Adam, parameters on the host, optimizer on NVMe, 2 ranks, defaults elsewhere.
TEST(ZeroPlan, Stage3ParamsCpuOptimizerNvmeByHand) {
  PlanInputs in{.stage = 3, .compute_dtype = DType::kBF16, .optimizer = Placement::kNvme,
                .param = Placement::kHost, .grad = Placement::kHost, .optimizer_states = 2,
                .world_size = 2, .activation_bytes = 1000000, .device_budget_bytes = 1ull << 30};
  Config config;
  const auto units = two_units_two_ranks();
  auto got = plan_memory(in, config, units);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const MemoryPlan& p = *got;

  // Homes: bf16 parameter shards (2 B) and gradient shards on the host, in bf16 with one
  // micro-batch a step (2 B: gradient_accumulator_dtype), fp32 master + m + v shards (12 B) on
  // NVMe.
  EXPECT_EQ(p.grad_dtype, DType::kBF16);
  const std::uint64_t host_home = (4096 + 100352) * 2 + (4096 + 100352) * 2;
  const std::uint64_t nvme_home = (4096 + 100352) * 12;
  EXPECT_EQ(p.home.device, 0u);
  EXPECT_EQ(p.home.host, host_home);
  EXPECT_EQ(p.home.nvme, nvme_home);
  EXPECT_EQ(p.persistent, (std::vector<bool>{true, false}));

  // Device: the prefetch bucket (50M elements / 2 ranks, bf16) exceeds every shard together, so
  // the device cache holds all of them.
  EXPECT_EQ(term_of(p, Tier::kDevice, "home blocks"), 0u);
  EXPECT_EQ(term_of(p, Tier::kDevice, "device cache"), (4096u + 100352u) * 2);
  EXPECT_EQ(term_of(p, Tier::kDevice, "persistent gathered"), 8192u * 2);
  // Gathers: only "b" streams; gradients (going to the host: two buffers): both units.
  EXPECT_EQ(term_of(p, Tier::kDevice, "gather buffers"), 200704u * 2);
  EXPECT_EQ(term_of(p, Tier::kDevice, "gradient buffers"), (8192u + 200704u) * 2);
  // get_tensor's fp32 unit of the largest unit (200704 * 4 B) fits in the buffers' bytes.
  EXPECT_EQ(term_of(p, Tier::kDevice, "scratch"), 0u);
  EXPECT_EQ(term_of(p, Tier::kDevice, "norm and scalar"), sizeof(gpu::NormAccumulator) + 2 * 2 * 4 * 4);
  EXPECT_EQ(term_of(p, Tier::kDevice, "model activations"), 1000000u);

  // Host: the default budget is the host-homed state plus four of the largest unit's NVMe state
  // (b: 100352 * 12 B, rounded to 16 KiB) plus 1 MiB; the cache could take the rest of it, but
  // holds at most every NVMe-homed block (1253376 B < 4 * 1212416 + 1 MiB).
  const std::uint64_t unit_nvme = (100352ull * 12 + 16383) / 16384 * 16384;
  EXPECT_EQ(unit_nvme, 1212416u);
  const std::uint64_t budget = host_home + 4 * unit_nvme + (1u << 20);
  EXPECT_EQ(p.host_budget_bytes, budget);
  EXPECT_EQ(term_of(p, Tier::kHost, "home blocks"), host_home);
  EXPECT_EQ(term_of(p, Tier::kHost, "host cache"), nvme_home);
  // Chunks: the largest fp32 shard (100352 * 4 = 401408 B) under aio's 1 MiB block; 4 of them.
  EXPECT_EQ(p.store.chunk_bytes, 401408u);
  EXPECT_EQ(term_of(p, Tier::kHost, "store staging"), 4u * 401408);
  EXPECT_EQ(term_of(p, Tier::kHost, "engine staging"), 200704u * 2 + 200704u * 4);
  EXPECT_EQ(term_of(p, Tier::kNvme, "home blocks"), nvme_home);
  // NVMe bytes in flight: twice aio.queue_depth's 32 chunks on the one swap path.
  EXPECT_EQ(p.store.max_io_in_flight_bytes, 2u * 32 * 401408);

  const TierBytes b = p.bytes();
  EXPECT_EQ(b.host, host_home + nvme_home + 4 * 401408 + 200704 * 6);
  EXPECT_EQ(b.nvme, nvme_home);
  EXPECT_EQ(p.store.device_budget_bytes, (4096u + 100352u) * 2);
  EXPECT_EQ(p.store.host_budget_bytes, budget);
  // Pool slack: the largest block (b's fp32 shards, 401408 B) for its one slab, and 2 MiB.
  EXPECT_EQ(p.pool.budget_bytes, b.host + 401408 + (2u << 20));
  // Swap: NVMe state + one 4 KiB extent of slack per block (5 per unit), plus a stripe, rounded
  // to 1 MiB stripes, plus four stripes.
  const std::uint64_t need = nvme_home + 2 * 5 * 4096;
  EXPECT_EQ(p.swap_bytes_per_path, (need + (1u << 20) + (1u << 20) - 1) / (1u << 20) * (1u << 20) +
                                       4 * (1u << 20));
}

// The store keeps twice the kernel's queue in flight (aio.queue_depth per swap file), so that a
// reap refills the kernel at once from the engine's queue; never fewer than four chunks.
TEST(ZeroPlan, NvmeBytesInFlightAreTwiceTheKernelsQueue) {
  Config config;
  EXPECT_EQ(config.aio.queue_depth, 32);
  EXPECT_EQ(io_in_flight_bytes(config, 1, 1u << 20), 64ull << 20);
  EXPECT_EQ(io_in_flight_bytes(config, 3, 1u << 20), 192ull << 20);
  config.aio.queue_depth = 8;
  EXPECT_EQ(io_in_flight_bytes(config, 1, 1u << 20), 16ull << 20);
  config.aio.queue_depth = 1;
  EXPECT_EQ(io_in_flight_bytes(config, 1, 1u << 20), 4ull << 20);
  EXPECT_EQ(io_in_flight_bytes(config, 0, 1u << 20), 4ull << 20);

  // The plan's store options take it, over the paths the state is striped across.
  PlanInputs in{.stage = 3, .compute_dtype = DType::kBF16, .optimizer = Placement::kNvme,
                .param = Placement::kHost, .grad = Placement::kHost, .optimizer_states = 2,
                .world_size = 2, .activation_bytes = 1000000, .device_budget_bytes = 1ull << 30,
                .nvme_paths = 2};
  config.aio.queue_depth = 16;
  auto got = plan_memory(in, config, two_units_two_ranks());
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->store.max_io_in_flight_bytes, 2u * 16 * 2 * got->store.chunk_bytes);
}

// tierzero.nvme_checksums reaches the store's options: on by default, off when the config says so.
TEST(ZeroPlan, StoreChecksumsFollowTheConfig) {
  PlanInputs in{.stage = 3, .compute_dtype = DType::kBF16, .optimizer = Placement::kNvme,
                .param = Placement::kHost, .grad = Placement::kHost, .optimizer_states = 2,
                .world_size = 2, .activation_bytes = 1000000, .device_budget_bytes = 1ull << 30};
  Config config;
  auto on = plan_memory(in, config, two_units_two_ranks());
  ASSERT_TRUE(on.is_ok()) << on.status().to_string();
  EXPECT_TRUE(on->store.checksums);
  config.tierzero.nvme_checksums = false;
  auto off = plan_memory(in, config, two_units_two_ranks());
  ASSERT_TRUE(off.is_ok()) << off.status().to_string();
  EXPECT_FALSE(off->store.checksums);
}

// Stage 1 on the device: everything in the device tier; no gather buffers below stage 3.
TEST(ZeroPlan, Stage1OnDeviceByHand) {
  PlanInputs in{.stage = 1, .compute_dtype = DType::kBF16, .world_size = 2,
                .device_budget_bytes = 1ull << 30};
  Config config;
  const auto units = two_units_two_ranks();
  auto got = plan_memory(in, config, units);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const MemoryPlan& p = *got;
  // Full bf16 parameters (padded), fp32 gradient shards, 12 B master + states per shard element.
  const std::uint64_t dev_home = (8192 + 200704) * 2 + (4096 + 100352) * 4 + (4096 + 100352) * 12;
  EXPECT_EQ(p.home.device, dev_home);
  EXPECT_EQ(p.home.host, 0u);
  EXPECT_EQ(p.home.nvme, 0u);
  EXPECT_EQ(term_of(p, Tier::kDevice, "gather buffers"), 0u);
  EXPECT_EQ(term_of(p, Tier::kDevice, "gradient buffers"), (8192u + 200704u) * 2);
  // get_tensor's fp32 "b", beyond the gradient buffers.
  EXPECT_EQ(term_of(p, Tier::kDevice, "scratch"), 200704u * 4 - (8192u + 200704u) * 2);
  EXPECT_EQ(term_of(p, Tier::kDevice, "device cache"), 0u);
  EXPECT_EQ(term_of(p, Tier::kDevice, "persistent gathered"), 0u);
  EXPECT_EQ(p.persistent, (std::vector<bool>{false, false}));
  EXPECT_EQ(p.swap_bytes_per_path, 0u);
  // Nothing homed on the host: a budget of 1 MiB (+ no NVMe working set), and nothing to cache.
  EXPECT_EQ(p.host_budget_bytes, 1u << 20);
  EXPECT_EQ(term_of(p, Tier::kHost, "host cache"), 0u);
  EXPECT_EQ(p.store.chunk_bytes, 401408u);
}

// The buffers hold the three largest units, whatever their order: four units of 4096, 16384,
// 8192 and 32768 elements (padded as they are, shards of half of each for two ranks), stage 3,
// fp32 (4 B), nothing persistent. On one rank a gather computes on the shard pinned in the
// device tier (gather_pins_shard): no gather buffers.
TEST(ZeroPlan, BuffersHoldTheThreeLargestUnits) {
  PlanInputs in{.stage = 3, .compute_dtype = DType::kF32, .world_size = 1,
                .device_budget_bytes = 1ull << 30};
  Config config;
  config.zero.stage3_param_persistence_threshold = 0;
  auto one = plan_memory(in, config, one_rank_units({4096, 16384, 8192, 32768}));
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  EXPECT_EQ(term_of(*one, Tier::kDevice, "gather buffers"), 0u);
  EXPECT_EQ(term_of(*one, Tier::kDevice, "gradient buffers"), (32768u + 16384u + 8192u) * 4);
  EXPECT_EQ(term_of(*one, Tier::kDevice, "scratch"), 0u);

  in.world_size = 2;
  const std::vector<UnitLayout> units = units_for(2, {4096, 16384, 8192, 32768});
  ASSERT_EQ(units[3].padded, 32768u);
  auto got = plan_memory(in, config, units);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(term_of(*got, Tier::kDevice, "gather buffers"), (32768u + 16384u + 8192u) * 4);
  EXPECT_EQ(term_of(*got, Tier::kDevice, "gradient buffers"), (32768u + 16384u + 8192u) * 4);
  // get_tensor's fp32 copy of the largest unit fits in the buffers' bytes.
  EXPECT_EQ(term_of(*got, Tier::kDevice, "scratch"), 0u);

  // With the optimizer on the host, gradients are copied out and freed synchronously: the two
  // largest units' buffers.
  in.optimizer = Placement::kHost;
  in.grad = Placement::kHost;
  got = plan_memory(in, config, units);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(term_of(*got, Tier::kDevice, "gather buffers"), (32768u + 16384u + 8192u) * 4);
  EXPECT_EQ(term_of(*got, Tier::kDevice, "gradient buffers"), (32768u + 16384u) * 4);
  EXPECT_EQ(term_of(*got, Tier::kDevice, "scratch"), 0u);
}

// The scratch term is what the largest unit in fp32 needs beyond the micro-batch buffers: stage
// 1, bf16, optimizer on the host, one rank, a large unit (32768 elements) and a small one (4096):
// no gathers, the two gradients in bf16; get_tensor's fp32 copy of the large one is bigger.
TEST(ZeroPlan, ScratchIsWhatTheFp32UnitNeedsBeyondTheBuffers) {
  PlanInputs in{.stage = 1, .compute_dtype = DType::kBF16, .optimizer = Placement::kHost,
                .grad = Placement::kHost, .world_size = 1, .device_budget_bytes = 1ull << 30};
  Config config;
  const std::vector<UnitLayout> units = one_rank_units({32768, 4096});
  auto got = plan_memory(in, config, units);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(term_of(*got, Tier::kDevice, "gather buffers"), 0u);
  EXPECT_EQ(term_of(*got, Tier::kDevice, "gradient buffers"), (32768u + 4096u) * 2);
  EXPECT_EQ(term_of(*got, Tier::kDevice, "scratch"), 32768u * 4 - (32768u + 4096u) * 2);
  // Buffers + scratch together are exactly the larger of the two phases.
  EXPECT_EQ(term_of(*got, Tier::kDevice, "gradient buffers") +
                term_of(*got, Tier::kDevice, "scratch"),
            32768u * 4);
}

// A block over half a GiB (a large vocabulary's embedding: 400 M elements, 1.6 GB of fp32 state)
// gets slabs of 8 blocks, so the pool is finite and one block of slack per slab is an eighth of
// it (with 1 GiB slabs each slab would need more slack than it holds, and the sizing never ended).
TEST(ZeroPlan, BlocksOverHalfAGibGetSlabsOfEightBlocks) {
  PlanInputs in{.stage = 1, .compute_dtype = DType::kF32, .optimizer = Placement::kHost,
                .grad = Placement::kHost, .world_size = 1, .device_budget_bytes = 64ull << 30};
  Config config;
  std::vector<UnitLayout> units{plan_unit_layout(unit("wte", {400000000}), 1)};
  auto got = plan_memory(in, config, units);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const std::uint64_t block = units[0].padded * 4;
  auto round_2m = [](std::uint64_t v) { return (v + (2u << 20) - 1) / (2u << 20) * (2u << 20); };
  // 16 bytes per element: 6.4 GB of state plus one block is under 8 blocks, so one slab holds
  // the pool: the host tier, 2 MiB and one block of slack.
  EXPECT_EQ(got->pool.budget_bytes, got->bytes().host + (2u << 20) + block);
  EXPECT_EQ(got->pool.slab_bytes, round_2m(got->pool.budget_bytes));
  EXPECT_LE(got->pool.slab_bytes, round_2m(8 * block));
  EXPECT_GT(got->pool.slab_bytes, 1ull << 30);
}

// A host tier over 1 GiB is several slabs (a buffer never spans two), so the pool keeps one
// largest block of slack per slab: one unit of 80,001,024 elements (padded), stage 1, optimizer
// on the CPU, fp32, one rank: master + m + v + gradient = 16 B per element on the host.
TEST(ZeroPlan, PoolSlackIsOneLargestBlockPerSlab) {
  PlanInputs in{.stage = 1, .compute_dtype = DType::kF32, .optimizer = Placement::kHost,
                .grad = Placement::kHost, .world_size = 1, .device_budget_bytes = 8ull << 30};
  Config config;
  std::vector<UnitLayout> units{plan_unit_layout(unit("big", {80000000}), 1)};
  ASSERT_EQ(units[0].padded, 80001024u);
  auto got = plan_memory(in, config, units);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const std::uint64_t block = 80001024ull * 4;  // an fp32 state block (4 KiB-aligned already)
  EXPECT_EQ(got->home.host, 80001024ull * 16);
  const std::uint64_t slabs = (got->pool.budget_bytes + (1ull << 30) - 1) >> 30;
  EXPECT_EQ(got->pool.slab_bytes, 1ull << 30);
  EXPECT_GE(slabs, 2u);
  EXPECT_EQ(got->pool.budget_bytes, got->bytes().host + (2u << 20) + slabs * block);
  // The slack is host memory outside the tiers: a process term, and the only one without a
  // measured baseline.
  ASSERT_EQ(got->process.size(), 1u);
  EXPECT_EQ(got->process[0].name.rfind("pinned pool slack", 0), 0u);
  EXPECT_EQ(got->process_bytes(), (2u << 20) + slabs * block);
  EXPECT_EQ(got->bytes().host, 80001024ull * 16 + 4 * got->store.chunk_bytes +
                                   got->stage16_bytes + got->stage32_bytes);
  in.process_baseline_bytes = 123456789;  // a measured baseline is its own term
  auto with_baseline = plan_memory(in, config, units);
  ASSERT_TRUE(with_baseline.is_ok());
  EXPECT_EQ(with_baseline->process_bytes(), 123456789u + (2u << 20) + slabs * block);
  EXPECT_EQ(with_baseline->bytes().host, got->bytes().host);
}

// Delayed's buffers come from their own pinned pool, allocated once, and a buffer never spans two
// slabs: a pool of exactly their bytes cannot hold them when they do not pack into its slabs
// (gpt2-774m with "delayed" stopped in its first step with "pinned pool: cannot allocate 37.5
// MiB", the largest free piece 22.9 MiB). The plan's overlap pool holds them in the engine's
// order, and its slack is a process term.
TEST(ZeroPlan, OverlapPoolHoldsTheModesBuffers) {
  PlanInputs in{.stage = 3,
                .compute_dtype = DType::kBF16,
                .optimizer = Placement::kNvme,
                .param = Placement::kNvme,
                .grad = Placement::kHost,
                .optimizer_states = 2,
                .world_size = 1,
                .device_budget_bytes = 8ull << 30};
  Config config;
  config.tierzero.overlap = "delayed";
  constexpr std::uint64_t kBlock = 300ull << 20;  // a 300 MiB bf16 shard: three to a 1 GiB slab
  std::vector<UnitLayout> units{plan_unit_layout(unit("a", {kBlock / 2}), 1),
                                plan_unit_layout(unit("b", {kBlock / 2}), 1)};
  ASSERT_EQ(units[0].shard * 2, kBlock);
  auto got = plan_memory(in, config, units);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->overlap_bytes, 4 * kBlock);  // each unit's gradient shard and bf16 parameters
  PinnedPoolOptions po = got->overlap_pool;
  po.huge_pages = false;  // address space only: nothing is touched
  po.lock = MemlockPolicy::kOff;
  auto pool = PinnedPool::create(po);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  std::vector<PinnedBuffer> held;
  for (std::size_t i = 0; i < 2 * units.size(); ++i) {
    auto b = pool->allocate(kBlock);
    ASSERT_TRUE(b.is_ok()) << "buffer " << i << ": " << b.status().to_string();
    held.push_back(std::move(b).value());
  }
  EXPECT_EQ(term_of_process(*got, "overlap pool slack"),
            got->overlap_pool.budget_bytes - got->overlap_bytes);
}

TEST(ZeroPlan, DeviceOverBudgetNamesBytesAndSetting) {
  PlanInputs in{.stage = 1, .compute_dtype = DType::kBF16, .world_size = 2,
                .device_budget_bytes = 1u << 20};
  Config config;
  const auto units = two_units_two_ranks();
  auto got = plan_memory(in, config, units);
  ASSERT_FALSE(got.is_ok());
  EXPECT_EQ(got.status().code(), ErrorCode::kOutOfMemory);
  const std::string m = got.status().message();
  EXPECT_NE(m.find("device tier needs"), std::string::npos) << m;
  EXPECT_NE(m.find("device budget of 1048576 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("zero_optimization.offload_optimizer.device"), std::string::npos) << m;
  // tierzero.device_budget wins over the device's own budget.
  config.tierzero.device_budget = 1ull << 30;
  EXPECT_TRUE(plan_memory(in, config, units).is_ok());
}

TEST(ZeroPlan, HostOverBudgetNamesTheKey) {
  PlanInputs in{.stage = 2, .compute_dtype = DType::kBF16, .optimizer = Placement::kHost,
                .grad = Placement::kHost, .world_size = 2, .host_budget_bytes = 4096,
                .device_budget_bytes = 1ull << 30};
  Config config;
  const auto units = two_units_two_ranks();
  auto got = plan_memory(in, config, units);
  ASSERT_FALSE(got.is_ok());
  EXPECT_EQ(got.status().code(), ErrorCode::kOutOfMemory);
  // Host-homed master + m + v (12 B per shard element) and bf16 gradient shards (2 B: one
  // micro-batch a step) and the staging: four 401408 B chunks, a 16-bit and an fp32 unit of "b".
  const std::uint64_t host_home = (4096 + 100352) * 14;
  const std::uint64_t staging = 4 * 401408 + 200704 * 2 + 200704 * 4;
  EXPECT_NE(got.status().message().find("host tier needs at least " +
                                        std::to_string(host_home + staging) + " bytes"),
            std::string::npos)
      << got.status().message();
  EXPECT_NE(got.status().message().find("raise tierzero.host_budget"), std::string::npos);
  // Exactly enough: the whole host tier is the budget (store blocks get what staging leaves).
  in.host_budget_bytes = host_home + staging;
  auto fits = plan_memory(in, config, units);
  ASSERT_TRUE(fits.is_ok()) << fits.status().to_string();
  EXPECT_EQ(fits->store.host_budget_bytes, host_home);
  EXPECT_EQ(fits->bytes().host, host_home + staging);
}

// The gradient shards are kept in the compute dtype only where a step's one micro-batch makes
// each the reduced gradient itself and the host or NVMe holds it; fp32 where micro-batches are
// added or the device holds them. The plan sizes the homes with that dtype.
TEST(ZeroPlan, GradientShardsAre16BitOnlyWithOneMicroBatchOffTheDevice) {
  EXPECT_EQ(gradient_accumulator_dtype(DType::kBF16, Placement::kHost, 1), DType::kBF16);
  EXPECT_EQ(gradient_accumulator_dtype(DType::kF16, Placement::kNvme, 1), DType::kF16);
  EXPECT_EQ(gradient_accumulator_dtype(DType::kF32, Placement::kHost, 1), DType::kF32);
  EXPECT_EQ(gradient_accumulator_dtype(DType::kBF16, Placement::kHost, 2), DType::kF32);
  EXPECT_EQ(gradient_accumulator_dtype(DType::kBF16, Placement::kDevice, 1), DType::kF32);
  PlanInputs in{.stage = 2, .compute_dtype = DType::kBF16, .optimizer = Placement::kHost,
                .grad = Placement::kHost, .world_size = 2, .device_budget_bytes = 1ull << 30};
  const auto units = two_units_two_ranks();
  const std::uint64_t shards = 4096 + 100352;
  for (const std::uint64_t k : {1, 2}) {
    Config config;
    config.gradient_accumulation_steps = k;
    auto got = plan_memory(in, config, units);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(got->grad_dtype, k == 1 ? DType::kBF16 : DType::kF32);
    // Master, m, v (12 B an element) and the gradient shard, 2 B or 4 B.
    EXPECT_EQ(got->home.host, shards * (k == 1 ? 14 : 16)) << k;
  }
}

// Optimizer on NVMe, parameters on the host, stage 3, 2 ranks, eight units of 200000 elements:
// the (bf16) gradient shards are homed on the host while a configured host budget holds them
// beside the tier's minimum, else on NVMe with the optimizer state (worked on in the host cache);
// only a budget below the minimum with them on NVMe is refused. With two units moving them would
// not lower the minimum (two units' gradients come back in flight), so they stay.
TEST(ZeroPlan, GradientShardsMoveToNvmeWhenTheHostBudgetCannotHoldThem) {
  PlanInputs in{.stage = 3, .compute_dtype = DType::kBF16, .optimizer = Placement::kNvme,
                .param = Placement::kHost, .grad = Placement::kHost, .world_size = 2,
                .device_budget_bytes = 1ull << 30};
  Config config;
  in.host_budget_bytes = 4096;
  const auto two = two_units_two_ranks();
  auto two_refused = plan_memory(in, config, two);
  ASSERT_FALSE(two_refused.is_ok());
  EXPECT_NE(two_refused.status().message().find("host tier needs at least 5652480 bytes"),
            std::string::npos)  // gradient shards on the host: the smaller minimum
      << two_refused.status().message();
  std::vector<UnitLayout> units;
  for (int i = 0; i < 8; ++i) {
    units.push_back(plan_unit_layout(unit("u" + std::to_string(i), {200000}), 2));
  }
  ASSERT_EQ(units[0].shard, 100352u);
  const std::uint64_t params = 8 * 100352 * 2;  // bf16 shards, homed on the host
  const std::uint64_t grads = 8 * 100352 * 2;   // bf16 shards (one micro-batch a step)
  const std::uint64_t staging = 4 * 401408 + 200704 * 2 + 200704 * 4;
  auto round16k = [](std::uint64_t b) { return (b + 16383) / 16384 * 16384; };
  auto round4k = [](std::uint64_t b) { return (b + 4095) / 4096 * 4096; };
  // A unit in flight: master + m + v, and with the gradient its bf16 shard too.
  const std::uint64_t unit_opt = round16k(100352ull * 12);
  const std::uint64_t unit_opt_grad = round16k(100352ull * 14);
  const std::uint64_t host_min = round4k(params + grads) + 2 * unit_opt + staging;
  const std::uint64_t nvme_min = round4k(params) + 2 * unit_opt_grad + staging;
  ASSERT_LT(nvme_min, host_min);

  in.host_budget_bytes = host_min;  // room for the gradient shards on the host
  auto on_host = plan_memory(in, config, units);
  ASSERT_TRUE(on_host.is_ok()) << on_host.status().to_string();
  EXPECT_EQ(on_host->grad, Placement::kHost);
  EXPECT_EQ(on_host->home.host, params + grads);
  EXPECT_EQ(on_host->home.nvme, 8 * 100352 * 12u);

  in.host_budget_bytes = host_min - 1;  // not: they are homed on NVMe
  auto on_nvme = plan_memory(in, config, units);
  ASSERT_TRUE(on_nvme.is_ok()) << on_nvme.status().to_string();
  EXPECT_EQ(on_nvme->grad, Placement::kNvme);
  EXPECT_EQ(on_nvme->home.host, params);
  EXPECT_EQ(on_nvme->home.nvme, 8 * 100352 * 14u);
  EXPECT_EQ(on_nvme->bytes().host, host_min - 1);  // the whole budget: the cache takes the rest
  EXPECT_EQ(term_of(*on_nvme, Tier::kHost, "home blocks"), params);

  in.host_budget_bytes = nvme_min;  // the least that starts
  auto least = plan_memory(in, config, units);
  ASSERT_TRUE(least.is_ok()) << least.status().to_string();
  EXPECT_EQ(least->grad, Placement::kNvme);
  in.host_budget_bytes = nvme_min - 1;
  auto refused = plan_memory(in, config, units);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("host tier needs at least " +
                                            std::to_string(nvme_min) + " bytes"),
            std::string::npos)
      << refused.status().message();

  // Unset host budget (the default sizes itself to the need): the gradient shards stay on the host.
  in.host_budget_bytes = 0;
  auto open = plan_memory(in, config, units);
  ASSERT_TRUE(open.is_ok());
  EXPECT_EQ(open->grad, Placement::kHost);
}

TEST(ZeroPlan, EmptyUnitListIsRefused) {
  PlanInputs in;
  Config config;
  EXPECT_FALSE(plan_memory(in, config, {}).is_ok());
}

// DESIGN.md's table with bf16 and Adam: 16Φ, 4Φ+12Φ/N, 2Φ+14Φ/N, 16Φ/N; offload moves terms.
TEST(ZeroPlan, FormulaPerStage) {
  const std::uint64_t phi = 1000000;
  PlanInputs in{.compute_dtype = DType::kBF16, .optimizer_states = 2, .world_size = 4};
  const std::uint64_t want[4] = {16 * phi, 4 * phi + 12 * phi / 4, 2 * phi + 14 * phi / 4,
                                 16 * phi / 4};
  for (int stage = 0; stage <= 3; ++stage) {
    in.stage = stage;
    EXPECT_EQ(formula_bytes(in, phi).device, want[stage]) << "stage " << stage;
  }
  in.stage = 3;
  in.optimizer = Placement::kNvme;
  in.grad = Placement::kHost;
  in.param = Placement::kHost;
  const TierBytes b = formula_bytes(in, phi);
  EXPECT_EQ(b.device, 0u);
  EXPECT_EQ(b.host, 4 * phi / 4);
  EXPECT_EQ(b.nvme, 12 * phi / 4);
}

TEST(ZeroPlan, InputsFromOptionsAsTheEngineReadsThem) {
  EngineOptions o;
  o.config.bf16 = true;
  o.config.zero.stage = 3;
  o.config.zero.offload_optimizer.device = "nvme";
  o.config.zero.offload_param.device = "cpu";
  o.config.optimizer.type = "SGD";
  o.config.optimizer.momentum = 0.9;
  o.config.zero.offload_optimizer.nvme_path = "/a";
  o.config.zero.offload_param.nvme_path = "/b";  // not nvme: not a swap path
  o.activation_bytes = 123;
  EXPECT_EQ(swap_paths(o), (std::vector<std::string>{"/a"}));
  o.config.zero.offload_param.device = "nvme";
  EXPECT_EQ(swap_paths(o), (std::vector<std::string>{"/a", "/b"}));
  auto in = plan_inputs(o, 4, 1u << 30);
  ASSERT_TRUE(in.is_ok()) << in.status().to_string();
  EXPECT_EQ(in->compute_dtype, DType::kBF16);
  EXPECT_EQ(in->optimizer, Placement::kNvme);
  EXPECT_EQ(in->param, Placement::kNvme);
  EXPECT_EQ(in->grad, Placement::kHost);
  EXPECT_EQ(in->optimizer_states, 1);
  EXPECT_EQ(in->world_size, 4);
  EXPECT_EQ(in->activation_bytes, 123u);
  EXPECT_EQ(in->nvme_paths, 2u);
  o.nvme_path = "/c";  // --nvme-path: both offloads' files go there
  EXPECT_EQ(swap_paths(o), (std::vector<std::string>{"/c"}));
  o.config.zero.stage = 2;
  auto bad = plan_inputs(o, 4, 1u << 30);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("zero_optimization.offload_param.device"),
            std::string::npos);
  o.config.zero.offload_param.device = "disk";
  EXPECT_FALSE(plan_inputs(o, 4, 1u << 30).is_ok());
}

// issue 29's bench-zero case: 16 dense layers of 1024 x 1024 (one tensor each: 1048576 elements,
// no padding at one rank), 1 rank, stage 3, bf16, Adam, parameters and optimizer on NVMe
// (gradient shards homed on the host), a device budget of 32 MiB.
std::vector<UnitLayout> bench_zero_units(int world = 1) {
  std::vector<UnitLayout> v;
  for (int l = 0; l < 16; ++l) {
    UnitSpec s;
    s.name = "layer" + std::to_string(l);
    s.tensors.push_back(TensorSpec{"weight", {1024, 1024}});
    v.push_back(plan_unit_layout(s, world));
  }
  return v;
}

PlanInputs bench_zero_inputs(std::uint64_t device_budget) {
  return PlanInputs{.stage = 3, .compute_dtype = DType::kBF16, .optimizer = Placement::kNvme,
                    .param = Placement::kNvme, .grad = Placement::kHost, .optimizer_states = 2,
                    .world_size = 1, .device_budget_bytes = device_budget};
}

// The device cache (the tunable term) shrinks to what the 32 MiB budget leaves after the
// gradient buffers (2 units) and the norm/scalar buffers (one rank: no gather buffers, the
// gathers compute on the shards pinned in the cache); with room to spare it keeps its
// unconstrained size (every shard: the 50M-element prefetch bucket is larger).
TEST(ZeroPlan, DeviceCacheShrinksToWhatTheBudgetLeaves) {
  const auto units = bench_zero_units();
  ASSERT_EQ(units[0].padded, 1048576u);
  ASSERT_EQ(units[0].shard, 1048576u);
  const std::uint64_t unit_bytes = 1048576ull * 2;  // one bf16 unit
  const std::uint64_t norm = sizeof(gpu::NormAccumulator) + 1 * 2 * 4 * 4;
  const std::uint64_t fixed = 2 * unit_bytes + norm;
  Config config;

  auto roomy = plan_memory(bench_zero_inputs(1ull << 30), config, units);
  ASSERT_TRUE(roomy.is_ok()) << roomy.status().to_string();
  EXPECT_EQ(term_of(*roomy, Tier::kDevice, "device cache"), 16 * unit_bytes);
  EXPECT_EQ(roomy->bytes().device, fixed + 16 * unit_bytes);

  const std::uint64_t budget = 32ull << 20;
  auto got = plan_memory(bench_zero_inputs(budget), config, units);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const MemoryPlan& p = *got;
  EXPECT_EQ(term_of(p, Tier::kDevice, "gather buffers"), 0u);
  EXPECT_EQ(term_of(p, Tier::kDevice, "gradient buffers"), 2 * unit_bytes);
  EXPECT_EQ(term_of(p, Tier::kDevice, "norm and scalar"), norm);
  EXPECT_EQ(term_of(p, Tier::kDevice, "device cache"), budget - fixed);
  EXPECT_GE(budget - fixed, 4 * unit_bytes);  // at least the four shards pinned at once
  EXPECT_EQ(p.bytes().device, budget);
  EXPECT_EQ(p.store.device_budget_bytes, budget - fixed);  // nothing homed on the device

  // tierzero.device_budget wins over the device's budget, and shrinks the cache the same way.
  config.tierzero.device_budget = 20ull << 20;
  auto cfg = plan_memory(bench_zero_inputs(1ull << 30), config, units);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  EXPECT_EQ(term_of(*cfg, Tier::kDevice, "device cache"), (20ull << 20) - fixed);
}

// Below the irreducible minimum (the buffers plus the shards the cache must hold at once) the
// plan refuses, naming the tier, each irreducible term with its bytes and the budget; at exactly
// the minimum it plans. On one rank the cache holds four shards (three gathered ones pinned, one
// loading) and there are no gather buffers; on two, gather buffers for three and two shards.
TEST(ZeroPlan, DeviceBelowIrreducibleMinimumNamesTheTerms) {
  const auto units = bench_zero_units();
  const std::uint64_t unit_bytes = 1048576ull * 2;
  const std::uint64_t norm = sizeof(gpu::NormAccumulator) + 1 * 2 * 4 * 4;
  const std::uint64_t minimum = (2 + 4) * unit_bytes + norm;
  Config config;
  auto at = plan_memory(bench_zero_inputs(minimum), config, units);
  ASSERT_TRUE(at.is_ok()) << at.status().to_string();
  EXPECT_EQ(term_of(*at, Tier::kDevice, "device cache"), 4 * unit_bytes);
  EXPECT_EQ(at->bytes().device, minimum);

  auto got = plan_memory(bench_zero_inputs(minimum - 1), config, units);
  ASSERT_FALSE(got.is_ok());
  EXPECT_EQ(got.status().code(), ErrorCode::kOutOfMemory);
  const std::string m = got.status().message();
  EXPECT_NE(m.find("device tier needs at least " + std::to_string(minimum)), std::string::npos)
      << m;
  EXPECT_NE(m.find("irreducible minimum"), std::string::npos) << m;
  EXPECT_EQ(m.find("gather buffers"), std::string::npos) << m;
  EXPECT_NE(m.find("gradient buffers (2 largest units) " + std::to_string(2 * unit_bytes)),
            std::string::npos) << m;
  EXPECT_NE(m.find("device cache of offloaded parameter shards (4 largest shards) " +
                   std::to_string(4 * unit_bytes)),
            std::string::npos) << m;
  EXPECT_NE(m.find("norm and scalar buffers " + std::to_string(norm)), std::string::npos) << m;
  EXPECT_NE(m.find("device budget of " + std::to_string(minimum - 1) + " bytes"),
            std::string::npos) << m;
  EXPECT_NE(m.find("tierzero.device_budget"), std::string::npos) << m;

  // Two ranks: shards of half a unit; gathers all-gather into three buffers of a whole unit.
  const auto two = bench_zero_units(2);
  ASSERT_EQ(two[0].shard, 524288u);
  PlanInputs in2 = bench_zero_inputs(1ull << 30);
  in2.world_size = 2;
  const std::uint64_t norm2 = sizeof(gpu::NormAccumulator) + 2 * 2 * 4 * 4;
  const std::uint64_t minimum2 = (3 + 2) * unit_bytes + 2 * (unit_bytes / 2) + norm2;
  in2.device_budget_bytes = minimum2;
  auto at2 = plan_memory(in2, config, two);
  ASSERT_TRUE(at2.is_ok()) << at2.status().to_string();
  EXPECT_EQ(term_of(*at2, Tier::kDevice, "gather buffers"), 3 * unit_bytes);
  EXPECT_EQ(term_of(*at2, Tier::kDevice, "device cache"), unit_bytes);
  in2.device_budget_bytes = minimum2 - 1;
  auto below2 = plan_memory(in2, config, two);
  ASSERT_FALSE(below2.is_ok());
  const std::string m2 = below2.status().message();
  EXPECT_NE(m2.find("gather buffers (3 largest units) " + std::to_string(3 * unit_bytes)),
            std::string::npos) << m2;
  EXPECT_NE(m2.find("device cache of offloaded parameter shards (2 largest shards) " +
                    std::to_string(unit_bytes)),
            std::string::npos) << m2;
}

// The refusal's advice starts with the largest term: activations larger than the device's home
// blocks call for checkpointing or a smaller batch before moving the optimizer (the advice used to
// start with the optimizer whatever dominated).
TEST(ZeroPlan, RefusalAdviceStartsWithTheLargestTerm) {
  const auto units = bench_zero_units();
  Config config;
  PlanInputs in = bench_zero_inputs(1ull << 20);
  in.optimizer = Placement::kDevice;  // home blocks on the device
  in.param = Placement::kDevice;
  in.grad = Placement::kDevice;
  in.stage = 0;
  in.activation_bytes = 1ull << 40;  // far larger than the 16 units' home blocks
  auto got = plan_memory(in, config, units);
  ASSERT_FALSE(got.is_ok());
  const std::string m = got.status().message();
  const std::size_t act = m.find("mostly activations");
  const std::size_t opt = m.find("offload the optimizer");
  ASSERT_NE(act, std::string::npos) << m;
  ASSERT_NE(opt, std::string::npos) << m;
  EXPECT_LT(act, opt) << m;
  in.activation_bytes = 0;  // home blocks dominate: the optimizer advice comes first
  auto small = plan_memory(in, config, units);
  ASSERT_FALSE(small.is_ok());
  EXPECT_EQ(small.status().message().find("mostly activations"), std::string::npos)
      << small.status().message();
}

}  // namespace
}  // namespace tz::zero

namespace tz::zero {
namespace {

// A LoRA-like model: "b" (200000 elements) frozen, its parameters on NVMe; "a" (5300) trainable,
// its optimizer on the host. Stage 3, bf16, Adam, 2 ranks. The frozen unit costs its bf16 shard
// at the parameter tier and nothing else: no gradient buffer, master, states or staging.
TEST(ZeroPlan, FrozenUnitCostsItsParametersOnly) {
  PlanInputs in{.stage = 3, .compute_dtype = DType::kBF16, .optimizer = Placement::kHost,
                .param = Placement::kNvme, .grad = Placement::kHost, .optimizer_states = 2,
                .world_size = 2, .device_budget_bytes = 1ull << 30};
  Config config;
  UnitSpec frozen = unit("b", {200000});
  frozen.frozen = true;
  std::vector<UnitLayout> units;
  units.push_back(plan_unit_layout(unit("a", {5000, 300}), 2));
  units.push_back(plan_unit_layout(frozen, 2));
  ASSERT_TRUE(units[1].frozen);
  auto got = plan_memory(in, config, units);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const MemoryPlan& p = *got;
  // Homes: both bf16 parameter shards on NVMe (2 B each); a's fp32 master, m, v (12 B) and
  // bf16 gradient shard (2 B: one micro-batch a step) on the host; b has none of those.
  EXPECT_EQ(p.home.device, 0u);
  EXPECT_EQ(p.home.nvme, (4096u + 100352u) * 2);
  EXPECT_EQ(p.home.host, 4096u * 14);
  EXPECT_EQ(term_of(p, Tier::kNvme, "home blocks"), (4096u + 100352u) * 2);
  // b streams through the gather buffers like any unit; gradient buffers are a's alone (two:
  // they go to the host); b's stage-3 get_tensor (200704 * 2 B) fits in the gather buffers.
  EXPECT_EQ(term_of(p, Tier::kDevice, "gather buffers"), 200704u * 2);
  EXPECT_EQ(term_of(p, Tier::kDevice, "gradient buffers"), 8192u * 2);
  EXPECT_EQ(term_of(p, Tier::kDevice, "scratch"), 0u);
  // Engine staging: a's 16-bit and fp32 unit only.
  EXPECT_EQ(term_of(p, Tier::kHost, "engine staging"), 8192u * 2 + 8192u * 4);
  // The store's chunk follows the largest block, b's bf16 shard (200704 B), under aio's 1 MiB.
  EXPECT_EQ(p.store.chunk_bytes, 200704u);
  // The host budget (unset): host-homed state plus four of the largest unit's NVMe-homed state
  // (b's shard, rounded to 16 KiB) plus 1 MiB.
  const std::uint64_t unit_nvme = (100352ull * 2 + 16383) / 16384 * 16384;
  EXPECT_EQ(p.host_budget_bytes, 4096u * 14 + 4 * unit_nvme + (1u << 20));
  // No overlap buffers for b: delayed keeps a's gradient shard and 16-bit parameters only.
  config.tierzero.overlap = "delayed";
  auto delayed = plan_memory(in, config, units);
  ASSERT_TRUE(delayed.is_ok()) << delayed.status().to_string();
  EXPECT_EQ(delayed->overlap_bytes, 4096u * 2 + 4096u * 2);
}

// DESIGN.md's formula with a frozen part: its bf16 parameters only, sharded at stage 3.
TEST(ZeroPlan, FormulaWithFrozenParameters) {
  PlanInputs in{.stage = 3, .compute_dtype = DType::kBF16, .optimizer = Placement::kHost,
                .param = Placement::kNvme, .grad = Placement::kHost, .optimizer_states = 2,
                .world_size = 4};
  const TierBytes b = formula_bytes(in, 1000000, 900000);
  EXPECT_EQ(b.device, 0u);
  EXPECT_EQ(b.nvme, 2u * 1000000 / 4);
  EXPECT_EQ(b.host, (2u + 12u) * 100000 / 4);
  EXPECT_EQ(formula_bytes(in, 1000000, 0).host, (2u + 12u) * 1000000 / 4);
}

}  // namespace
}  // namespace tz::zero
