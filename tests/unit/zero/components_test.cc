// The parameter coordinator and the gradient reducer (zero/coordinator.h, zero/reducer.h) alone,
// on a tiered stack of two HostDevice ranks (LocalComm threads) with one unit and no engine:
// stage 3's gather assembles every rank's shard (checked element by element against the values
// each rank wrote), a persistent unit keeps its gathered copy until invalidated, and k reduces of
// known integer gradients leave in each rank's accumulator the sum over ranks and micro-batches
// (exact in fp32) with the global norm equal to a float64 sum over the whole gradient; with one
// micro-batch a step and bf16 compute the host accumulator is bf16 and holds that gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "store/stack.h"
#include "zero/coordinator.h"
#include "zero/plan.h"
#include "zero/reducer.h"

namespace tz::zero::impl {
namespace {

constexpr int kRanks = 2;
constexpr int kMicroBatches = 2;

// Parameter element i of shard `rank` (small integers: exact in fp32).
float param_value(int rank, std::size_t i, int version) {
  return static_cast<float>(rank * 1000 + static_cast<int>(i % 97) + version * 10000);
}
// Gradient element i of the full unit on `rank` at micro-batch `m`.
float grad_value(int rank, int m, std::size_t i) {
  return static_cast<float>(static_cast<int>(i % 13) - 6 + rank * 3 + m);
}

// One rank: the context, the stack and the unit's blocks, as EngineImpl::finalize builds them.
struct Rank {
  Rank(const Config& config, gpu::Device& device, comm::Comm& comm, Placement grads)
      : ctx(config, device, comm) {
    ctx.stage = 3;
    ctx.compute_dtype = DType::kF32;
    ctx.opt_place = grads;
    ctx.grad_place = grads;
  }
  ~Rank() {  // as EngineImpl's destructor: the store and the staging before their pool
    ctx.store = nullptr;
    store.reset();
    ctx.stage16.reset();
    ctx.stage32.reset();
  }
  Status build(bool persistent) {
    Unit& u = ctx.units.emplace_back();
    u.id = 0;
    u.spec.name = "u";
    u.spec.tensors = {TensorSpec{"w", {3000}}, TensorSpec{"b", {10}}};
    u.layout = plan_unit_layout(u.spec, ctx.world);
    u.opt_elems = u.layout.shard;
    u.persistent = persistent;
    store::StackDescription sd;
    sd.pool.budget_bytes = 16u << 20;
    sd.pool.slab_bytes = 4u << 20;
    sd.pool.huge_pages = false;
    sd.pool.prefault = false;
    sd.store.device_budget_bytes = 8u << 20;
    sd.store.host_budget_bytes = 4u << 20;
    sd.store.chunk_bytes = 1u << 20;
    sd.store.staging_buffers = 2;
    TZ_ASSIGN_OR_RETURN(store::TieredStack stack, store::build_stack(sd, ctx.device));
    pool = std::move(stack.pool);
    store = std::move(stack.store);
    ctx.store = store.get();
    ctx.buffers.set_limits(store.get(), 64u << 20);
    TZ_ASSIGN_OR_RETURN(ctx.stage16, pool->allocate(u.layout.padded * 4));
    TZ_ASSIGN_OR_RETURN(ctx.stage32, pool->allocate(u.layout.padded * 4));
    TZ_ASSIGN_OR_RETURN(u.param, store->create_block(u.layout.shard * 4, Tier::kDevice, "u.param"));
    TZ_ASSIGN_OR_RETURN(u.grad_acc, store->create_block(u.layout.shard * dtype_size(ctx.grad_dtype),
                                                        tier_of(ctx.grad_place), "u.grad"));
    ctx.counters.update_gathers.assign(1, 0);
    return Status::ok();
  }
  // This rank's parameter shard set to version `version`.
  Status write_shard(int version) {
    const Unit& u = ctx.units[0];
    std::vector<float> host(u.layout.shard);
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = param_value(ctx.rank, i, version);
    TZ_ASSIGN_OR_RETURN(Lease l, store->pin(u.param, Tier::kDevice, Access::kWrite));
    TZ_RETURN_IF_ERROR(l.wait());
    TZ_RETURN_IF_ERROR(ctx.device.copy_async(l.data(), host.data(), host.size() * 4,
                                             gpu::CopyKind::kHostToDevice, ctx.stream()));
    TZ_RETURN_IF_ERROR(ctx.sync(ctx.stream(), "write_shard"));
    l.release();
    return Status::ok();
  }
  std::vector<float> to_host(const void* device_ptr, std::size_t n) {
    std::vector<float> out(n);
    Status s = ctx.device.copy_async(out.data(), device_ptr, n * 4, gpu::CopyKind::kDeviceToHost,
                                     ctx.stream());
    if (s.is_ok()) s = ctx.sync(ctx.stream(), "to_host");
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return out;
  }
  // The full unit as gathered, checked against every rank's shard of `version`.
  void expect_gathered(const UnitViews& views, int version) {
    const Unit& u = ctx.units[0];
    ASSERT_EQ(views.tensors.size(), 2u);
    EXPECT_EQ(views.tensors[1].spec->name, "b");
    const std::vector<float> got = to_host(views.tensors[0].data, u.layout.padded);
    for (std::size_t e = 0; e < u.layout.padded; ++e) {
      const int owner = static_cast<int>(e / u.layout.shard);
      ASSERT_EQ(got[e], param_value(owner, e % u.layout.shard, version)) << "element " << e;
    }
  }
  EngineContext ctx;
  std::unique_ptr<PinnedPool> pool;
  std::unique_ptr<store::Store> store;
};

Config stage3_config() {
  Config c;
  c.zero.stage = 3;
  c.gradient_accumulation_steps = kMicroBatches;
  return c;
}

void expect_gathers(bool persistent) {
  const Config config = stage3_config();
  Status s = run_local_ranks(kRanks, 64u << 20, [&](int, gpu::Device& dev, comm::Comm& comm) {
    Rank r(config, dev, comm, Placement::kDevice);
    TZ_RETURN_IF_ERROR(r.build(persistent));
    ParameterCoordinator coordinator(r.ctx);
    coordinator.finalize();
    Unit& u = r.ctx.units[0];
    TZ_RETURN_IF_ERROR(r.write_shard(1));
    EXPECT_FALSE(coordinator.gathered(0));
    TZ_ASSIGN_OR_RETURN(UnitViews v, coordinator.gather(u));
    r.expect_gathered(v, 1);
    EXPECT_TRUE(coordinator.gathered(0));
    const UnitViews again = coordinator.add_ref(0);  // a second user: the same buffer
    EXPECT_EQ(again.tensors[0].data, v.tensors[0].data);
    TZ_RETURN_IF_ERROR(coordinator.release(u));
    EXPECT_TRUE(coordinator.gathered(0));
    TZ_RETURN_IF_ERROR(coordinator.release(u));
    EXPECT_FALSE(coordinator.gathered(0));
    // New parameters: a persistent unit keeps its gathered copy until invalidated.
    TZ_RETURN_IF_ERROR(r.write_shard(2));
    TZ_ASSIGN_OR_RETURN(v, coordinator.gather(u));
    r.expect_gathered(v, persistent ? 1 : 2);
    TZ_RETURN_IF_ERROR(coordinator.release(u));
    coordinator.invalidate(0);
    TZ_ASSIGN_OR_RETURN(v, coordinator.gather(u));
    r.expect_gathered(v, 2);
    TZ_RETURN_IF_ERROR(coordinator.release(u));
    TZ_RETURN_IF_ERROR(r.ctx.sync(r.ctx.stream(), "end"));
    r.ctx.buffers.reap(true);
    coordinator.clear();
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
}

TEST(ZeroComponents, CoordinatorGathersEveryRanksShard) { expect_gathers(false); }
TEST(ZeroComponents, CoordinatorKeepsAPersistentCopyUntilInvalidated) { expect_gathers(true); }

void expect_reduces(Placement grads) {
  const Config config = stage3_config();
  Status s = run_local_ranks(kRanks, 64u << 20, [&](int rank, gpu::Device& dev, comm::Comm& comm) {
    Rank r(config, dev, comm, grads);
    TZ_RETURN_IF_ERROR(r.build(false));
    GradientReducer reducer(r.ctx);
    TZ_RETURN_IF_ERROR(reducer.finalize());
    Unit& u = r.ctx.units[0];
    const std::size_t padded = u.layout.padded;
    // Copies from the host are asynchronous: the sources live until the stream is synchronized.
    std::vector<std::vector<float>> sources(kMicroBatches, std::vector<float>(padded));
    for (int m = 0; m < kMicroBatches; ++m) {
      TZ_ASSIGN_OR_RETURN(UnitViews g, reducer.grad(u));
      EXPECT_TRUE(reducer.holds_buffer(0));
      const std::vector<float> zeros = r.to_host(g.tensors[0].data, padded);
      for (float z : zeros) EXPECT_EQ(z, 0.0f);
      std::vector<float>& host = sources[static_cast<std::size_t>(m)];
      for (std::size_t i = 0; i < padded; ++i) host[i] = grad_value(rank, m, i);
      TZ_RETURN_IF_ERROR(r.ctx.device.copy_async(g.tensors[0].data, host.data(), padded * 4,
                                                 gpu::CopyKind::kHostToDevice, r.ctx.stream()));
      TZ_ASSIGN_OR_RETURN(const bool last, reducer.reduce(u));
      EXPECT_EQ(last, m == kMicroBatches - 1);
      EXPECT_FALSE(reducer.holds_buffer(0));
      EXPECT_EQ(reducer.reduces(0), m + 1);
    }
    // The accumulator: the sum over ranks and micro-batches of this rank's shard.
    TZ_RETURN_IF_ERROR(r.ctx.sync(r.ctx.stream(), "reduced"));
    {
      const Tier tier = grads == Placement::kDevice ? Tier::kDevice : Tier::kHost;
      TZ_ASSIGN_OR_RETURN(Lease acc, r.store->pin(u.grad_acc, tier, Access::kRead));
      TZ_RETURN_IF_ERROR(acc.wait());
      const std::vector<float> got =
          tier == Tier::kDevice
              ? r.to_host(acc.data(), u.layout.shard)
              : std::vector<float>(static_cast<const float*>(acc.data()),
                                   static_cast<const float*>(acc.data()) + u.layout.shard);
      for (std::size_t i = 0; i < u.layout.shard; ++i) {
        const std::size_t e = static_cast<std::size_t>(rank) * u.layout.shard + i;
        double want = 0;
        for (int q = 0; q < kRanks; ++q) {
          for (int m = 0; m < kMicroBatches; ++m) want += grad_value(q, m, e);
        }
        EXPECT_EQ(got[i], static_cast<float>(want)) << "element " << e;
      }
      acc.release();
    }
    // A host accumulator's sum of squares is taken at its last reduce, so the norm never reads it
    // again (an NVMe-homed one would come back from the disk for that): zeroed here, it still
    // gives the reduced gradient's norm. A device accumulator is summed where it lives, at the
    // norm.
    if (grads != Placement::kDevice) TZ_RETURN_IF_ERROR(r.ctx.zero_gradient(u, "test"));
    // The global norm over both ranks' shards: the float64 sum of squares of the whole sum.
    TZ_ASSIGN_OR_RETURN(gpu::NormAccumulator total, reducer.global_norm());
    double want = 0;
    for (std::size_t e = 0; e < padded; ++e) {
      double sum = 0;
      for (int q = 0; q < kRanks; ++q) {
        for (int m = 0; m < kMicroBatches; ++m) sum += grad_value(q, m, e);
      }
      want += sum * sum;
    }
    EXPECT_EQ(total.sum_squares, want);
    EXPECT_EQ(total.nonfinite_count, 0u);
    TZ_RETURN_IF_ERROR(reducer.zero_gradients());
    reducer.finish_step();
    EXPECT_EQ(reducer.reduces(0), 0);
    TZ_ASSIGN_OR_RETURN(gpu::NormAccumulator zeroed, reducer.global_norm());
    EXPECT_EQ(zeroed.sum_squares, 0.0);
    TZ_RETURN_IF_ERROR(r.ctx.sync(r.ctx.stream(), "end"));
    r.ctx.buffers.reap(true);
    reducer.clear();
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
}

TEST(ZeroComponents, ReducerAccumulatesOnTheDevice) { expect_reduces(Placement::kDevice); }
TEST(ZeroComponents, ReducerAccumulatesOnTheHost) { expect_reduces(Placement::kHost); }

// One micro-batch a step with bf16 compute: the host accumulator is kept in bf16
// (gradient_accumulator_dtype) and holds the reduced bf16 gradient itself, with -0 made +0 as
// fp32's 0 + g makes it (elements where both ranks' gradients are -0 sum to -0); its norm is the
// float64 sum of squares of the whole reduced gradient, taken at the reduce.
TEST(ZeroComponents, ReducerKeepsOneMicroBatchsGradientInBf16OnTheHost) {
  Config config = stage3_config();
  config.gradient_accumulation_steps = 1;
  auto value = [](int rank, std::size_t i) {
    return i % 17 == 0 ? -0.0f : grad_value(rank, 0, i);  // small integers: exact in bf16
  };
  Status s = run_local_ranks(kRanks, 64u << 20, [&](int rank, gpu::Device& dev, comm::Comm& comm) {
    Rank r(config, dev, comm, Placement::kHost);
    r.ctx.compute_dtype = DType::kBF16;
    r.ctx.grad_dtype = gradient_accumulator_dtype(DType::kBF16, Placement::kHost, 1);
    EXPECT_EQ(r.ctx.grad_dtype, DType::kBF16);
    TZ_RETURN_IF_ERROR(r.build(false));
    GradientReducer reducer(r.ctx);
    TZ_RETURN_IF_ERROR(reducer.finalize());
    Unit& u = r.ctx.units[0];
    const std::size_t padded = u.layout.padded;
    std::vector<bf16> host(padded);
    for (std::size_t i = 0; i < padded; ++i) host[i] = f32_to_bf16(value(rank, i));
    TZ_ASSIGN_OR_RETURN(UnitViews g, reducer.grad(u));
    TZ_RETURN_IF_ERROR(r.ctx.device.copy_async(g.tensors[0].data, host.data(), padded * 2,
                                               gpu::CopyKind::kHostToDevice, r.ctx.stream()));
    TZ_ASSIGN_OR_RETURN(const bool last, reducer.reduce(u));
    EXPECT_TRUE(last);
    TZ_RETURN_IF_ERROR(r.ctx.sync(r.ctx.stream(), "reduced"));
    double want_norm = 0;
    for (std::size_t e = 0; e < padded; ++e) {
      const double sum = static_cast<double>(value(0, e)) + value(1, e);
      want_norm += sum * sum;
    }
    {
      TZ_ASSIGN_OR_RETURN(Lease acc, r.store->pin(u.grad_acc, Tier::kHost, Access::kRead));
      TZ_RETURN_IF_ERROR(acc.wait());
      const auto* got = static_cast<const bf16*>(acc.data());
      for (std::size_t i = 0; i < u.layout.shard; ++i) {
        const std::size_t e = static_cast<std::size_t>(rank) * u.layout.shard + i;
        const float want = 0.0f + (value(0, e) + value(1, e));  // fp32's zeroed accumulator
        EXPECT_EQ(got[i].bits, f32_to_bf16(want).bits) << "element " << e;
      }
      acc.release();
    }
    TZ_ASSIGN_OR_RETURN(gpu::NormAccumulator total, reducer.global_norm());
    EXPECT_EQ(total.sum_squares, want_norm);
    EXPECT_EQ(total.nonfinite_count, 0u);
    TZ_RETURN_IF_ERROR(reducer.zero_gradients());
    reducer.finish_step();
    TZ_RETURN_IF_ERROR(r.ctx.sync(r.ctx.stream(), "end"));
    r.ctx.buffers.reap(true);
    reducer.clear();
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
}

}  // namespace
}  // namespace tz::zero::impl
