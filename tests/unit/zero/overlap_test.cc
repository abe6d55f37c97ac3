// The optimizer overlap modes on HostDevice ranks (LocalComm threads): "delayed" equals an
// exact-mode run whose updates are applied one step late, bit for bit, over stages 1-3 and the
// CPU and NVMe optimizer placements; "eager" equals "exact" bit for bit without clipping or loss
// scaling, and after forced rollbacks (a clip threshold that triggers, an injected Inf under
// fp16); configurations a mode cannot run are refused by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/trace.h"
#include "engine_bodies.h"
#include "zero/engine.h"

namespace tz::zero {
namespace {

using testing::launch_local;
using testing::RunSpec;

TEST(ZeroOverlap, DelayedEqualsOneStepLateReferenceBf16) {
  for (int stage = 1; stage <= 3; ++stage) {
    for (const std::string opt : {"cpu", "nvme"}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " optimizer " + opt);
      testing::expect_delayed_equals_stale_reference(launch_local, 2, "bf16", stage, opt);
    }
  }
}

TEST(ZeroOverlap, DelayedEqualsOneStepLateReferenceStage3ParamOffload) {
  for (const std::string param : {"cpu", "nvme"}) {
    SCOPED_TRACE("parameters " + param);
    testing::expect_delayed_equals_stale_reference(launch_local, 2, "bf16", 3, "nvme", param);
  }
}

TEST(ZeroOverlap, DelayedEqualsOneStepLateReferenceFp32FourRanks) {
  testing::expect_delayed_equals_stale_reference(launch_local, 4, "fp32", 2, "cpu");
}

// fp16 with an Inf at step 2: the reference skips the same step (the decision is step 2's own
// gradient), and the pending update of step 1 is still published.
TEST(ZeroOverlap, DelayedWithOverflowEqualsOneStepLateReference) {
  testing::expect_delayed_equals_stale_reference(launch_local, 2, "fp16", 3, "cpu", "none", {2});
  testing::expect_overflow_skips_every_rank(launch_local, 2, "delayed", "cpu");
}

TEST(ZeroOverlap, DelayedRefusesTheOptimizerOnTheDevice) {
  EngineOptions opts;
  opts.config = testing::make_config(R"({"zero_optimization": {"stage": 2},
                                         "tierzero": {"overlap": "delayed"}})");
  Status s = run_local_ranks(1, 64u << 20, [&](int, gpu::Device& dev, comm::Comm& comm) {
    return Engine::create(opts, dev, comm).status();
  });
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("tierzero.overlap"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("offload_optimizer.device"), std::string::npos) << s.to_string();
}

// set_tensor while an update is pending waits for it and publishes it first: the value set is
// what get_tensor returns (the background update does not overwrite it), and the other tensors
// keep the pending update (they equal a run without the set_tensor).
TEST(ZeroOverlap, DelayedSetTensorWaitsForThePendingUpdate) {
  RunSpec r;
  r.ranks = 2;
  r.stage = 2;
  r.offload_optimizer = "cpu";
  r.dtype = "bf16";
  r.overlap = "delayed";
  testing::expect_set_tensor_after_steps_sticks(launch_local, r, 0);
}

// No clipping, no loss scaling: the early updates are the step's updates (no snapshot kept).
TEST(ZeroOverlap, EagerEqualsExactWithoutClippingOrScaling) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (const std::string opt : {"none", "cpu", "nvme"}) {
      if (stage == 0 && opt != "none") continue;
      for (const std::string dtype : {"fp32", "bf16"}) {
        RunSpec r;
        r.ranks = 2;
        r.stage = stage;
        r.offload_optimizer = opt;
        r.dtype = dtype;
        r.clip = 0;
        r.persistence = stage == 3 ? 0 : -1;
        testing::expect_eager_equals_exact(launch_local, r, /*expect_rollbacks=*/false);
      }
    }
  }
}

// Clipping configured but never triggered (threshold far above the norm): snapshot kept, no
// rollback, same bits; with accumulation too.
TEST(ZeroOverlap, EagerEqualsExactWhenClippingDoesNotTrigger) {
  RunSpec r;
  r.ranks = 2;
  r.stage = 2;
  r.offload_optimizer = "cpu";
  r.dtype = "bf16";
  r.clip = 1e6;
  r.accumulation = 2;
  testing::expect_eager_equals_exact(launch_local, r, /*expect_rollbacks=*/false);
}

// A clip threshold below every step's norm: every step rolls back and is redone exactly.
TEST(ZeroOverlap, EagerRollsBackWhenClippingTriggers) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (const std::string opt : {"none", "cpu", "nvme"}) {
      if (stage == 0 && opt != "none") continue;
      RunSpec r;
      r.ranks = 2;
      r.stage = stage;
      r.offload_optimizer = opt;
      r.dtype = "bf16";
      r.clip = 1e-3;
      r.persistence = stage == 3 ? 0 : -1;
      testing::expect_eager_equals_exact(launch_local, r, /*expect_rollbacks=*/true);
    }
  }
}

// fp16 dynamic loss scaling with an Inf on rank 0 at step 2: that step rolls back and is skipped
// on every rank, its parameters restored; the others need no rollback (the clip never triggers).
TEST(ZeroOverlap, EagerRollsBackAnInjectedInfUnderFp16) {
  for (int stage = 1; stage <= 3; ++stage) {
    for (const std::string opt : {"none", "cpu"}) {
      RunSpec r;
      r.ranks = 2;
      r.stage = stage;
      r.offload_optimizer = opt;
      r.dtype = "fp16";
      r.clip = 1e6;
      r.persistence = stage == 3 ? 0 : -1;
      testing::expect_eager_equals_exact(launch_local, r, /*expect_rollbacks=*/false, {2});
    }
  }
  testing::expect_overflow_skips_every_rank(launch_local, 2, "eager", "cpu");
}

// Without a snapshot (no clipping, bf16) a non-finite gradient cannot be undone: step() says so.
TEST(ZeroOverlap, EagerWithoutSnapshotReportsANonFiniteGradient) {
  RunSpec r;
  r.ranks = 1;
  r.stage = 1;
  r.dtype = "bf16";
  r.clip = 0;
  r.overlap = "eager";
  EngineOptions opts;
  opts.config = testing::make_config(testing::config_json(r));
  Status s = run_local_ranks(1, 64u << 20, [&](int, gpu::Device& dev, comm::Comm& comm) {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(opts, dev, comm));
    testing::EngineModel model(*engine, r.shape);
    TZ_RETURN_IF_ERROR(model.build());
    TZ_RETURN_IF_ERROR(model.init(testing::kSeed));
    return model.train_step(0, r.batch, testing::kSeed, /*poison=*/true).status();
  });
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("tierzero.overlap \"eager\""), std::string::npos) << s.to_string();
}

// A traced eager run with the states on NVMe shows the worker's side: the CPU optimizer's waits
// for master and states and its steps, per unit, on their own tracks (docs/train.md, --trace-out).
TEST(ZeroOverlap, EagerStreamedUpdatesAppearOnTheOptimizerTrack) {
  RunSpec r;
  r.ranks = 1;
  r.stage = 3;
  r.offload_optimizer = "nvme";
  r.offload_param = "nvme";  // stage 3 with nothing on the device: the worker streams the updates
  r.overlap = "eager";
  r.dtype = "bf16";
  r.clip = 0;
  r.persistence = 0;
  r.steps = 2;
  Trace::global().enable();
  const std::size_t before = Trace::global().event_count();
  (void)testing::run(launch_local, r);
  ASSERT_FALSE(HasFailure()) << "the traced run failed";
  ASSERT_GT(Trace::global().event_count(), before);
  const nlohmann::json j = nlohmann::json::parse(Trace::global().to_json());
  std::map<std::string, int> tracks;  // name -> tid
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["args"]["name"]] = e["tid"];
  }
  ASSERT_TRUE(tracks.count("cpu optimizer")) << j.dump().substr(0, 2000);
  EXPECT_TRUE(tracks.count("eager worker"));
  std::size_t steps = 0;
  std::size_t waits = 0;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e["ph"] != "X" || e["tid"] != tracks["cpu optimizer"]) continue;
    const std::string name = e["name"];
    steps += name.rfind("step ", 0) == 0;
    waits += name.rfind("wait master, states ", 0) == 0;
  }
  // Every trainable unit is stepped once a step, after waiting for its states.
  EXPECT_GE(steps, 2 * static_cast<std::size_t>(r.shape.layers));
  EXPECT_EQ(steps, waits);
}

// One unit's fp32 master and two Adam states in the test model (2048 elements a shard).
constexpr std::uint64_t kUnitStates = 3 * 2048 * 4;

// Two ranks at stage 3, both offloads on NVMe, bf16 without clipping (eager keeps no snapshot),
// `layers` units and a host tier of `host_budget` bytes; `steps` steps run under exact and then
// eager, whose bits must be exact's.
struct ExactAndEager {
  testing::RunResult exact, eager;
};
ExactAndEager run_nvme_exact_and_eager(int layers, std::uint64_t host_budget, long persistence,
                                       int steps = 5) {
  RunSpec r;
  r.ranks = 2;
  r.stage = 3;
  r.offload_optimizer = "nvme";
  r.offload_param = "nvme";
  r.dtype = "bf16";
  r.clip = 0;
  r.persistence = persistence;
  r.shape.layers = layers;
  r.steps = steps;
  r.host_budget = host_budget;
  ExactAndEager out;
  out.exact = testing::run(launch_local, r);
  r.overlap = "eager";
  out.eager = testing::run(launch_local, r);
  EXPECT_EQ(out.eager.hash, out.exact.hash);
  EXPECT_EQ(out.exact.reports.size(), static_cast<std::size_t>(steps));
  EXPECT_EQ(out.eager.reports.size(), static_cast<std::size_t>(steps));
  return out;
}

// Both offloads on NVMe and a host tier that holds four of the eight units' states: once the
// worker's queue of kept early updates is done in the next forward, it reads the next backward's
// first units' states ahead (EagerOverlap::read_ahead_next_backward). The steps report those
// loads as state_read_ahead_bytes, and the bits are exact's.
TEST(ZeroOverlap, EagerReadsTheNextBackwardsStatesAheadInTheForward) {
  // As ZeroEngine.NvmeStreamingUnderSmallHostTierIsBitIdentical: four units' master and states,
  // the eight bf16 gradient shards, the staging.
  const ExactAndEager runs = run_nvme_exact_and_eager(
      8, 4 * (kUnitStates + 2048 * 2) + 8 * 2048 * 2 + 4 * (64u << 10) + 4096 * (2 + 4), 0, 12);
  ASSERT_FALSE(HasFailure());
  const testing::RunResult& got = runs.eager;
  EXPECT_EQ(got.reports[0].state_read_ahead_bytes, 0u);  // no step before it to read ahead for
  std::uint64_t read_ahead = 0;
  for (const StepReport& report : got.reports) read_ahead += report.state_read_ahead_bytes;
  // A step counts the loads done by its first reduce, and this forward takes microseconds, so a
  // step may count a part or none: over four steps the sum fell short of one unit's master and
  // states in 3 of 40 runs on a quiet machine (twenty-fourth session); over eleven, at least that.
  EXPECT_GE(read_ahead, kUnitStates);
}

// The CPU optimizer hashes the master, states and parameters it writes while they are in its
// cache and hands the sums to the store (Lease::release_hashed), so their write-backs are not
// hashed again: under exact's streamed update and eager's worker alike, with the bits unchanged
// (run_nvme_exact_and_eager compares them).
TEST(ZeroOverlap, TheOptimizerHashesWhatItWritesForTheStore) {
  const ExactAndEager runs = run_nvme_exact_and_eager(
      8, 4 * (kUnitStates + 2048 * 2) + 8 * 2048 * 2 + 4 * (64u << 10) + 4096 * (2 + 4), 0);
  ASSERT_FALSE(HasFailure());
  for (const testing::RunResult* r : {&runs.exact, &runs.eager}) {
    std::uint64_t hashed = 0, written = 0;
    for (const StepReport& report : r->reports) {
      EXPECT_LE(report.writer_hashed_bytes, report.nvme_write_bytes);
      hashed += report.writer_hashed_bytes;
      written += report.nvme_write_bytes;
    }
    std::printf("NVMe bytes written %llu, of them hashed by the optimizer %llu\n",
                static_cast<unsigned long long>(written), static_cast<unsigned long long>(hashed));
    EXPECT_GT(hashed, written / 2);
  }
}

// Gradient accumulators homed on NVMe (32 units' shards do not fit beside the host tier's
// minimum, as in ZeroEngine.GradientNvmeBytesAreTheAccumulatorsShareOfTheDisksBytes). Under exact
// every shard waits for the update after the backward, and most go home and come back. Under
// eager the worker reads each shard soon after the backward wrote it and zeroes it after the
// update, so none needs the disk: the trace has no use of a shard between its reduce and the next
// step's (an overwrite), and without EagerOverlap::on_reduced keeping it in the host tier it was
// the first copy evicted, written home and read back, nearly every shard every step. Here the
// backward outruns the worker (it takes microseconds), so a kept shard can still be evicted once
// nothing else is left: a bound, not zero.
TEST(ZeroOverlap, EagerKeepsNvmeHomedGradientsInTheHostTierUntilTheirUpdate) {
  const ExactAndEager runs = run_nvme_exact_and_eager(
      32, 4 * (kUnitStates + 2048 * 2) + (64u << 10) + 4 * (64u << 10) + 4096 * (2 + 4), -1);
  ASSERT_FALSE(HasFailure());
  const testing::RunResult& want = runs.exact;
  const testing::RunResult& got = runs.eager;
  std::uint64_t exact_moved = 0, eager_moved = 0;
  for (std::size_t i = 1; i < got.reports.size(); ++i) {
    exact_moved += want.reports[i].gradient_nvme_write_bytes;
    eager_moved += got.reports[i].gradient_nvme_write_bytes;
  }
  std::printf("steps 2-5: gradient bytes written home, exact %llu, eager %llu\n",
              static_cast<unsigned long long>(exact_moved),
              static_cast<unsigned long long>(eager_moved));
  EXPECT_GT(exact_moved, 0u) << "the accumulators are not homed on NVMe";
  EXPECT_LT(eager_moved, exact_moved / 4);
}

// The plan counts eager's snapshot and delayed's buffers, and the measured peaks stay within it.
TEST(ZeroOverlap, PlanCountsOverlapBuffersAndPeaksStayWithin) {
  for (const std::string overlap : {"eager", "delayed"}) {
    for (const std::string opt : {"none", "cpu", "nvme"}) {
      if (overlap == "delayed" && opt == "none") continue;
      RunSpec r;
      r.ranks = 2;
      r.stage = 3;
      r.dtype = "bf16";
      r.offload_optimizer = opt;
      r.overlap = overlap;
      r.clip = 1e-3;  // eager: a snapshot, and rollbacks every step
      r.persistence = 0;
      r.steps = 3;
      RunSpec exact = r;
      exact.overlap = "exact";
      const testing::RunResult base = testing::run(launch_local, exact);
      const testing::RunResult got = testing::run(launch_local, r);
      for (std::size_t rank = 0; rank < got.reports_by_rank.size(); ++rank) {
        SCOPED_TRACE(testing::describe(r) + " rank " + std::to_string(rank));
        const TierBytes plan = got.plan_by_rank[rank];
        const TierBytes peak = got.reports_by_rank[rank].back().peak_bytes;
        EXPECT_LE(peak.device, plan.device);
        EXPECT_LE(peak.host, plan.host);
        EXPECT_LE(peak.nvme, plan.nvme);
        // 3 units of 2048-element shards: Adam keeps master, m, v (12 B) per element; delayed
        // keeps a bf16 gradient (2 B: one micro-batch a step) and a bf16 parameter (2 B) per
        // element.
        const std::uint64_t extra = overlap == "eager" ? 3 * 2048 * 12 : 3 * 2048 * 4;
        const TierBytes b = base.plan_by_rank[rank];
        if (overlap == "eager" && opt == "none") {
          EXPECT_EQ(plan.device, b.device + extra);
        } else {
          EXPECT_EQ(plan.host, b.host + extra);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tz::zero
