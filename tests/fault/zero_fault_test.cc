// The engine under a seeded NVMe fault (nvme::FaultEngine): an EIO on an I/O of the optimizer
// state during a step surfaces from that step as an error naming the unit and shard, and every
// unit's state is either the last completed step's or the failed step's own update (nothing
// half-written), compared bit for bit with a fault-free run. With the update streamed into the
// next forward (stage 3, tierzero.stream_update) the error surfaces after step() returned, from
// the next call that waits for the update, with the same guarantee; so does an eager early update
// run on the worker beside the backward and into the next forward.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "nvme/fault_engine.h"
#include "store/stack.h"
#include "unit/zero/test_model.h"
#include "zero/engine.h"

namespace tz::zero {
namespace {

using testing::EngineModel;
using testing::make_config;
using testing::ModelShape;

constexpr std::uint64_t kSeed = 77;
constexpr int kLayers = 8;

// Stage 2 updates inside step(); streamed: stage 3 with host-homed parameters, the update on the
// worker (exact: streamed into the next forward; eager: beside the backward).
// eager runs without clipping: its early updates are then the step's own (no snapshot kept).
Config fault_config(bool streamed, const std::string& overlap) {
  const std::string path = ::testing::TempDir();
  return make_config(
      R"({"train_micro_batch_size_per_gpu": 4, "gradient_clipping": )" +
      std::string(overlap == "eager" ? "0" : "1.0") + R"(,
          "tierzero": {"overlap": ")" + overlap + R"("},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
          "zero_optimization": {"stage": )" + std::string(streamed ? "3" : "2") +
      R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + path + R"("})" +
      (streamed ? R"(, "offload_param": {"device": "cpu"})" : "") + "}}");
}

struct Outcome {
  // NVMe requests issued through step 2 (before the reference run reads the masters, so that the
  // count means the same point in every run), and during step 3.
  std::uint64_t requests_after_two_steps = 0;
  std::uint64_t step3_requests = 0;
  std::vector<std::vector<float>> after2, after3;  // masters, unit by unit (weights only)
  Status step3_status;
  Status update_status;  // streamed: what the first call after step 3 that waits for it returned
  Status before_status;  // the first error before step 3 (the failing request came earlier)
  std::vector<Result<std::vector<float>>> after_fault;
};

// fail_request = 0: fault-free, records the reference states; otherwise that request fails.
Outcome run(std::uint64_t fail_request, bool streamed, const std::string& overlap) {
  Outcome out;
  std::atomic<nvme::FaultEngine*> faults{nullptr};
  EngineOptions opts;
  opts.config = fault_config(streamed, overlap);
  // The whole host tier: four units' state of eight and the gradient shards in the store (and
  // streamed, the host-homed parameter shards), plus the engine's staging at this shape (278,528
  // bytes; the plan's error names it if it changes).
  opts.host_budget_bytes = 4 * 3 * 2048 * 4 + (64u << 10) + (streamed ? 64u << 10 : 0) + 278528;
  auto hooks = std::make_shared<store::IoHooks>();
  nvme::FaultOptions fo;
  fo.seed = kSeed;
  fo.eio_on_request = fail_request;
  hooks->faults = fo;
  hooks->on_fault_engine = [&](nvme::FaultEngine& engine) { faults = &engine; };
  opts.io_hooks = hooks;
  Status s = run_local_ranks(1, 64u << 20, [&](int, gpu::Device& dev, comm::Comm& comm) {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(opts, dev, comm));
    ModelShape shape;
    shape.layers = kLayers;
    EngineModel model(*engine, shape);
    TZ_RETURN_IF_ERROR(model.build());
    TZ_RETURN_IF_ERROR(model.init(kSeed));
    auto masters = [&]() {
      std::vector<Result<std::vector<float>>> m;
      for (UnitId u = 0; u < kLayers; ++u) {
        std::vector<float> v(static_cast<std::size_t>(shape.width * shape.width));
        Status st = engine->get_tensor(u, 0, v);
        if (st.is_ok()) {
          m.emplace_back(std::move(v));
        } else {
          m.emplace_back(st);
        }
      }
      return m;
    };
    std::vector<float> probe(static_cast<std::size_t>(shape.width * shape.width));
    // The request counts move by a request or two from run to run, so a request meant for
    // step 3 can fail before it (in step 2's streamed update): recorded, not a test failure.
    for (int step = 0; step < 2 && out.before_status.is_ok(); ++step) {
      out.before_status = model.train_step(step, 4, kSeed).status();
    }
    // A streamed update of step 2 finishes before the count (get_tensor waits for it).
    if (out.before_status.is_ok()) out.before_status = engine->get_tensor(0, 0, probe);
    if (!out.before_status.is_ok()) return Status::ok();
    out.requests_after_two_steps = faults.load()->counts().requests;
    if (fail_request == 0) {
      for (auto& m : masters()) out.after2.push_back(*m);
    }
    const std::uint64_t before_step3 = faults.load()->counts().requests;
    out.step3_status = model.train_step(2, 4, kSeed).status();
    if (streamed) out.update_status = engine->get_tensor(0, 0, probe);
    out.step3_requests = faults.load()->counts().requests - before_step3;
    if (fail_request == 0) {
      for (auto& m : masters()) out.after3.push_back(*m);
    } else {
      out.after_fault = masters();
    }
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

// One run per failing request, spread over step 3's requests from its first to its last. The
// counts move by a request or two from run to run (when a write-back or a read ahead is issued
// depends on timing), and a failed read ahead is read again rather than reported, so a few
// requests at one place in the step may all pass unnoticed; requests spread over the whole step
// cannot (step 3 writes every unit's new state). Returns how many runs reported the error after
// step 3 returned (the streamed update's).
int expect_failed_update_names_unit_and_keeps_state(bool streamed,
                                                   const std::string& overlap = "exact") {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const Outcome ref = run(0, streamed, overlap);
  EXPECT_TRUE(ref.before_status.is_ok() && ref.step3_status.is_ok() && ref.update_status.is_ok())
      << ref.step3_status.to_string() << " " << ref.update_status.to_string();
  EXPECT_GT(ref.requests_after_two_steps, 0u);
  EXPECT_GT(ref.step3_requests, 0u);
  constexpr std::uint64_t kTries = 12;
  int failures_seen = 0;
  int after_step = 0;
  int before_step3 = 0;
  for (std::uint64_t k = 0; k < kTries; ++k) {
    const std::uint64_t extra = 1 + (ref.step3_requests - 1) * k / (kTries - 1);
    const Outcome got = run(ref.requests_after_two_steps + extra, streamed, overlap);
    if (!got.before_status.is_ok()) {
      std::printf("request +%llu: failed before step 3: %s\n",
                  static_cast<unsigned long long>(extra), got.before_status.to_string().c_str());
      ++before_step3;
      continue;
    }
    const Status& failed = got.step3_status.is_ok() ? got.update_status : got.step3_status;
    std::printf("request +%llu: step %s, after it %s\n", static_cast<unsigned long long>(extra),
                got.step3_status.to_string().c_str(), got.update_status.to_string().c_str());
    if (failed.is_ok()) continue;  // that request was not in step 3's update
    ++failures_seen;
    if (got.step3_status.is_ok()) ++after_step;
    const std::string msg = failed.to_string();
    SCOPED_TRACE("request +" + std::to_string(extra) + ": " + msg);
    EXPECT_NE(msg.find("unit 'layer"), std::string::npos);
    EXPECT_NE(msg.find("shard 0 of 1"), std::string::npos);
    // After step 3 the error is the update's, or (the request counts move) the probe's own read
    // of unit 0 once the update is done.
    if (got.step3_status.is_ok() && msg.find("get_tensor") == std::string::npos) {
      EXPECT_NE(msg.find(overlap == "eager" ? "eager update" : "streamed update"),
                std::string::npos);
    }
    int unchanged = 0;
    int unreadable = 0;
    for (std::size_t u = 0; u < got.after_fault.size(); ++u) {
      if (!got.after_fault[u].is_ok()) {
        // Only the unit whose I/O failed may refuse to read, and it names itself.
        EXPECT_NE(got.after_fault[u].status().to_string().find("layer" + std::to_string(u)),
                  std::string::npos);
        ++unreadable;
        continue;
      }
      const std::vector<float>& v = *got.after_fault[u];
      const bool is2 = v == ref.after2[u];
      const bool is3 = v == ref.after3[u];
      EXPECT_TRUE(is2 || is3) << "unit " << u << " holds neither step 2's nor step 3's state";
      unchanged += is2 ? 1 : 0;
    }
    EXPECT_LE(unreadable, 1);
    // Some unit kept step 2's state, or the unit whose write failed refuses to read and names
    // itself (a failed write-back ends the step with its error after the other units' updates).
    EXPECT_GT(unchanged + unreadable, 0) << "the failed step updated every unit, silently";
  }
  EXPECT_GT(failures_seen, 0) << "no injected EIO reached step 3's update";
  // The counts move by a few requests (more with eager's queue, whose read ahead depends on
  // when each unit is reduced, and which runs into step 3's forward): the first tries may land
  // in step 2's update. Under a parallel ctest run eager's first four tries (+1 to +12 of ~35
  // requests) did so in 2 runs of 50.
  EXPECT_LE(before_step3, static_cast<int>(kTries / 3)) << "the request counts moved too far";
  return after_step;
}

TEST(ZeroFault, EioOnOptimizerStateNamesUnitAndShardAndKeepsState) {
  EXPECT_EQ(expect_failed_update_names_unit_and_keeps_state(false), 0)
      << "an update inside step() reported its error after step() returned";
}

TEST(ZeroFault, EioInAStreamedUpdateSurfacesAtTheNextWaitAndKeepsState) {
  EXPECT_GT(expect_failed_update_names_unit_and_keeps_state(true), 0)
      << "no error of the streamed update came after step() returned";
}

// eager's early updates on the worker (no clipping, so they are the step's updates): the step
// keeps them and the rest of the queue runs into the next forward, so the error comes from the
// next call that waits for it, naming "eager update"; no unit holds a half-written state.
TEST(ZeroFault, EioInAnEagerUpdateOnTheWorkerSurfacesAtTheNextWaitAndKeepsState) {
  EXPECT_GT(expect_failed_update_names_unit_and_keeps_state(true, "eager"), 0)
      << "no error of the eager updates came after step() returned";
}

}  // namespace
}  // namespace tz::zero
