// Checkpoints through the real engine (HostDevice ranks, LocalComm): a run resumed from step k is
// bit-identical to the uninterrupted run (stages 1 and 3, every offload the engine has); a
// checkpoint resharded to other rank counts and stages tracks the uninterrupted run; a corrupted
// byte, a truncated file and a missing tensor are each reported by name; a save that runs out of
// space, or whose write or fsync fails with EIO, leaves the previous checkpoint intact and loadable.
#include "zero/checkpoint.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "test_model.h"
#include "zero/engine.h"

// EIO injection: this program's own pwrite/write/fsync (they take precedence over libc's for every
// call in the process) forward to the next definition, except that, when armed, the N-th call on
// a file inside a `step-*.tmp` directory fails with EIO, as a failing disk would.
namespace tz::zero::eio {
std::atomic<long> fail_at{-1};  // -1: off
std::atomic<long> calls{0};
bool in_partial_checkpoint(int fd) {
  char link[64], target[4096];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return std::strstr(target, ".tmp/") != nullptr || std::strstr(target, ".tmp") == target + n - 4;
}
bool should_fail(int fd) {
  if (fail_at.load() < 0 || !in_partial_checkpoint(fd)) return false;
  return calls.fetch_add(1) + 1 == fail_at.load();
}
template <typename Fn>
Fn next(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
}
}  // namespace tz::zero::eio

extern "C" {
ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  static const auto real = tz::zero::eio::next<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite");
  if (tz::zero::eio::should_fail(fd)) {
    errno = EIO;
    return -1;
  }
  return real(fd, buf, n, off);
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }
ssize_t write(int fd, const void* buf, size_t n) {
  static const auto real = tz::zero::eio::next<ssize_t (*)(int, const void*, size_t)>("write");
  if (fd > 2 && tz::zero::eio::should_fail(fd)) {
    errno = EIO;
    return -1;
  }
  return real(fd, buf, n);
}
int fsync(int fd) {
  static const auto real = tz::zero::eio::next<int (*)(int)>("fsync");
  if (tz::zero::eio::should_fail(fd)) {
    errno = EIO;
    return -1;
  }
  return real(fd);
}
}

namespace tz::zero {
namespace {

namespace fs = std::filesystem;
using testing::EngineModel;
using testing::make_config;
using testing::ModelShape;

constexpr std::uint64_t kSeed = 777;
constexpr int kGlobalBatch = 8;

struct RunSetup {
  int ranks = 2;
  int stage = 1;
  std::string offload_optimizer = "none";
  std::string offload_param = "none";
  std::string dtype = "bf16";
  ModelShape shape{3, 24};
  // The frozen base's identity (CheckpointExtra::base) saved with the checkpoint, and the one
  // this run loads with (the same unless a test says otherwise).
  std::string base;
  std::optional<std::string> load_base;
};

std::string describe(const RunSetup& s) {
  return "ranks=" + std::to_string(s.ranks) + " stage=" + std::to_string(s.stage) + " opt=" +
         s.offload_optimizer + " param=" + s.offload_param + " dtype=" + s.dtype;
}

std::string config_json(const RunSetup& s, const std::string& nvme) {
  std::string j = "{";
  j += "\"train_micro_batch_size_per_gpu\": " + std::to_string(kGlobalBatch / s.ranks) + ",";
  j += "\"gradient_clipping\": 0.5,";
  j += "\"bf16\": {\"enabled\": " + std::string(s.dtype == "bf16" ? "true" : "false") + "},";
  if (s.dtype == "fp16") j += "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 10},";
  j += "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},";
  j += "\"zero_optimization\": {\"stage\": " + std::to_string(s.stage) +
       ", \"offload_optimizer\": {\"device\": \"" + s.offload_optimizer + "\", \"nvme_path\": \"" +
       nvme + "\"}, \"offload_param\": {\"device\": \"" + s.offload_param +
       "\", \"nvme_path\": \"" + nvme + "\"}}";
  return j + "}";
}

class CheckpointTest : public ::testing::Test {
 public:
  void SetUp() override {
    char tmpl[] = "/tmp/tz_ckpt_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ + "/nvme");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Runs steps [first, last) of `s`. Before them: load `resume_from` when non-empty, else init.
  // After them: save into `save_dir` when non-empty (keep `keep`). Returns rank 0's weights and
  // the params hash (checked equal on every rank).
  struct Out {
    std::uint64_t hash = 0;
    std::vector<std::vector<float>> weights;
    Status status;
  };
  Out run(const RunSetup& s, int first, int last, const std::string& resume_from,
          const std::string& save_dir, int keep = 0) {
    Out out;
    std::mutex mu;
    std::vector<std::uint64_t> hashes(static_cast<std::size_t>(s.ranks));
    EngineOptions opts;
    opts.config = make_config(config_json(s, dir_ + "/nvme"));
    out.status = run_local_ranks(s.ranks, 256u << 20, [&](int rank, gpu::Device& dev,
                                                          comm::Comm& comm) -> Status {
      TZ_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(opts, dev, comm));
      EngineModel model(*engine, s.shape);
      TZ_RETURN_IF_ERROR(model.build());
      // A frozen base is not in the checkpoint: the run loads it (init) before resuming.
      if (resume_from.empty() || !s.shape.frozen.empty()) {
        TZ_RETURN_IF_ERROR(model.init(kSeed));
      }
      if (!resume_from.empty()) {
        TZ_ASSIGN_OR_RETURN(std::string path, resolve_checkpoint(resume_from));
        TZ_ASSIGN_OR_RETURN(CheckpointExtra extra,
                            load_checkpoint(*engine, path, s.load_base.value_or(s.base)));
        if (extra.base != s.base) return Status::internal("base read back as " + extra.base);
        if (extra.trainer.value("next_step", -1) != first) {
          return Status::internal("checkpoint's trainer state names step " +
                                  extra.trainer.dump());
        }
      }
      for (int step = first; step < last; ++step) {
        TZ_ASSIGN_OR_RETURN(StepReport r,
                            model.train_step(step, kGlobalBatch / s.ranks, kSeed));
        static_cast<void>(r);
      }
      if (!save_dir.empty()) {
        CheckpointExtra extra;
        extra.model = {{"kind", "test"}, {"layers", s.shape.layers}};
        extra.trainer = {{"next_step", last}};
        extra.base = s.base;
        TZ_ASSIGN_OR_RETURN(std::string saved,
                            save_checkpoint(*engine, comm, save_dir, last, extra, keep));
        static_cast<void>(saved);
      }
      TZ_ASSIGN_OR_RETURN(std::uint64_t h, engine->params_xxh3());
      TZ_ASSIGN_OR_RETURN(auto w, model.weights());
      std::lock_guard lock(mu);
      hashes[static_cast<std::size_t>(rank)] = h;
      if (rank == 0) out.weights = std::move(w);
      return Status::ok();
    });
    for (std::uint64_t h : hashes) EXPECT_EQ(h, hashes[0]) << "ranks disagree";
    out.hash = hashes[0];
    return out;
  }

  std::string dir_;
};

void expect_bit_exact_resume(CheckpointTest* t, const RunSetup& s, const std::string& dir) {
  auto whole = t->run(s, 0, 6, "", "");
  ASSERT_TRUE(whole.status.is_ok()) << whole.status.to_string() << " " << describe(s);
  auto part1 = t->run(s, 0, 3, "", dir);
  ASSERT_TRUE(part1.status.is_ok()) << part1.status.to_string() << " " << describe(s);
  auto part2 = t->run(s, 3, 6, dir, "");
  ASSERT_TRUE(part2.status.is_ok()) << part2.status.to_string() << " " << describe(s);
  EXPECT_EQ(part2.hash, whole.hash) << describe(s);
  ASSERT_EQ(part2.weights.size(), whole.weights.size());
  for (std::size_t i = 0; i < whole.weights.size(); ++i) {
    ASSERT_EQ(std::memcmp(part2.weights[i].data(), whole.weights[i].data(),
                          whole.weights[i].size() * sizeof(float)),
              0)
        << "tensor " << i << " " << describe(s);
  }
}

TEST_F(CheckpointTest, ResumeIsBitExactAtStages1And3) {
  int n = 0;
  for (int stage : {1, 3}) {
    for (const char* opt : {"none", "cpu", "nvme"}) {
      for (const char* param : {"none", "cpu", "nvme"}) {
        if (stage < 3 && std::string(param) != "none") continue;
        RunSetup s;
        s.stage = stage;
        s.offload_optimizer = opt;
        s.offload_param = param;
        SCOPED_TRACE(describe(s));
        expect_bit_exact_resume(this, s, dir_ + "/ck" + std::to_string(n++));
      }
    }
  }
}

// With frozen layers (a LoRA base): the checkpoint holds the trainable units only and the base's
// identity; resumed on the same base it is bit-exact, at stage 1 and at stage 3 with the base on
// NVMe.
TEST_F(CheckpointTest, FrozenBaseResumeIsBitExactAndNotSaved) {
  int n = 0;
  for (int stage : {1, 3}) {
    RunSetup s;
    s.stage = stage;
    s.offload_optimizer = stage == 3 ? "nvme" : "none";
    s.offload_param = stage == 3 ? "nvme" : "none";
    s.shape = ModelShape{4, 24, {0, 2}};
    s.base = "sha256:0f3a-test-base";
    SCOPED_TRACE(describe(s));
    const std::string dir = dir_ + "/frozen" + std::to_string(n++);
    expect_bit_exact_resume(this, s, dir);
    auto path = resolve_checkpoint(dir);
    ASSERT_TRUE(path.is_ok()) << path.status().to_string();
    auto manifest = read_manifest(*path);
    ASSERT_TRUE(manifest.is_ok()) << manifest.status().to_string();
    EXPECT_EQ((*manifest)["base"], s.base);
    EXPECT_EQ((*manifest)["params"], 2u * (24 * 24 + 24));  // layers 1 and 3
    std::vector<std::string> names;
    for (const auto& t : (*manifest)["tensors"]) names.push_back(t["name"]);
    EXPECT_EQ(names, (std::vector<std::string>{"layer1/weight", "layer1/bias", "layer3/weight",
                                               "layer3/bias"}));
    auto summary = verify_checkpoint(*path);
    ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
    EXPECT_EQ(summary->params, 2u * (24 * 24 + 24));
  }
}

// A checkpoint resumes only on its base: another identity (or none) is refused in one line that
// names both.
TEST_F(CheckpointTest, ResumeOnAnotherBaseIsRefused) {
  RunSetup s;
  s.shape = ModelShape{3, 24, {1}};
  s.base = "llama-3.2-1b:seed=7";
  ASSERT_TRUE(run(s, 0, 2, "", dir_ + "/a").status.is_ok());
  for (const std::string other : {"llama-3.2-1b:seed=8", ""}) {
    RunSetup t = s;
    t.load_base = other;
    auto got = run(t, 2, 3, dir_ + "/a", "");
    ASSERT_FALSE(got.status.is_ok());
    const std::string msg = got.status.message();
    EXPECT_EQ(got.status.code(), ErrorCode::kInvalidArgument) << msg;
    EXPECT_NE(msg.find("'llama-3.2-1b:seed=7'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(other.empty() ? "(none)" : "'" + other + "'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // The same base resumes.
  EXPECT_TRUE(run(s, 2, 3, dir_ + "/a", "").status.is_ok());
}

TEST_F(CheckpointTest, Fp16ResumeKeepsTheLossScaler) {
  RunSetup s;
  s.stage = 2;
  s.dtype = "fp16";
  expect_bit_exact_resume(this, s, dir_ + "/fp16");
}

TEST_F(CheckpointTest, ReshardedResumeTracksTheUninterruptedRun) {
  RunSetup four;
  four.ranks = 4;
  four.stage = 3;
  four.dtype = "fp32";
  auto whole = run(four, 0, 6, "", "");
  ASSERT_TRUE(whole.status.is_ok()) << whole.status.to_string();
  ASSERT_TRUE(run(four, 0, 2, "", dir_ + "/a").status.is_ok());
  // 4 ranks stage 3 -> 2 ranks stage 1 -> 1 rank stage 0, the global batch unchanged.
  RunSetup two = four;
  two.ranks = 2;
  two.stage = 1;
  auto mid = run(two, 2, 4, dir_ + "/a", dir_ + "/b");
  ASSERT_TRUE(mid.status.is_ok()) << mid.status.to_string();
  RunSetup one = four;
  one.ranks = 1;
  one.stage = 0;
  auto end = run(one, 4, 6, dir_ + "/b", "");
  ASSERT_TRUE(end.status.is_ok()) << end.status.to_string();
  // Only the reduction order changed: fp32 sums of 4, 2 and 1 partial gradients.
  double worst = 0;
  for (std::size_t i = 0; i < whole.weights.size(); ++i) {
    for (std::size_t j = 0; j < whole.weights[i].size(); ++j) {
      const double a = whole.weights[i][j], b = end.weights[i][j];
      worst = std::max(worst, std::abs(a - b) / (1e-3 + std::abs(a)));
    }
  }
  EXPECT_LT(worst, 1e-4) << "largest relative difference after 6 steps";
}

// Saves one checkpoint of the default setup into dir_/c and returns its directory.
std::string save_one(CheckpointTest* t, const std::string& dir) {
  RunSetup s;
  auto r = t->run(s, 0, 2, "", dir);
  EXPECT_TRUE(r.status.is_ok()) << r.status.to_string();
  auto path = resolve_checkpoint(dir);
  EXPECT_TRUE(path.is_ok()) << path.status().to_string();
  return path.is_ok() ? *path : "";
}

TEST_F(CheckpointTest, CorruptByteIsReportedByFileAndTensor) {
  const std::string ck = save_one(this, dir_ + "/c");
  ASSERT_TRUE(verify_checkpoint(ck).is_ok());
  // Flip one byte inside the data of the last tensor of state1 (Adam's v).
  const std::string file = ck + "/state1.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-3, std::ios::end);
    c = static_cast<char>(c ^ 0x40);
    f.write(&c, 1);
  }
  auto v = verify_checkpoint(ck);
  ASSERT_FALSE(v.is_ok());
  EXPECT_NE(v.status().message().find("state1.safetensors"), std::string::npos) << v.status().message();
  EXPECT_NE(v.status().message().find("layer2/bias"), std::string::npos) << v.status().message();
  EXPECT_NE(v.status().message().find("checksum"), std::string::npos) << v.status().message();
  // Loading reports the same tensor and trains on nothing.
  RunSetup s;
  auto r = run(s, 2, 3, ck, "");
  ASSERT_FALSE(r.status.is_ok());
  EXPECT_NE(r.status.message().find("layer2/bias"), std::string::npos) << r.status.message();
}

TEST_F(CheckpointTest, TruncatedFileAndMissingTensorAreReported) {
  const std::string ck = save_one(this, dir_ + "/c");
  const std::string file = ck + "/master.safetensors";
  fs::resize_file(file, fs::file_size(file) - 10);
  auto v = verify_checkpoint(ck);
  ASSERT_FALSE(v.is_ok());
  EXPECT_NE(v.status().message().find("master.safetensors"), std::string::npos) << v.status().message();
  EXPECT_NE(v.status().message().find("layer2/bias"), std::string::npos) << v.status().message();

  // A model with one more layer finds its tensor missing.
  const std::string ck2 = save_one(this, dir_ + "/d");
  RunSetup bigger;
  bigger.shape.layers = 4;
  auto r = run(bigger, 2, 3, ck2, "");
  ASSERT_FALSE(r.status.is_ok());
  EXPECT_NE(r.status.message().find("layer3/weight"), std::string::npos) << r.status.message();
  EXPECT_NE(r.status.message().find("missing"), std::string::npos) << r.status.message();
  // A model of another width finds a shape mismatch.
  RunSetup wider;
  wider.shape.width = 32;
  auto w = run(wider, 2, 3, ck2, "");
  ASSERT_FALSE(w.status.is_ok());
  EXPECT_NE(w.status.message().find("shape"), std::string::npos) << w.status.message();
}

TEST_F(CheckpointTest, KeepDeletesOnlyOlderCompleteCheckpointsAndPartialsAreCleaned) {
  RunSetup s;
  const std::string dir = dir_ + "/k";
  ASSERT_TRUE(run(s, 0, 1, "", dir, 2).status.is_ok());
  fs::create_directories(dir + "/step-000099.tmp");  // a killed save's leftovers
  ASSERT_TRUE(run(s, 1, 2, dir, dir, 2).status.is_ok());
  ASSERT_TRUE(run(s, 2, 3, dir, dir, 2).status.is_ok());
  EXPECT_FALSE(fs::exists(dir + "/step-000001"));
  EXPECT_TRUE(fs::exists(dir + "/step-000002"));
  EXPECT_TRUE(fs::exists(dir + "/step-000003"));
  EXPECT_FALSE(fs::exists(dir + "/step-000099.tmp"));
  auto latest = resolve_checkpoint(dir);
  ASSERT_TRUE(latest.is_ok());
  EXPECT_EQ(fs::path(*latest).filename(), "step-000003");
}

TEST_F(CheckpointTest, NoSpaceDuringSaveLeavesThePreviousCheckpointLoadable) {
  const std::string mnt = dir_ + "/small";
  fs::create_directories(mnt);
  // A model of ~3 x 256 x 256 fp32 values: each checkpoint holds ~2.4 MB; the filesystem fits one.
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=4m,mode=0700") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here: " << std::strerror(errno);
  }
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  RunSetup s;
  s.shape = ModelShape{3, 256};
  ASSERT_TRUE(run(s, 0, 1, "", mnt, 1).status.is_ok());
  auto failed = run(s, 1, 2, mnt, mnt, 1);
  ASSERT_FALSE(failed.status.is_ok()) << "the second checkpoint should not fit in 4 MB";
  EXPECT_EQ(failed.status.code(), ErrorCode::kNoSpace) << failed.status.to_string();
  auto latest = resolve_checkpoint(mnt);
  ASSERT_TRUE(latest.is_ok()) << latest.status().to_string();
  EXPECT_EQ(fs::path(*latest).filename(), "step-000001");
  EXPECT_TRUE(verify_checkpoint(*latest).is_ok());
  EXPECT_TRUE(run(s, 1, 2, mnt, "").status.is_ok());
}

// Every write and fsync of a save, failed in turn by a seeded choice of call numbers (the first,
// the last and ones between): each failure is reported as an I/O error, the previous checkpoint
// stays the latest, verifies and resumes, and the next save cleans the partial directory.
TEST_F(CheckpointTest, EioDuringSaveLeavesThePreviousCheckpointLoadable) {
  RunSetup s;
  s.stage = 3;
  s.offload_optimizer = "nvme";
  const std::string ck = dir_ + "/eio";
  ASSERT_TRUE(run(s, 0, 1, "", ck).status.is_ok());
  // Count the calls one save makes into its partial directory.
  eio::calls = 0;
  eio::fail_at = std::numeric_limits<long>::max();
  ASSERT_TRUE(run(s, 1, 2, ck, dir_ + "/count").status.is_ok());
  const long total = eio::calls.load();
  eio::fail_at = -1;
  ASSERT_GT(total, 3);
  std::vector<long> picks = {1, total};
  std::uint64_t x = kSeed;
  for (int i = 0; i < 4; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    picks.push_back(1 + static_cast<long>((x >> 33) % static_cast<std::uint64_t>(total)));
  }
  std::printf("a save makes %ld write/fsync calls into its partial directory; failing calls", total);
  for (long k : picks) std::printf(" %ld", k);
  std::printf(" (seed %llu)\n", static_cast<unsigned long long>(kSeed));
  for (long k : picks) {
    SCOPED_TRACE("failing call " + std::to_string(k) + " of " + std::to_string(total) +
                 " (seed " + std::to_string(kSeed) + ")");
    eio::calls = 0;
    eio::fail_at = k;
    auto failed = run(s, 1, 2, ck, ck);
    eio::fail_at = -1;
    ASSERT_FALSE(failed.status.is_ok()) << "the injected EIO was not reported";
    EXPECT_EQ(failed.status.code(), ErrorCode::kIoError) << failed.status.to_string();
    auto latest = resolve_checkpoint(ck);
    ASSERT_TRUE(latest.is_ok()) << latest.status().to_string();
    EXPECT_EQ(fs::path(*latest).filename(), "step-000001");
    EXPECT_TRUE(verify_checkpoint(*latest).is_ok());
  }
  // The previous checkpoint resumes; the next complete save replaces it and leaves no partials.
  auto resumed = run(s, 1, 2, ck, ck);
  ASSERT_TRUE(resumed.status.is_ok()) << resumed.status.to_string();
  auto latest = resolve_checkpoint(ck);
  ASSERT_TRUE(latest.is_ok());
  EXPECT_EQ(fs::path(*latest).filename(), "step-000002");
  for (const auto& e : fs::directory_iterator(ck)) {
    EXPECT_EQ(e.path().extension(), "") << "partial left behind: " << e.path();
  }
}

}  // namespace
}  // namespace tz::zero
