// The multi-rank engine test bodies, shared by the LocalComm program (ranks as threads,
// engine_test.cc, overlap_test.cc) and the MPI one (ranks as processes under mpirun,
// engine_mpi_test.cc): a Launcher runs one function per rank, and every body takes one, so the
// same checks run over both communicators without a copy.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "test_model.h"
#include "zero/engine.h"

namespace tz::zero::testing {

inline constexpr std::uint64_t kSeed = 20261201;

// Runs `fn(rank, device, comm)` for every rank of a world of `ranks` that this process hosts
// (all of them as threads for LocalComm, its own one under mpirun), each rank on its own
// HostDevice of `device_budget_bytes`. Returns the first failing rank's error.
using Launcher = std::function<Status(int ranks, std::uint64_t device_budget_bytes, const RankFn& fn)>;

// LocalComm: every rank a thread of this process.
inline Status launch_local(int ranks, std::uint64_t device_budget_bytes, const RankFn& fn) {
  return run_local_ranks(ranks, device_budget_bytes, fn);
}

struct RunSpec {
  int ranks = 2;
  int stage = 0;
  std::string offload_optimizer = "none";
  std::string offload_param = "none";
  std::string dtype = "fp32";  // fp32 | bf16 | fp16
  std::string overlap = "exact";  // tierzero.overlap
  bool stream_update = true;       // tierzero.stream_update
  int accumulation = 1;
  double clip = 0.5;
  int batch = 4;
  int steps = 5;
  ModelShape shape;
  std::string extra;  // more top-level JSON members, each followed by a comma
  std::string zero_extra;  // more zero_optimization members, each preceded by a comma
  std::uint64_t host_budget = 0;  // EngineOptions::host_budget_bytes (0 = the engine's default)
  // zero_optimization.stage3_param_persistence_threshold; -1 = the default (100000: every unit
  // of the test model stays gathered), 0 = every unit gathered and released at each use.
  long persistence = -1;
};

// What a run does besides training: Inf gradients on rank 0 at these 0-based steps; forward and
// backward of step s computed with the masters as they were before step s-1 (step 0: the
// initial ones), rounded to the compute dtype (the one-step-stale reference of "delayed"); the
// weights read (get_tensor) after this 0-based step (-1: none).
struct RunHooks {
  std::vector<int> poison_steps;
  bool stale_forward = false;
  int read_after_step = -1;
};

inline std::string config_json(const RunSpec& r) {
  std::string j = "{";
  j += r.extra;
  j += "\"train_micro_batch_size_per_gpu\": " + std::to_string(r.batch) + ",";
  j += "\"gradient_accumulation_steps\": " + std::to_string(r.accumulation) + ",";
  j += "\"gradient_clipping\": " + std::to_string(r.clip) + ",";
  j += "\"bf16\": {\"enabled\": " + std::string(r.dtype == "bf16" ? "true" : "false") + "},";
  if (r.dtype == "fp16") {
    j += "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"hysteresis\": 1},";
  }
  j += "\"tierzero\": {\"overlap\": \"" + r.overlap + "\", \"stream_update\": " +
       (r.stream_update ? "true" : "false") + "},";
  j += "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},";
  const std::string path = ::testing::TempDir();
  j += "\"zero_optimization\": {\"stage\": " + std::to_string(r.stage) +
       ", \"offload_optimizer\": {\"device\": \"" + r.offload_optimizer +
       "\", \"nvme_path\": \"" + path + "\"}, \"offload_param\": {\"device\": \"" +
       r.offload_param + "\", \"nvme_path\": \"" + path + "\"}" +
       (r.persistence >= 0
            ? ", \"stage3_param_persistence_threshold\": " + std::to_string(r.persistence)
            : std::string()) +
       r.zero_extra + "}";
  j += "}";
  return j;
}

inline std::string describe(const RunSpec& r) {
  return "ranks=" + std::to_string(r.ranks) + " stage=" + std::to_string(r.stage) +
         " opt=" + r.offload_optimizer + " param=" + r.offload_param + " dtype=" + r.dtype +
         " k=" + std::to_string(r.accumulation) + " overlap=" + r.overlap +
         (r.stream_update ? "" : " stream_update=false") +
         " clip=" + std::to_string(r.clip) + " persistence=" + std::to_string(r.persistence);
}

struct RunResult {
  bool ok = false;
  std::uint64_t hash = 0;
  Weights weights;                   // the first hosted rank's view (identical on every rank)
  Weights weights_read;              // RunHooks::read_after_step's read
  std::vector<StepReport> reports;   // the first hosted rank's
  // Per rank hosted by this process, in rank order (all of them with LocalComm, one under MPI).
  std::vector<std::vector<StepReport>> reports_by_rank;
  std::vector<TierBytes> plan_by_rank;
};

// Every rank's value of `x` on every rank, through the rank's communicator (an all-gather of
// bytes: no arithmetic touches them).
inline Result<std::vector<std::uint64_t>> all_gather_u64(gpu::Device& device, comm::Comm& comm,
                                                         std::uint64_t x) {
  const auto n = static_cast<std::size_t>(comm.world_size());
  TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer buf, device.allocate(n * sizeof(std::uint64_t)));
  gpu::Stream& st = device.compute_stream();
  auto* mine = buf.as<std::uint64_t>() + comm.rank();
  TZ_RETURN_IF_ERROR(
      device.copy_async(mine, &x, sizeof(x), gpu::CopyKind::kHostToDevice, st));
  // Two fp32 "elements" per value: all_gather copies them untouched.
  TZ_RETURN_IF_ERROR(comm.all_gather(mine, buf.data(), 2, DType::kF32, st));
  std::vector<std::uint64_t> out(n);
  TZ_RETURN_IF_ERROR(device.copy_async(out.data(), buf.data(), n * sizeof(std::uint64_t),
                                       gpu::CopyKind::kDeviceToHost, st));
  TZ_RETURN_IF_ERROR(st.synchronize());
  return out;
}

// Runs `r` and checks that every rank ends with the same masters.
inline RunResult run(const Launcher& launch, const RunSpec& r, const RunHooks& hooks = {}) {
  RunResult result;
  std::mutex mu;
  struct PerRank {
    bool hosted = false;
    Weights weights, read;
    std::vector<StepReport> reports;
    TierBytes plan;
    std::uint64_t hash = 0;
  };
  std::vector<PerRank> per(static_cast<std::size_t>(r.ranks));
  EngineOptions opts;
  opts.config = make_config(config_json(r));
  opts.host_budget_bytes = r.host_budget;
  Status s = launch(r.ranks, 256u << 20, [&](int rank, gpu::Device& dev, comm::Comm& comm) {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(opts, dev, comm));
    EngineModel model(*engine, r.shape);
    TZ_RETURN_IF_ERROR(model.build());
    TZ_RETURN_IF_ERROR(model.init(kSeed));
    PerRank mine;
    Weights before_previous;  // the masters before step s-1 (stale_forward)
    for (int step = 0; step < r.steps; ++step) {
      bool poison = false;
      for (int p : hooks.poison_steps) poison = poison || (p == step && rank == 0);
      Weights forward;
      if (hooks.stale_forward) {
        TZ_ASSIGN_OR_RETURN(Weights now, model.weights());
        forward = step == 0 ? now : before_previous;
        for (auto& t : forward) {
          for (float& x : t) x = round_to(engine->compute_dtype(), x);
        }
        before_previous = std::move(now);
      }
      TZ_ASSIGN_OR_RETURN(StepReport rep,
                          model.train_step(step, r.batch, kSeed, poison,
                                           hooks.stale_forward ? &forward : nullptr));
      mine.reports.push_back(rep);
      if (step == hooks.read_after_step) {
        TZ_ASSIGN_OR_RETURN(mine.read, model.weights());
      }
    }
    TZ_ASSIGN_OR_RETURN(mine.hash, engine->params_xxh3());
    TZ_ASSIGN_OR_RETURN(std::vector<std::uint64_t> hashes, all_gather_u64(dev, comm, mine.hash));
    for (std::size_t i = 0; i < hashes.size(); ++i) {
      EXPECT_EQ(hashes[i], mine.hash) << "rank " << i << " and rank " << rank << " disagree";
    }
    TZ_ASSIGN_OR_RETURN(mine.weights, model.weights());
    mine.plan = engine->plan_bytes();
    mine.hosted = true;
    std::lock_guard lock(mu);
    per[static_cast<std::size_t>(rank)] = std::move(mine);
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.to_string() << " for " << config_json(r);
  result.ok = s.is_ok();
  for (PerRank& p : per) {
    if (!p.hosted) continue;
    if (result.reports_by_rank.empty()) {
      result.hash = p.hash;
      result.weights = p.weights;
      result.weights_read = p.read;
      result.reports = p.reports;
    }
    result.reports_by_rank.push_back(std::move(p.reports));
    result.plan_by_rank.push_back(p.plan);
  }
  return result;
}

// Every stage with every placement DeepSpeed allows (optimizer offload needs stage >= 1,
// parameter offload stage 3), in stage, optimizer, parameter order: `base` with each.
inline std::vector<RunSpec> every_placement(const RunSpec& base) {
  std::vector<RunSpec> v;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const std::string opt : {"none", "cpu", "nvme"}) {
      if (stage == 0 && opt != "none") continue;
      for (const std::string param : {"none", "cpu", "nvme"}) {
        if (stage != 3 && param != "none") continue;
        RunSpec r = base;
        r.stage = stage;
        r.offload_optimizer = opt;
        r.offload_param = param;
        v.push_back(r);
      }
    }
  }
  return v;
}

// Every stage and every placement the build supports: the same fp32 masters after 5 steps (of
// the trainable units; `shape` may freeze some). Returns the stage-0 run.
inline RunResult expect_bit_identical(const Launcher& launch, int ranks, const std::string& dtype,
                                      int accumulation, const ModelShape& shape = {}) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  RunSpec base;
  base.ranks = ranks;
  base.dtype = dtype;
  base.accumulation = accumulation;
  base.shape = shape;
  const RunResult ref = run(launch, base);
  EXPECT_NE(ref.hash, 0u);
  for (const RunSpec& placed : every_placement(base)) {
    for (long persistence : {-1L, 0L}) {
      if (placed.stage != 3 && persistence == 0) continue;
      RunSpec r = placed;
      r.persistence = persistence;
      const RunResult got = run(launch, r);
      EXPECT_EQ(got.hash, ref.hash) << describe(r) << " differs from " << describe(base);
      EXPECT_EQ(got.weights, ref.weights) << describe(r) << " (every unit, frozen too)";
    }
  }
  return ref;
}

// The masters after 20 steps against the float64 reference of the same model and data.
// Tolerance: |engine - ref| <= 2e-4 + 2e-3 |ref| (fp32 forward/backward and update against
// float64; Adam's normalized steps keep the error near fp32 rounding times the step count).
inline void expect_tracks_reference(const Launcher& launch, int ranks, int stage,
                                    const std::string& opt) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  RunSpec r;
  r.ranks = ranks;
  r.stage = stage;
  r.offload_optimizer = opt;
  r.steps = 20;
  r.clip = 0.5;
  const RunResult got = run(launch, r);
  ReferenceModel::Hyper h;
  h.clip = r.clip;
  ReferenceModel ref(r.shape, h, kSeed);
  const int global = r.ranks * r.batch * r.accumulation;
  for (int step = 0; step < r.steps; ++step) {
    ref.adamw_step(ref.gradient(static_cast<std::int64_t>(step) * global, global, kSeed));
  }
  ASSERT_EQ(got.weights.size(), ref.params().size());
  double worst = 0;
  for (std::size_t i = 0; i < got.weights.size(); ++i) {
    for (std::size_t j = 0; j < got.weights[i].size(); ++j) {
      const double want = ref.params()[i][j];
      const double err = std::abs(got.weights[i][j] - want);
      worst = std::max(worst, err);
      ASSERT_LE(err, 2e-4 + 2e-3 * std::abs(want)) << "tensor " << i << " element " << j;
    }
  }
  std::printf("ranks %d stage %d: worst |engine - float64| = %.3g\n", ranks, stage, worst);
}

// k micro-batches of B samples equal one micro-batch of k*B samples (the same samples).
inline void expect_accumulation_equals_larger_batch(const Launcher& launch, int ranks) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  RunSpec acc;
  acc.ranks = ranks;
  acc.stage = 2;
  acc.accumulation = 4;
  acc.batch = 3;
  acc.steps = 6;
  RunSpec big = acc;
  big.accumulation = 1;
  big.batch = 12;
  // Sample (step, micro-batch b, rank r) is ((step k + b) N + r) B + s: both runs' ranks
  // together see samples [step kNB, (step + 1) kNB), so the global batches are the same sets.
  const RunResult a = run(launch, acc);
  const RunResult b = run(launch, big);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (std::size_t i = 0; i < a.weights.size(); ++i) {
    for (std::size_t j = 0; j < a.weights[i].size(); ++j) {
      ASSERT_NEAR(a.weights[i][j], b.weights[i][j], 1e-5 + 1e-4 * std::abs(b.weights[i][j]))
          << "tensor " << i << " element " << j;
    }
  }
}

// An Inf on rank 0's gradient at step 2 (0-based): every rank reports the step skipped, the scale
// halves (hysteresis 1), the step count still advances, and the ranks keep identical weights.
inline void expect_overflow_skips_every_rank(const Launcher& launch, int ranks,
                                             const std::string& overlap = "exact",
                                             const std::string& opt = "none") {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  RunSpec r;
  r.ranks = ranks;
  r.stage = 3;
  r.dtype = "fp16";
  r.steps = 4;
  r.overlap = overlap;
  r.offload_optimizer = opt;
  RunHooks hooks;
  hooks.poison_steps = {2};
  const RunResult got = run(launch, r, hooks);
  ASSERT_EQ(got.reports.size(), 4u);
  EXPECT_FALSE(got.reports[1].skipped);
  EXPECT_TRUE(got.reports[2].skipped);
  EXPECT_FALSE(got.reports[3].skipped);
  EXPECT_EQ(got.reports[2].loss_scale, 4096.0);
  EXPECT_EQ(got.reports[3].loss_scale, 2048.0);
  EXPECT_EQ(got.reports[3].step, 4);
  for (const auto& reps : got.reports_by_rank) {
    ASSERT_EQ(reps.size(), 4u);
    EXPECT_TRUE(reps[2].skipped);
    EXPECT_FALSE(reps[1].skipped || reps[3].skipped);
  }
}

// --- Overlap modes --------------------------------------------------------------------------------

// "delayed" against its reference: an exact-mode engine whose forward and backward of step s use
// the masters from before step s-1 (RunHooks::stale_forward), i.e. each update applied one step
// late. Bit-identical: both compute the same gradients from the same 16-bit values (the
// published parameters are the optimizer's RNE copy of those masters, round_to is the same
// cast), reduce and accumulate them the same way, take the same norm, clip multiplier, loss-scale
// decision and learning rate from step s's gradient, and run the same CPU optimizer pass. Also:
// the weights read in the middle of the run (get_tensor waits for the pending update) equal the
// reference's at the same point, and the run differs from a plain exact one (staleness is real).
inline void expect_delayed_equals_stale_reference(const Launcher& launch, int ranks,
                                                  const std::string& dtype, int stage,
                                                  const std::string& opt,
                                                  const std::string& param = "none",
                                                  std::vector<int> poison = {},
                                                  const ModelShape& shape = {}) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  RunSpec ref_spec;
  ref_spec.shape = shape;
  ref_spec.ranks = ranks;
  ref_spec.dtype = dtype;
  ref_spec.stage = 1;
  ref_spec.offload_optimizer = "cpu";
  RunHooks ref_hooks;
  ref_hooks.stale_forward = true;
  ref_hooks.read_after_step = 2;
  ref_hooks.poison_steps = poison;
  const RunResult ref = run(launch, ref_spec, ref_hooks);
  RunSpec d = ref_spec;
  d.overlap = "delayed";
  d.stage = stage;
  d.offload_optimizer = opt;
  d.offload_param = param;
  d.persistence = stage == 3 ? 0 : -1;
  RunHooks d_hooks;
  d_hooks.read_after_step = 2;
  d_hooks.poison_steps = poison;
  const RunResult got = run(launch, d, d_hooks);
  ASSERT_TRUE(ref.ok && got.ok);
  EXPECT_EQ(got.hash, ref.hash) << describe(d) << " differs from the one-step-late reference";
  ASSERT_EQ(got.weights_read.size(), ref.weights_read.size());
  for (std::size_t i = 0; i < got.weights_read.size(); ++i) {
    ASSERT_EQ(got.weights_read[i], ref.weights_read[i]) << "tensor " << i << " read after step 3";
  }
  for (std::size_t i = 0; i < got.reports.size(); ++i) {
    EXPECT_EQ(got.reports[i].grad_norm, ref.reports[i].grad_norm) << "step " << i + 1;
    EXPECT_EQ(got.reports[i].skipped, ref.reports[i].skipped) << "step " << i + 1;
  }
  RunHooks plain_hooks;
  plain_hooks.poison_steps = poison;
  const RunResult plain = run(launch, ref_spec, plain_hooks);
  EXPECT_NE(got.hash, plain.hash) << "delayed equals a run without staleness";
}

// set_tensor of unit `unit`'s weight right after two steps, while the mode's update of step 2 may
// still be pending: the call waits for it first, so the value set is what the weights hold (the
// update does not overwrite it afterwards) and every other tensor equals a run without the
// set_tensor (the update is kept).
inline void expect_set_tensor_after_steps_sticks(const Launcher& launch, const RunSpec& r,
                                                 UnitId unit) {
  EngineOptions opts;
  opts.config = make_config(config_json(r));
  const auto n = static_cast<std::size_t>(r.shape.width) * static_cast<std::size_t>(r.shape.width);
  std::vector<float> value(n);
  for (std::size_t i = 0; i < n; ++i) value[i] = 0.25f - static_cast<float>(i % 7) / 16.0f;
  std::vector<Weights> after(2);
  for (int with_set = 0; with_set < 2; ++with_set) {
    Status s = launch(r.ranks, 64u << 20, [&](int rank, gpu::Device& dev, comm::Comm& comm) {
      TZ_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(opts, dev, comm));
      EngineModel model(*engine, r.shape);
      TZ_RETURN_IF_ERROR(model.build());
      TZ_RETURN_IF_ERROR(model.init(kSeed));
      for (int step = 0; step < 2; ++step) {
        TZ_RETURN_IF_ERROR(model.train_step(step, r.batch, kSeed).status());
      }
      if (with_set == 1) TZ_RETURN_IF_ERROR(engine->set_tensor(unit, 0, value));
      TZ_ASSIGN_OR_RETURN(Weights w, model.weights());
      if (rank == 0) after[static_cast<std::size_t>(with_set)] = std::move(w);
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.to_string() << " for " << describe(r);
  }
  ASSERT_EQ(after[1].size(), after[0].size());
  const std::size_t weight = 2 * static_cast<std::size_t>(unit);  // per unit: weight, then bias
  ASSERT_LT(weight, after[0].size());
  EXPECT_EQ(after[1][weight], value);
  EXPECT_NE(after[0][weight], value);
  for (std::size_t t = 0; t < after[0].size(); ++t) {
    if (t != weight) {
      EXPECT_EQ(after[1][t], after[0][t]) << t;
    }
  }
}

// "eager" against "exact" of the same config, bit for bit; `expect_rollbacks` is whether every
// step that is not skipped should have rolled back (clip threshold that triggers) or none.
inline void expect_eager_equals_exact(const Launcher& launch, RunSpec r, bool expect_rollbacks,
                                      std::vector<int> poison = {}) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  RunHooks hooks;
  hooks.poison_steps = poison;
  r.overlap = "exact";
  const RunResult exact = run(launch, r, hooks);
  r.overlap = "eager";
  const RunResult eager = run(launch, r, hooks);
  ASSERT_TRUE(exact.ok && eager.ok) << describe(r);
  EXPECT_EQ(eager.hash, exact.hash) << describe(r);
  ASSERT_EQ(eager.reports.size(), exact.reports.size());
  for (std::size_t i = 0; i < eager.reports.size(); ++i) {
    const StepReport& e = eager.reports[i];
    EXPECT_EQ(e.skipped, exact.reports[i].skipped) << describe(r) << " step " << i + 1;
    EXPECT_EQ(e.grad_norm, exact.reports[i].grad_norm) << describe(r) << " step " << i + 1;
    EXPECT_EQ(e.loss_scale, exact.reports[i].loss_scale) << describe(r) << " step " << i + 1;
    EXPECT_EQ(e.rolled_back, e.skipped || expect_rollbacks) << describe(r) << " step " << i + 1;
    EXPECT_FALSE(exact.reports[i].rolled_back);
  }
}

}  // namespace tz::zero::testing
