// The update on a worker (tierzero.stream_update; docs/zero.md, "Overlap modes"). exact: the
// update handed to a worker at step() and waited for unit by unit at the next gather gives the
// same bits as the update inside step(), on HostDevice ranks (LocalComm threads), over the
// placements where it applies, gradient accumulation, persistent and released units, and fp16
// steps an overflow skips; set_tensor and get_tensor right after step() see the finished update.
// eager: each early update queued for the worker in reduce() gives the same bits as eager's
// update inside reduce(), and as exact, with and without a snapshot, rolled back or kept.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_bodies.h"
#include "zero/engine.h"

namespace tz::zero {
namespace {

using testing::launch_local;
using testing::RunHooks;
using testing::RunSpec;

void expect_streamed_equals_in_step(RunSpec r, const RunHooks& hooks = {}) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(testing::kSeed));
  r.stream_update = false;
  const testing::RunResult in_step = testing::run(launch_local, r, hooks);
  r.stream_update = true;
  const testing::RunResult streamed = testing::run(launch_local, r, hooks);
  ASSERT_TRUE(in_step.ok && streamed.ok) << testing::describe(r);
  EXPECT_NE(streamed.hash, 0u);
  EXPECT_EQ(streamed.hash, in_step.hash) << testing::describe(r);
  EXPECT_EQ(streamed.weights, in_step.weights) << testing::describe(r);
  ASSERT_EQ(streamed.reports.size(), in_step.reports.size());
  for (std::size_t i = 0; i < streamed.reports.size(); ++i) {
    const StepReport& s = streamed.reports[i];
    EXPECT_EQ(s.grad_norm, in_step.reports[i].grad_norm) << testing::describe(r) << " step " << i;
    EXPECT_EQ(s.skipped, in_step.reports[i].skipped) << testing::describe(r) << " step " << i;
    EXPECT_EQ(s.loss_scale, in_step.reports[i].loss_scale) << testing::describe(r) << " step " << i;
    EXPECT_EQ(s.rolled_back, in_step.reports[i].rolled_back) << testing::describe(r) << " step "
                                                             << i;
  }
}

RunSpec stage3(const std::string& dtype, const std::string& param, const std::string& opt) {
  RunSpec r;
  r.ranks = 2;
  r.stage = 3;
  r.dtype = dtype;
  r.offload_param = param;
  r.offload_optimizer = opt;
  return r;
}

TEST(ZeroStreamUpdate, EqualsTheUpdateInsideStepBf16) {
  for (const std::string param : {"cpu", "nvme"}) {
    for (const std::string opt : {"cpu", "nvme"}) {
      for (long persistence : {-1L, 0L}) {
        RunSpec r = stage3("bf16", param, opt);
        r.persistence = persistence;
        SCOPED_TRACE(testing::describe(r));
        expect_streamed_equals_in_step(r);
      }
    }
  }
}

TEST(ZeroStreamUpdate, EqualsTheUpdateInsideStepFp32WithAccumulation) {
  RunSpec r = stage3("fp32", "nvme", "nvme");
  r.accumulation = 2;
  r.persistence = 0;
  expect_streamed_equals_in_step(r);
}

// A skipped step hands no update to the worker: step() zeroes the gradients itself.
TEST(ZeroStreamUpdate, EqualsTheUpdateInsideStepWithOverflowSkips) {
  RunSpec r = stage3("fp16", "nvme", "nvme");
  r.persistence = 0;
  RunHooks hooks;
  hooks.poison_steps = {1, 3};
  expect_streamed_equals_in_step(r, hooks);
  // and the skips happened
  r.stream_update = true;
  const testing::RunResult got = testing::run(launch_local, r, hooks);
  ASSERT_EQ(got.reports.size(), 5u);
  EXPECT_TRUE(got.reports[1].skipped);
  EXPECT_TRUE(got.reports[3].skipped);
  EXPECT_FALSE(got.reports[2].skipped);
}

// Reading the weights right after a step (the masters a checkpoint saves) waits for the streamed
// update: they equal the in-step run's after every step, not only at the end.
TEST(ZeroStreamUpdate, WeightsReadRightAfterAStepAreTheUpdatedOnes) {
  RunSpec r = stage3("bf16", "nvme", "nvme");
  r.persistence = 0;
  RunHooks hooks;
  hooks.read_after_step = 1;
  r.stream_update = false;
  const testing::RunResult in_step = testing::run(launch_local, r, hooks);
  r.stream_update = true;
  const testing::RunResult streamed = testing::run(launch_local, r, hooks);
  ASSERT_FALSE(in_step.weights_read.empty());
  EXPECT_EQ(streamed.weights_read, in_step.weights_read);
  EXPECT_EQ(streamed.hash, in_step.hash);
}

// set_tensor right after step() waits for the streamed update first: the value set is what the
// weights hold (the update does not overwrite it afterwards), the other tensors hold the update.
TEST(ZeroStreamUpdate, SetTensorRightAfterAStepWaitsForTheUpdate) {
  RunSpec r = stage3("bf16", "nvme", "nvme");
  r.persistence = 0;
  // The last unit: the one the streamed update reaches last.
  testing::expect_set_tensor_after_steps_sticks(launch_local, r,
                                                static_cast<UnitId>(r.shape.layers - 1));
}

// eager without clipping or loss scaling (no snapshot): the early updates on the worker beside
// the backward are the step's; the same bits as eager inside reduce() and as exact.
TEST(ZeroStreamUpdate, EagerOnTheWorkerEqualsEagerInReduceAndExact) {
  for (const std::string param : {"cpu", "nvme"}) {
    for (const std::string opt : {"cpu", "nvme"}) {
      RunSpec r = stage3("bf16", param, opt);
      r.overlap = "eager";
      r.clip = 0;
      r.persistence = 0;
      SCOPED_TRACE(testing::describe(r));
      expect_streamed_equals_in_step(r);
      testing::expect_eager_equals_exact(launch_local, r, /*expect_rollbacks=*/false);
    }
  }
}

// The worker's pins come at points of the step that move with its timing; they stay out of the
// store's trace (store::UntracedPins), so every step after the first follows the trace the one
// before recorded and the store prefetches along it (without that, each such step fell back to
// LRU at its first pins and the gpt2-774m step lost its parameter prefetch).
TEST(ZeroStreamUpdate, StepsWithTheUpdateOnTheWorkerFollowTheStoreTrace) {
  for (const std::string overlap : {"exact", "eager"}) {
    RunSpec r = stage3("bf16", "nvme", "nvme");
    r.overlap = overlap;
    r.clip = 0;
    r.persistence = 0;
    r.steps = 4;
    SCOPED_TRACE(testing::describe(r));
    const testing::RunResult res = testing::run(launch_local, r);
    ASSERT_TRUE(res.ok);
    for (const std::vector<StepReport>& reports : res.reports_by_rank) {
      ASSERT_EQ(reports.size(), 4u);
      EXPECT_FALSE(reports[0].trace_followed);  // the first step records the trace
      for (std::size_t i = 1; i < reports.size(); ++i) {
        EXPECT_TRUE(reports[i].trace_followed) << "step " << i + 1;
      }
    }
  }
}

// A clip threshold below every norm: the worker snapshots each unit before its early update, and
// every step rolls back and is redone exactly; fp32 with accumulation too.
TEST(ZeroStreamUpdate, EagerOnTheWorkerRollsBackWhenClippingTriggers) {
  RunSpec r = stage3("bf16", "nvme", "nvme");
  r.overlap = "eager";
  r.clip = 1e-3;
  r.persistence = 0;
  expect_streamed_equals_in_step(r);
  testing::expect_eager_equals_exact(launch_local, r, /*expect_rollbacks=*/true);
  r.dtype = "fp32";
  r.accumulation = 2;
  r.clip = 1e6;  // kept, never triggered
  expect_streamed_equals_in_step(r);
  testing::expect_eager_equals_exact(launch_local, r, /*expect_rollbacks=*/false);
}

// fp16 with an Inf on rank 0 at step 2: the worker's early updates of that step are rolled back
// and the step skipped on every rank.
TEST(ZeroStreamUpdate, EagerOnTheWorkerRollsBackAnInjectedInfUnderFp16) {
  RunSpec r = stage3("fp16", "cpu", "nvme");
  r.overlap = "eager";
  r.clip = 1e6;
  r.persistence = 0;
  RunHooks hooks;
  hooks.poison_steps = {2};
  expect_streamed_equals_in_step(r, hooks);
  testing::expect_eager_equals_exact(launch_local, r, /*expect_rollbacks=*/false, {2});
}

}  // namespace
}  // namespace tz::zero
