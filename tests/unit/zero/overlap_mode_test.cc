// The overlap modes (zero/overlap.h) and the components' entry-point invariants, without an
// engine: the mode a config selects (a table written out by hand from docs/zero.md's rules), when
// eager keeps a snapshot, the update worker's one-job protocol, the decisions each mode accepts
// (a decision another mode's kind produced aborts), and the components refusing work before
// finalize. A context with a HostDevice and a one-rank LocalComm and no store stands in for the
// engine: any step that touched the store would abort on its absence, so the transitions that
// must do nothing (a skipped exact step, delayed's publish with nothing pending) are checked to
// do nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "comm/local_comm.h"
#include "gpu/host_device.h"
#include "zero/coordinator.h"
#include "zero/optimizer_driver.h"
#include "zero/overlap.h"
#include "zero/reducer.h"

namespace tz::zero::impl {
namespace {

Config overlap_config(const std::string& mode, double clipping = 0, bool fp16 = false) {
  Config c;
  c.tierzero.overlap = mode;
  c.gradient_clipping = clipping;
  c.fp16.enabled = fp16;
  return c;
}

struct ModeRow {
  std::string mode;
  Placement optimizer;
  int stage;
  bool ok;
  Overlap kind;          // when ok
  std::string mentions;  // in the error otherwise
};

TEST(OverlapModeConfig, TheModeEachConfigSelects) {
  const std::vector<ModeRow> rows = {
      {"exact", Placement::kDevice, 0, true, Overlap::kExact, ""},
      {"exact", Placement::kNvme, 3, true, Overlap::kExact, ""},
      {"eager", Placement::kDevice, 0, true, Overlap::kEager, ""},
      {"eager", Placement::kHost, 2, true, Overlap::kEager, ""},
      {"delayed", Placement::kHost, 1, true, Overlap::kDelayed, ""},
      {"delayed", Placement::kNvme, 3, true, Overlap::kDelayed, ""},
      {"delayed", Placement::kDevice, 2, false, Overlap::kExact, "offload_optimizer.device"},
      {"delayed", Placement::kHost, 0, false, Overlap::kExact, "stage >= 1"},
      {"lazy", Placement::kHost, 2, false, Overlap::kExact, "expected exact, eager or delayed"},
  };
  for (const ModeRow& r : rows) {
    SCOPED_TRACE(r.mode + " optimizer " + std::string(placement_name(r.optimizer)) + " stage " +
                 std::to_string(r.stage));
    auto got = overlap_from_config(overlap_config(r.mode), r.optimizer, r.stage);
    ASSERT_EQ(got.is_ok(), r.ok) << (got.is_ok() ? "" : got.status().to_string());
    if (r.ok) {
      EXPECT_EQ(*got, r.kind);
    } else {
      EXPECT_NE(got.status().message().find("tierzero.overlap"), std::string::npos);
      EXPECT_NE(got.status().message().find(r.mentions), std::string::npos)
          << got.status().to_string();
    }
  }
}

TEST(OverlapModeConfig, EagerKeepsASnapshotOnlyWhenAStepCanUndoIt) {
  EXPECT_FALSE(eager_needs_snapshot(overlap_config("eager")));
  EXPECT_TRUE(eager_needs_snapshot(overlap_config("eager", 1.0)));
  EXPECT_TRUE(eager_needs_snapshot(overlap_config("eager", 0, /*fp16=*/true)));
  EXPECT_TRUE(eager_needs_snapshot(overlap_config("eager", 0.5, /*fp16=*/true)));
}

// Streamed only where the whole update is host work, in exact mode, unless the key turns it off
// (rows from docs/zero.md's rule: stage 3, parameters, gradients and optimizer off the device).
TEST(OverlapModeConfig, StreamsTheUpdateOnlyWhereItIsHostWork) {
  using P = Placement;
  struct Row {
    std::string mode;
    bool key;
    int stage;
    P param, grads, opt;
    bool streams;
  };
  const std::vector<Row> rows = {
      {"exact", true, 3, P::kNvme, P::kHost, P::kNvme, true},
      {"exact", true, 3, P::kHost, P::kHost, P::kHost, true},
      {"exact", true, 3, P::kHost, P::kNvme, P::kNvme, true},
      {"exact", false, 3, P::kNvme, P::kHost, P::kNvme, false},
      {"exact", true, 2, P::kDevice, P::kHost, P::kNvme, false},
      {"exact", true, 3, P::kDevice, P::kHost, P::kNvme, false},
      {"exact", true, 3, P::kNvme, P::kDevice, P::kDevice, false},
      {"exact", true, 3, P::kNvme, P::kHost, P::kDevice, false},
      {"eager", true, 3, P::kNvme, P::kHost, P::kNvme, true},
      {"eager", true, 3, P::kHost, P::kHost, P::kHost, true},
      {"eager", false, 3, P::kNvme, P::kHost, P::kNvme, false},
      {"eager", true, 2, P::kDevice, P::kHost, P::kNvme, false},
      {"eager", true, 3, P::kDevice, P::kHost, P::kNvme, false},
      {"eager", true, 3, P::kNvme, P::kHost, P::kDevice, false},
      {"delayed", true, 3, P::kNvme, P::kHost, P::kNvme, false},
  };
  for (const Row& r : rows) {
    Config c = overlap_config(r.mode);
    c.tierzero.stream_update = r.key;
    SCOPED_TRACE(r.mode + " key " + std::to_string(r.key) + " stage " + std::to_string(r.stage) +
                 " param " + std::string(placement_name(r.param)) + " grads " +
                 std::string(placement_name(r.grads)) + " optimizer " +
                 std::string(placement_name(r.opt)));
    EXPECT_EQ(streams_update(c, r.stage, r.param, r.grads, r.opt), r.streams);
  }
}

// The queue a kept eager step leaves arrives in the backward's order (the last unit first); the
// next forward needs the first unit first, so all but the front (its states were read ahead) are
// put in registration order. Short queues stay as they are.
TEST(EagerQueue, RunsIntoTheNextForwardInRegistrationOrder) {
  std::vector<Unit> units(6);
  for (std::size_t i = 0; i < units.size(); ++i) units[i].id = static_cast<UnitId>(i);
  auto ids = [](const std::deque<Unit*>& q) {
    std::vector<UnitId> out;
    for (const Unit* u : q) out.push_back(u->id);
    return out;
  };
  std::deque<Unit*> q{&units[4], &units[3], &units[2], &units[1], &units[0]};
  order_for_next_forward(q);
  EXPECT_EQ(ids(q), (std::vector<UnitId>{4, 0, 1, 2, 3}));
  std::deque<Unit*> two{&units[1], &units[0]};
  order_for_next_forward(two);
  EXPECT_EQ(ids(two), (std::vector<UnitId>{1, 0}));
  std::deque<Unit*> none;
  order_for_next_forward(none);
  EXPECT_TRUE(none.empty());
}

// Eager keeps the states of the last reduced units first: the previous step's order, latest
// first. The first step has none, so it takes the trainable units in registration order (the
// backward reduces about in reverse); without that guess the first step kept nothing.
TEST(EagerQueue, KeptStatesFollowThePreviousOrderOrGuessTheFirstStep) {
  std::deque<Unit> units(5);
  for (std::size_t i = 0; i < units.size(); ++i) units[i].id = static_cast<UnitId>(i);
  units[2].spec.frozen = true;
  auto ids = [](const std::vector<const Unit*>& v) {
    std::vector<UnitId> out;
    for (const Unit* u : v) out.push_back(u->id);
    return out;
  };
  EXPECT_EQ(ids(kept_states_candidates({}, units)), (std::vector<UnitId>{0, 1, 3, 4}));
  const std::vector<Unit*> reduced{&units[4], &units[3], &units[0], &units[1]};
  EXPECT_EQ(ids(kept_states_candidates(reduced, units)), (std::vector<UnitId>{1, 0, 3, 4}));
}

TEST(UpdateWorker, RunsOneJobAndReturnsItsStatusOnce) {
  UpdateWorker worker;
  EXPECT_FALSE(worker.busy());
  EXPECT_TRUE(worker.wait().is_ok());  // nothing submitted: nothing to wait for
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  std::atomic<int> runs{0};
  worker.submit([&] {
    started.wait();
    ++runs;
    return Status::from_errno(5, "job", "/tmp/x");  // EIO
  });
  EXPECT_TRUE(worker.busy());  // held until `go`
  go.set_value();
  Status s = worker.wait();
  EXPECT_EQ(s.code(), ErrorCode::kIoError) << s.to_string();
  EXPECT_FALSE(worker.busy());
  EXPECT_TRUE(worker.wait().is_ok());  // the status came back once
  worker.submit([&] {
    ++runs;
    return Status::ok();
  });
  EXPECT_TRUE(worker.wait().is_ok());
  EXPECT_EQ(runs.load(), 2);
}

TEST(UpdateWorkerDeathTest, RefusesASecondJobWhileOneIsPending) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        UpdateWorker worker;
        std::promise<void> never;
        std::shared_future<void> blocked = never.get_future().share();
        worker.submit([blocked] {
          blocked.wait();
          return Status::ok();
        });
        worker.submit([] { return Status::ok(); });
      },
      "while a job is pending");
}

// One rank's context with a HostDevice and a LocalComm but no store (nothing finalized), and the
// components a mode needs.
struct Bench {
  explicit Bench(Config c) : config(std::move(c)) {
    auto dev = gpu::HostDevice::create(64u << 20);
    EXPECT_TRUE(dev.is_ok());
    device = std::move(*dev);
    auto comms = comm::LocalComm::create_group(1);
    EXPECT_TRUE(comms.is_ok());
    comm = std::move((*comms)[0]);
    ctx = std::make_unique<EngineContext>(config, *device, *comm);
    ctx->opt_place = Placement::kHost;
    ctx->stage = 2;
    driver = std::make_unique<OptimizerDriver>(*ctx);
    coordinator = std::make_unique<ParameterCoordinator>(*ctx);
  }
  std::unique_ptr<OverlapMode> mode(Overlap kind) {
    return OverlapMode::create(kind, OverlapDeps{*ctx, *driver, *coordinator});
  }
  Config config;
  std::unique_ptr<gpu::Device> device;
  std::unique_ptr<comm::Comm> comm;
  std::unique_ptr<EngineContext> ctx;
  std::unique_ptr<OptimizerDriver> driver;
  std::unique_ptr<ParameterCoordinator> coordinator;
};

StepDecision decision(StepUpdate update, bool skip = false, bool roll_back = false) {
  StepDecision d;
  d.update = update;
  d.skip = skip;
  d.roll_back = roll_back;
  d.multiplier = 0.5;
  return d;
}

TEST(OverlapMode, CreateGivesTheKindAsked) {
  Bench b(overlap_config("exact"));
  EXPECT_EQ(b.mode(Overlap::kExact)->kind(), Overlap::kExact);
  EXPECT_EQ(b.mode(Overlap::kEager)->kind(), Overlap::kEager);
  EXPECT_EQ(b.mode(Overlap::kDelayed)->kind(), Overlap::kDelayed);
  EXPECT_EQ(b.mode(Overlap::kExact)->pool(), nullptr);  // exact keeps no buffers
}

// A skipped step in exact and eager (without a rollback) runs nothing: with no store, any update
// would abort.
TEST(OverlapMode, ASkippedStepRunsNoUpdate) {
  Bench b(overlap_config("exact"));
  EXPECT_TRUE(b.mode(Overlap::kExact)->apply(decision(StepUpdate::kNone, true), 1, 0).is_ok());
  EXPECT_TRUE(b.mode(Overlap::kExact)->finalize(0, PinnedPoolOptions{}).is_ok());
}

// delayed with nothing pending: wait and publish do nothing (publishing would write parameters
// through the store).
TEST(OverlapMode, DelayedWithNothingPendingPublishesNothing) {
  Bench b(overlap_config("delayed"));
  auto mode = b.mode(Overlap::kDelayed);
  EXPECT_TRUE(mode->wait().is_ok());
  EXPECT_TRUE(mode->publish().is_ok());
  EXPECT_TRUE(mode->publish().is_ok());
  EXPECT_EQ(mode->pool(), nullptr);  // before finalize
}

TEST(OverlapModeDeathTest, EachModeRefusesAnotherModesDecision) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Bench b(overlap_config("exact"));
  EXPECT_DEATH(b.mode(Overlap::kExact)->apply(decision(StepUpdate::kEarlyKept), 1, 1),
               "no update or every unit's");
  EXPECT_DEATH(b.mode(Overlap::kExact)->apply(decision(StepUpdate::kBackground), 1, 1),
               "no update or every unit's");
  EXPECT_DEATH(
      b.mode(Overlap::kExact)->apply(decision(StepUpdate::kAllUnitsNow, false, true), 1, 1),
      "no early updates to roll back");
  EXPECT_DEATH(b.mode(Overlap::kEager)->apply(decision(StepUpdate::kBackground), 1, 1),
               "never in the background");
  EXPECT_DEATH(b.mode(Overlap::kEager)->apply(decision(StepUpdate::kEarlyKept, false, true), 1, 1),
               "rolled back");
  EXPECT_DEATH(b.mode(Overlap::kDelayed)->apply(decision(StepUpdate::kAllUnitsNow), 1, 1),
               "in the background or not at all");
  EXPECT_DEATH(b.mode(Overlap::kDelayed)->apply(decision(StepUpdate::kNone, true, true), 1, 0),
               "no early updates to roll back");
  // A skip that claims an update, or an update that claims a skip.
  EXPECT_DEATH(b.mode(Overlap::kExact)->apply(decision(StepUpdate::kNone, false), 1, 0),
               "only a skipped step runs no update");
  EXPECT_DEATH(b.mode(Overlap::kExact)->apply(decision(StepUpdate::kAllUnitsNow, true), 1, 1),
               "only a skipped step runs no update");
}

TEST(OverlapModeDeathTest, ModesAndComponentsRefuseWorkBeforeFinalize) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Bench b(overlap_config("delayed"));
  EXPECT_DEATH(b.mode(Overlap::kDelayed)->apply(decision(StepUpdate::kBackground), 1, 1),
               "before finalize");
  EXPECT_DEATH(b.mode(Overlap::kDelayed)->finalize(4096, PinnedPoolOptions{}).ignore(),
               "finalized twice or early");
  EXPECT_DEATH(b.mode(Overlap::kEager)->finalize(0, PinnedPoolOptions{}).ignore(),
               "finalized twice or early");
  // Buffers planned for a mode that keeps none.
  EXPECT_DEATH(b.mode(Overlap::kExact)->finalize(4096, PinnedPoolOptions{}).ignore(), "keeps none");
  EXPECT_DEATH(b.coordinator->gathered(0), "before finalize");
  GradientReducer reducer(*b.ctx);
  EXPECT_DEATH(reducer.holds_buffer(0), "before finalize");
  EXPECT_DEATH(b.driver->update_all(b.driver->update_args(1.0, 1)).ignore(), "before finalize");
  EXPECT_DEATH(b.driver->update_args(1.0, 0), "1-based");
}

TEST(OverlapModeDeathTest, DelayedNeedsTheCpuOptimizerAndAStage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Bench b(overlap_config("delayed"));
  b.ctx->opt_place = Placement::kDevice;
  EXPECT_DEATH(b.mode(Overlap::kDelayed), "overlap_from_config");
  b.ctx->opt_place = Placement::kHost;
  b.ctx->stage = 0;
  EXPECT_DEATH(b.mode(Overlap::kDelayed), "overlap_from_config");
}

}  // namespace
}  // namespace tz::zero::impl
