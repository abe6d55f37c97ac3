// Frozen units (UnitSpec::frozen, a LoRA base) on HostDevice ranks (LocalComm threads): the
// trainable units' masters are bit-identical across stages 0-3, optimizer placements, parameter
// offloads and overlap modes with frozen units next to them, and track a float64 reference in
// which the frozen layers never move; frozen units hold no optimizer state and their home copies
// see no write after loading (both counted at the store); the model API refuses what a frozen
// unit does not have.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine_bodies.h"
#include "zero/engine.h"
#include "zero/layout.h"

namespace tz::zero {
namespace {

using testing::kSeed;
using testing::launch_local;
using testing::ModelShape;
using testing::RunResult;
using testing::RunSpec;

// Four layers, the first and the third frozen (the last one trainable: the overflow tests
// poison its gradient).
ModelShape frozen_shape() {
  ModelShape s;
  s.layers = 4;
  s.frozen = {0, 2};
  return s;
}

// The frozen layers' weights as the engine keeps them: the initial values rounded to `dtype`.
void expect_frozen_untouched(const RunResult& got, const ModelShape& shape, DType dtype) {
  for (int l : shape.frozen) {
    const auto w = testing::init_weight(l, shape.width, shape.width, kSeed);
    const auto b = testing::init_bias(l, shape.width, kSeed);
    const auto& gw = got.weights[static_cast<std::size_t>(2 * l)];
    const auto& gb = got.weights[static_cast<std::size_t>(2 * l + 1)];
    ASSERT_EQ(gw.size(), w.size());
    ASSERT_EQ(gb.size(), b.size());
    for (std::size_t i = 0; i < w.size(); ++i) {
      ASSERT_EQ(gw[i], testing::round_to(dtype, w[i])) << "layer " << l << " weight " << i;
    }
    for (std::size_t i = 0; i < b.size(); ++i) {
      ASSERT_EQ(gb[i], testing::round_to(dtype, b[i])) << "layer " << l << " bias " << i;
    }
  }
}

TEST(ZeroFrozen, StagesAndPlacementsBitIdenticalBf16TwoRanks) {
  const ModelShape shape = frozen_shape();
  const RunResult ref = testing::expect_bit_identical(launch_local, 2, "bf16", 1, shape);
  ASSERT_TRUE(ref.ok);
  expect_frozen_untouched(ref, shape, DType::kBF16);
  // The trainable layers did move.
  const auto w1 = testing::init_weight(1, shape.width, shape.width, kSeed);
  EXPECT_NE(ref.weights[2][0], testing::round_to(DType::kBF16, w1[0]));
}

TEST(ZeroFrozen, StagesAndPlacementsBitIdenticalFp32Accumulation) {
  const ModelShape shape = frozen_shape();
  const RunResult ref = testing::expect_bit_identical(launch_local, 2, "fp32", 2, shape);
  ASSERT_TRUE(ref.ok);
  expect_frozen_untouched(ref, shape, DType::kF32);
}

// fp16: the loss scaler and the overflow check see only the trainable units' gradients.
TEST(ZeroFrozen, Fp16OverflowSkipsWithFrozenUnits) {
  RunSpec r;
  r.ranks = 2;
  r.stage = 3;
  r.dtype = "fp16";
  r.steps = 4;
  r.shape = frozen_shape();
  testing::RunHooks hooks;
  hooks.poison_steps = {2};
  const RunResult got = testing::run(launch_local, r, hooks);
  ASSERT_EQ(got.reports.size(), 4u);
  EXPECT_FALSE(got.reports[1].skipped);
  EXPECT_TRUE(got.reports[2].skipped);
  EXPECT_FALSE(got.reports[3].skipped);
  expect_frozen_untouched(got, r.shape, DType::kF16);
}

TEST(ZeroFrozen, EagerEqualsExactWithFrozenUnits) {
  RunSpec r;
  r.ranks = 2;
  r.dtype = "bf16";
  r.shape = frozen_shape();
  r.clip = 1e-3;  // every step clips: every early update rolls back
  for (int stage : {0, 2, 3}) {
    for (const std::string opt : {"none", "cpu"}) {
      if (stage == 0 && opt != "none") continue;
      r.stage = stage;
      r.offload_optimizer = opt;
      testing::expect_eager_equals_exact(launch_local, r, /*expect_rollbacks=*/true);
    }
  }
}

TEST(ZeroFrozen, DelayedEqualsStaleReferenceWithFrozenUnits) {
  testing::expect_delayed_equals_stale_reference(launch_local, 2, "bf16", 3, "nvme", "nvme", {},
                                                 frozen_shape());
  testing::expect_delayed_equals_stale_reference(launch_local, 2, "fp32", 2, "cpu", "none", {},
                                                 frozen_shape());
}

// Against the float64 reference in which the frozen layers stay at their initial values and
// neither enter the norm nor the update (ReferenceModel with the same shape).
TEST(ZeroFrozen, TracksFloat64Reference) {
  for (int stage : {0, 3}) {
    RunSpec r;
    r.ranks = 2;
    r.stage = stage;
    r.offload_param = stage == 3 ? "nvme" : "none";
    r.offload_optimizer = stage == 3 ? "cpu" : "none";
    r.steps = 20;
    r.clip = 0.5;
    r.shape = frozen_shape();
    const RunResult got = testing::run(launch_local, r);
    testing::ReferenceModel::Hyper h;
    h.clip = r.clip;
    testing::ReferenceModel ref(r.shape, h, kSeed);
    const int global = r.ranks * r.batch * r.accumulation;
    for (int step = 0; step < r.steps; ++step) {
      ref.adamw_step(ref.gradient(static_cast<std::int64_t>(step) * global, global, kSeed));
    }
    ASSERT_EQ(got.weights.size(), ref.params().size());
    for (std::size_t i = 0; i < got.weights.size(); ++i) {
      for (std::size_t j = 0; j < got.weights[i].size(); ++j) {
        const double want = ref.params()[i][j];
        ASSERT_LE(std::abs(got.weights[i][j] - want), 2e-4 + 2e-3 * std::abs(want))
            << "stage " << stage << " tensor " << i << " element " << j;
      }
    }
    expect_frozen_untouched(got, r.shape, DType::kF32);
  }
}

// One rank, bf16, stage 3 with both offloads where `param` and `opt` say, a host tier too small
// for the whole model: the NVMe bytes in use are exactly the blocks a frozen unit (parameters
// only) and a trainable unit (parameters, master, two Adam states) own, and no step writes a
// frozen unit's home copy while the trainable ones are written every step.
void expect_frozen_read_only(const std::string& param, const std::string& opt) {
  RunSpec r;
  r.ranks = 1;
  r.stage = 3;
  r.dtype = "bf16";
  r.offload_param = param;
  r.offload_optimizer = opt;
  r.steps = 4;
  r.persistence = 0;  // every unit gathered and released at each use
  // A device cache of two shards: offloaded shards are loaded again at every use.
  r.zero_extra = ", \"stage3_prefetch_bucket_size\": 4096";
  r.shape.layers = 8;
  r.shape.frozen = {0, 1, 2, 4, 5, 6};
  // Host tier: the plan's least, the host-homed bf16 gradient shards of the trainable units (one
  // micro-batch a step: 2 B an element) and two units of NVMe-homed state (rounded to 16 KiB)
  // beside four 64 KiB store chunks and the engine's 16-bit and fp32 staging of one unit, so
  // NVMe-homed blocks are evicted and loaded again every step.
  const std::uint64_t unit_nvme =
      ((param == "nvme" ? 2048 * 2 : 0) + (opt == "nvme" ? 3 * 2048 * 4 : 0) + 16383) / 16384 *
      16384;
  const std::uint64_t host_grads = opt == "none" ? 0 : 2 * 2048 * 2;
  if (unit_nvme > 0) r.host_budget = host_grads + 2 * unit_nvme + 4 * (64u << 10) + 4096 + 8192;
  const RunResult got = testing::run(launch_local, r);
  ASSERT_TRUE(got.ok);
  ASSERT_EQ(got.reports.size(), 4u);
  const std::uint64_t shard = 2048;  // a 24x24+24 unit pads to one 2048-element shard
  const std::uint64_t frozen = r.shape.frozen.size();
  const std::uint64_t trainable = static_cast<std::uint64_t>(r.shape.layers) - frozen;
  std::uint64_t nvme = 0;
  if (param == "nvme") nvme += (frozen + trainable) * shard * 2;
  if (opt == "nvme") nvme += trainable * shard * 4 * 3;
  std::uint64_t read_after_first = 0;
  for (std::size_t i = 0; i < got.reports.size(); ++i) {
    const StepReport& rep = got.reports[i];
    EXPECT_EQ(rep.bytes_in_use.nvme, nvme) << param << "/" << opt << " step " << i + 1;
    EXPECT_EQ(rep.frozen_home_write_bytes, 0u) << param << "/" << opt << " step " << i + 1;
    EXPECT_GT(rep.trainable_home_write_bytes, 0u) << param << "/" << opt << " step " << i + 1;
    if (i > 0) read_after_first += rep.nvme_read_bytes;
  }
  // After the first step (which finds the loaded blocks cached) both kinds of units stream from
  // NVMe when their state does not fit the host tier. Over the steps, not per step: a step counts
  // the reads that finished in it, and the first ones of step 2 are prefetches started when step
  // 1 ended (Store::mark_step), which on a loaded machine finish before step 2 begins.
  if (param == "nvme" && opt == "nvme") {
    EXPECT_GT(read_after_first, 0u);
  }
}

TEST(ZeroFrozen, ReadOnlyOnNvme) { expect_frozen_read_only("nvme", "nvme"); }
TEST(ZeroFrozen, ReadOnlyOnNvmeOptimizerOnDevice) { expect_frozen_read_only("nvme", "none"); }
TEST(ZeroFrozen, ReadOnlyOnHost) { expect_frozen_read_only("cpu", "cpu"); }
TEST(ZeroFrozen, ReadOnlyOnDevice) { expect_frozen_read_only("none", "nvme"); }

// The model API on a frozen unit: grad() and reduce() refused naming it; optimizer states refused;
// set_tensor(kMaster) rounds to the compute dtype and get_tensor widens it back; the counts.
TEST(ZeroFrozen, ApiRefusesWhatAFrozenUnitLacks) {
  RunSpec r;
  r.ranks = 2;
  r.stage = 3;
  r.dtype = "bf16";
  EngineOptions opts;
  opts.config = testing::make_config(testing::config_json(r));
  Status s = run_local_ranks(2, 64u << 20, [&](int, gpu::Device& dev, comm::Comm& comm) -> Status {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::create(opts, dev, comm));
    UnitSpec base{"base.0", {{"weight", {40, 30}}}, /*frozen=*/true};
    UnitSpec adapter{"lora.0", {{"A", {4, 30}}, {"B", {40, 4}}}};
    TZ_ASSIGN_OR_RETURN(UnitId b, e->register_unit(base));
    TZ_ASSIGN_OR_RETURN(UnitId a, e->register_unit(adapter));
    TZ_RETURN_IF_ERROR(e->finalize());
    EXPECT_EQ(e->param_count(), 40u * 30 + 4 * 30 + 40 * 4);
    EXPECT_EQ(e->trainable_param_count(), 4u * 30 + 40 * 4);
    EXPECT_TRUE(e->unit_spec(b).frozen);
    EXPECT_FALSE(e->unit_spec(a).frozen);

    Result<UnitViews> g = e->grad(b);
    EXPECT_EQ(g.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("base.0"), std::string::npos) << g.status().to_string();
    EXPECT_NE(g.status().message().find("frozen"), std::string::npos) << g.status().to_string();
    Status red = e->reduce(b);
    EXPECT_EQ(red.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(red.message().find("base.0"), std::string::npos) << red.to_string();

    std::vector<float> values(1200);
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = 1.0f + static_cast<float>(i) * 1.37e-3f;  // most need rounding to bf16
    }
    TZ_RETURN_IF_ERROR(e->set_tensor(b, 0, values));
    std::vector<float> back(values.size());
    TZ_RETURN_IF_ERROR(e->get_tensor(b, 0, back));
    std::size_t rounded = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(back[i], testing::round_to(DType::kBF16, values[i])) << i;
      rounded += back[i] != values[i];
    }
    EXPECT_GT(rounded, values.size() / 2);
    for (TensorState st : {TensorState::kState0, TensorState::kState1}) {
      Status gs = e->get_tensor(b, 0, back, st);
      EXPECT_EQ(gs.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(gs.message().find("base.0"), std::string::npos) << gs.to_string();
      EXPECT_EQ(e->set_tensor(b, 0, values, st).code(), ErrorCode::kInvalidArgument);
    }
    // The gathered unit holds the same compute-dtype values.
    TZ_ASSIGN_OR_RETURN(UnitViews v, e->gather(b));
    TZ_RETURN_IF_ERROR(e->compute_stream().synchronize());
    for (std::size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(testing::load(v[0], i), back[i]) << i;
    }
    TZ_RETURN_IF_ERROR(e->release(b));
    // A step in which only the adapter has a gradient.
    TZ_ASSIGN_OR_RETURN(UnitViews ga, e->grad(a));
    TZ_RETURN_IF_ERROR(e->compute_stream().synchronize());
    for (std::size_t i = 0; i < ga[0].numel(); ++i) testing::store(ga[0], i, 0.5f);
    TZ_RETURN_IF_ERROR(e->reduce(a));
    TZ_ASSIGN_OR_RETURN(StepReport rep, e->step());
    // The norm is the adapter's alone: 120 elements of 0.5 summed over 2 ranks, averaged (1/N).
    EXPECT_NEAR(rep.grad_norm, std::sqrt(120.0) * 0.5, 1e-6);
    TZ_RETURN_IF_ERROR(e->get_tensor(b, 0, back));
    for (std::size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(back[i], testing::round_to(DType::kBF16, values[i])) << i;
    }
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

// A LoRA-like shape: a frozen base unit far larger than the trainable adapter beside it. Over
// every stage and placement: the measured peak of every tier stays within the plan (which sizes
// staging, scratch and gradient buffers by the trainable units), the base never changes and its
// home copy is never written after loading.
TEST(ZeroFrozen, LargeFrozenBasePeaksWithinThePlan) {
  RunSpec base;  // two ranks
  base.dtype = "bf16";
  base.persistence = 0;
  for (const RunSpec& r : testing::every_placement(base)) {
    SCOPED_TRACE(testing::describe(r));
    EngineOptions opts;
    opts.config = testing::make_config(testing::config_json(r));
    Status s = run_local_ranks(2, 64u << 20, [&](int, gpu::Device& dev,
                                                  comm::Comm& comm) -> Status {
      TZ_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::create(opts, dev, comm));
      TZ_ASSIGN_OR_RETURN(UnitId a, e->register_unit({"lora.0", {{"A", {8, 300}}}}));
      TZ_ASSIGN_OR_RETURN(UnitId b,
                          e->register_unit({"base.0", {{"w", {300, 300}}, {"b", {300}}}, true}));
      TZ_RETURN_IF_ERROR(e->finalize());
      std::vector<float> w(90000), bias(300), got(90000);
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.001f * static_cast<float>(i));
      for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = 0.01f * static_cast<float>(i);
      TZ_RETURN_IF_ERROR(e->set_tensor(b, 0, w));
      TZ_RETURN_IF_ERROR(e->set_tensor(b, 1, bias));
      for (int step = 0; step < 3; ++step) {
        TZ_ASSIGN_OR_RETURN(UnitViews vb, e->gather(b));
        TZ_ASSIGN_OR_RETURN(UnitViews va, e->gather(a));
        TZ_ASSIGN_OR_RETURN(UnitViews ga, e->grad(a));
        TZ_RETURN_IF_ERROR(e->compute_stream().synchronize());
        // d(A) = a function of the base's gathered values, so the step uses them.
        for (std::size_t i = 0; i < ga[0].numel(); ++i) {
          testing::store(ga[0], i, 0.1f * testing::load(vb[0], i) + testing::load(va[0], i));
        }
        TZ_RETURN_IF_ERROR(e->release(a));
        TZ_RETURN_IF_ERROR(e->release(b));
        TZ_RETURN_IF_ERROR(e->reduce(a));
        TZ_ASSIGN_OR_RETURN(StepReport rep, e->step());
        EXPECT_EQ(rep.frozen_home_write_bytes, 0u) << "step " << step + 1;
        EXPECT_GT(rep.grad_norm, 0.0) << "step " << step + 1;
        if (step == 2) {
          const TierBytes plan = e->plan_bytes();
          EXPECT_GT(rep.peak_bytes.device, 0u);
          EXPECT_LE(rep.peak_bytes.device, plan.device);
          EXPECT_LE(rep.peak_bytes.host, plan.host);
          EXPECT_LE(rep.peak_bytes.nvme, plan.nvme);
        }
      }
      TZ_RETURN_IF_ERROR(e->get_tensor(b, 0, got));
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (got[i] != testing::round_to(DType::kBF16, w[i])) {
          return Status::internal("base weight " + std::to_string(i) + " changed");
        }
      }
      return Status::ok();
    });
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
}

}  // namespace
}  // namespace tz::zero
