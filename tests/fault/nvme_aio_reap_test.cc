// The libaio engine's reap loop when io_submit refuses work (issue 14, defect 6): io_submit is
// interposed in this test program (the engine calls it through the PLT, the executable's
// definition wins) so each test can script EAGAIN and refusals, then falls through to libaio.
//  - EAGAIN, then a refusal of the only request: reap must return that failure, not wait in
//    io_getevents for a completion the kernel never got (run in a child process so a hang is
//    reported as a failure instead of blocking the suite).
//  - EAGAIN for a while with nothing in flight: reap must back off (a bounded number of
//    io_submit calls in the window), then complete the request byte-exact.
#include <dlfcn.h>
#include <fcntl.h>
#include <libaio.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "nvme/io_engine.h"
#include "nvme/nvme_test_util.h"

namespace {

// The script: the next `eagain_calls` io_submit calls return -EAGAIN, or, while
// `eagain_until_ns` is in the future, every call does; then `refuse_calls` calls return -EINVAL.
std::atomic<int> eagain_calls{0};
std::atomic<long long> eagain_until_ns{0};
std::atomic<int> refuse_calls{0};
std::atomic<long> submit_calls{0};

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

extern "C" int io_submit(io_context_t ctx, long nr, struct iocb* ios[]) {
  using Fn = int (*)(io_context_t, long, struct iocb**);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "io_submit"));
  submit_calls.fetch_add(1);
  if (eagain_calls.load() > 0) {
    eagain_calls.fetch_sub(1);
    return -EAGAIN;
  }
  if (now_ns() < eagain_until_ns.load()) return -EAGAIN;
  if (refuse_calls.load() > 0) {
    refuse_calls.fetch_sub(1);
    return -EINVAL;
  }
  return real(ctx, nr, ios);
}

namespace tz::nvme {
namespace {

using testing::TempDir;

struct AioFile {
  std::unique_ptr<IoEngine> engine;
  int fd = -1;
  int slot = -1;
  ~AioFile() {
    engine.reset();
    if (fd >= 0) ::close(fd);
  }
};

void open_aio_file(const std::string& path, AioFile& f) {
  IoEngineOptions eo;
  eo.queue_depth = 4;
  auto engine = make_io_engine(IoEngineKind::kLibaio, eo);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  f.engine = std::move(engine).value();
  f.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(f.fd, 0) << path << ": " << std::strerror(errno);
  auto slot = f.engine->add_file(f.fd);
  ASSERT_TRUE(slot.is_ok());
  f.slot = *slot;
}

TEST(AioReap, RefusalAfterEagainWithNothingInFlightCompletesInsteadOfHanging) {
  TempDir dir;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Exit codes: 0 the failure came back as a completion, 1..5 a wrong outcome.
    AioFile f;
    open_aio_file(dir.path() + "/refused", f);
    if (f.engine == nullptr) _exit(1);
    alignas(4096) static std::byte buf[4096];
    eagain_calls = 1;  // submit(): io_submit says EAGAIN, the request stays in the backlog
    refuse_calls = 1;  // the reap's flush: io_submit refuses it
    IoRequest r{IoOp::kWrite, f.slot, 0, buf, 4096, 77};
    if (!f.engine->submit({&r, 1}).is_ok()) _exit(2);
    IoCompletion c;
    auto n = f.engine->reap({&c, 1}, 1);
    if (!n.is_ok() || *n != 1) _exit(3);
    if (c.user_data != 77 || c.result != -EINVAL) _exit(4);
    if (f.engine->in_flight() != 0) _exit(5);
    _exit(0);
  }
  int status = 0;
  pid_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((done = waitpid(child, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL() << "reap() still waiting 20 s after io_submit refused the only request: io_getevents "
              "waits for a completion that was never submitted";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "wrong outcome, see the exit codes in the child";
}

TEST(AioReap, EagainWithEverythingInTheBacklogBacksOffThenCompletes) {
  TempDir dir;
  AioFile f;
  ASSERT_NO_FATAL_FAILURE(open_aio_file(dir.path() + "/backoff", f));
  alignas(4096) static std::byte out[4096];
  alignas(4096) static std::byte in[4096];
  std::mt19937_64 rng(31);
  std::printf("seed 31\n");
  testing::fill_random(out, sizeof(out), rng);
  IoRequest w{IoOp::kWrite, f.slot, 0, out, 4096, 1};
  ASSERT_TRUE(f.engine->submit({&w, 1}).is_ok());
  IoCompletion c;
  ASSERT_TRUE(f.engine->reap({&c, 1}, 1).is_ok());
  ASSERT_EQ(c.result, 4096);

  // 300 ms of EAGAIN with the request in the backlog: a loop that backs off to 1 ms calls
  // io_submit a few hundred times at most; one that spins calls it hundreds of thousands of times.
  constexpr long kWindowMs = 300;
  eagain_until_ns = now_ns() + kWindowMs * 1000000;
  IoRequest r{IoOp::kRead, f.slot, 0, in, 4096, 2};
  const long before = submit_calls.load();
  ASSERT_TRUE(f.engine->submit({&r, 1}).is_ok());
  auto n = f.engine->reap({&c, 1}, 1);
  const long calls = submit_calls.load() - before;
  ASSERT_TRUE(n.is_ok()) << n.status().to_string();
  ASSERT_EQ(*n, 1u);
  EXPECT_EQ(c.user_data, 2u);
  EXPECT_EQ(c.result, 4096);
  EXPECT_EQ(std::memcmp(in, out, sizeof(in)), 0);
  std::printf("io_submit calls during %ld ms of EAGAIN: %ld\n", kWindowMs, calls);
  EXPECT_LT(calls, 5 * kWindowMs) << "reap spins on io_submit without backing off";
  EXPECT_EQ(f.engine->in_flight(), 0u);
}

}  // namespace
}  // namespace tz::nvme
