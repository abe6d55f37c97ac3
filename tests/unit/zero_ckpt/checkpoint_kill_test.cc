// Crash consistency under SIGKILL: a child process trains (2 HostDevice ranks) and saves a
// checkpoint after every step, resuming from the latest one each time it starts; the parent kills
// it at seeded random moments, at least 20 times. After every kill the latest complete checkpoint
// must verify, and the next child must resume from it (a child that fails to resume exits with an
// error instead of being killed, which fails the test). The child is this program re-executed
// with TZ_CKPT_KILL_CHILD_DIR set (fork without exec would inherit the parent's threads' locks).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "test_model.h"
#include "zero/checkpoint.h"
#include "zero/engine.h"

namespace tz::zero {
namespace {

namespace fs = std::filesystem;
using testing::EngineModel;
using testing::make_config;
using testing::ModelShape;

constexpr std::uint64_t kSeed = 99;
const ModelShape kShape{3, 96};

std::string child_config() {
  return R"({"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
             "bf16": {"enabled": true},
             "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
             "zero_optimization": {"stage": 3}})";
}

// The child: resume (or init), then train and save after every step until killed.
int child_main(const std::string& dir) {
  EngineOptions opts;
  opts.config = make_config(child_config());
  const Status s = run_local_ranks(2, 64u << 20, [&](int, gpu::Device& dev, comm::Comm& comm) -> Status {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(opts, dev, comm));
    EngineModel model(*engine, kShape);
    TZ_RETURN_IF_ERROR(model.build());
    std::int64_t next = 0;
    auto latest = resolve_checkpoint(dir);
    if (latest.is_ok()) {
      TZ_ASSIGN_OR_RETURN(CheckpointExtra extra, load_checkpoint(*engine, *latest));
      next = extra.trainer.value("next_step", std::int64_t{-1});
      if (next < 0) return Status::corrupt("no next_step in " + *latest);
    } else {
      TZ_RETURN_IF_ERROR(model.init(kSeed));
    }
    for (std::int64_t step = next;; ++step) {
      TZ_ASSIGN_OR_RETURN(StepReport r, model.train_step(step, 4, kSeed));
      static_cast<void>(r);
      CheckpointExtra extra;
      extra.model = {{"kind", "kill-test"}};
      extra.trainer = {{"next_step", step + 1}};
      TZ_ASSIGN_OR_RETURN(std::string saved, save_checkpoint(*engine, comm, dir, step + 1, extra, 2));
      static_cast<void>(saved);
    }
  });
  std::fprintf(stderr, "child: %s\n", s.to_string().c_str());
  return 3;
}

TEST(CheckpointKill, LatestCheckpointSurvivesSigkillDuringSaves) {
  if (const char* dir = std::getenv("TZ_CKPT_KILL_CHILD_DIR")) std::_Exit(child_main(dir));
  char tmpl[] = "/tmp/tz_ckpt_kill_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const unsigned seed = 20261201;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> delay_ms(150, 900);
  constexpr int kKills = 24;
  std::int64_t last_step = 0;
  int kills_with_checkpoint = 0;
  int kills_mid_save = 0;
  for (int k = 0; k < kKills; ++k) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::setenv("TZ_CKPT_KILL_CHILD_DIR", dir.c_str(), 1);
      ::execl("/proc/self/exe", "zero_checkpoint_kill_test",
              "--gtest_filter=CheckpointKill.LatestCheckpointSurvivesSigkillDuringSaves",
              static_cast<char*>(nullptr));
      std::_Exit(4);
    }
    const int wait = delay_ms(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(wait));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "kill " << k << " (seed " << seed << "): the child ended by itself with status "
        << status << " (it could not resume from the latest checkpoint?)";
    // A step-N.tmp left behind means the kill landed inside a save (between its start and the
    // rename that publishes it); the next save removes it.
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
        ++kills_mid_save;
        break;
      }
    }
    auto latest = resolve_checkpoint(dir);
    if (!latest.is_ok()) {
      // Killed before its first save completed: then there must be no complete checkpoint.
      ASSERT_EQ(last_step, 0) << "kill " << k << ": " << latest.status().to_string();
      continue;
    }
    auto summary = verify_checkpoint(*latest);
    ASSERT_TRUE(summary.is_ok()) << "kill " << k << " after " << wait << " ms (seed " << seed
                                 << "): " << summary.status().to_string();
    const std::int64_t step = summary->manifest["step"].get<std::int64_t>();
    EXPECT_GE(step, last_step) << "kill " << k << ": the latest checkpoint went backwards";
    last_step = step;
    ++kills_with_checkpoint;
  }
  std::printf("%d kills (seed %u), %d inside a save, %d with a checkpoint present, reached step "
              "%lld\n",
              kKills, seed, kills_mid_save, kills_with_checkpoint,
              static_cast<long long>(last_step));
  EXPECT_GE(kills_mid_save, 3) << "too few kills landed inside a save to test crash consistency";
  EXPECT_GE(kills_with_checkpoint, 20);
  EXPECT_GT(last_step, 5) << "the runs made too little progress to have been killed mid-save";
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace tz::zero
