// The psync backend: pread/pwrite on worker threads, for filesystems without O_DIRECT (tmpfs,
// some overlay filesystems). Each request is one syscall; IoQueue completes short transfers.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/assert.h"
#include "core/thread_name.h"
#include "nvme/engines.h"

namespace tz::nvme {

namespace {

class PsyncEngine final : public IoEngine {
 public:
  static Result<std::unique_ptr<IoEngine>> create(const IoEngineOptions& options) {
    auto engine = std::unique_ptr<PsyncEngine>(new PsyncEngine());
    engine->depth_ = std::max<std::uint32_t>(1, options.queue_depth);
    std::uint32_t threads = options.psync_threads;
    if (threads == 0) threads = std::min<std::uint32_t>(engine->depth_, 8);
    for (std::uint32_t i = 0; i < threads; ++i) {
      engine->workers_.emplace_back([e = engine.get()] {
        set_thread_name("tz-psync");
        e->work();
      });
    }
    return std::unique_ptr<IoEngine>(std::move(engine));
  }

  ~PsyncEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  IoEngineKind kind() const override { return IoEngineKind::kPsync; }
  std::uint32_t capacity() const override { return depth_; }
  std::uint32_t in_flight() const override { return in_flight_; }
  bool buffers_registered() const override { return false; }

  Result<int> add_file(int fd) override {
    std::lock_guard<std::mutex> lock(mu_);
    fds_.push_back(fd);
    return static_cast<int>(fds_.size() - 1);
  }

  Status register_buffers(std::span<const iovec>) override { return Status::ok(); }

  Status submit(std::span<const IoRequest> requests) override {
    TZ_ASSERT(in_flight_ + requests.size() <= depth_, "psync: submit past queue depth");
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const IoRequest& r : requests) {
        TZ_ASSERT(r.file >= 0 && static_cast<std::size_t>(r.file) < fds_.size(), "bad file slot");
        queue_.push_back(r);
      }
    }
    in_flight_ += static_cast<std::uint32_t>(requests.size());
    if (requests.size() == 1) {
      work_cv_.notify_one();
    } else {
      work_cv_.notify_all();
    }
    return Status::ok();
  }

  Result<std::size_t> reap(std::span<IoCompletion> out, std::size_t min_complete) override {
    std::size_t want = std::min<std::size_t>({min_complete, in_flight_, out.size()});
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_.size() >= want; });
    std::size_t got = 0;
    while (got < out.size() && !done_.empty()) {
      out[got++] = done_.front();
      done_.pop_front();
    }
    in_flight_ -= static_cast<std::uint32_t>(got);
    return got;
  }

 private:
  PsyncEngine() = default;

  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      const IoRequest r = queue_.front();
      queue_.pop_front();
      const int fd = fds_[static_cast<std::size_t>(r.file)];
      lock.unlock();
      const auto offset = static_cast<off_t>(r.offset);
      const ssize_t n = r.op == IoOp::kRead ? pread(fd, r.buf, r.len, offset)
                                            : pwrite(fd, r.buf, r.len, offset);
      const std::int64_t result = n < 0 ? -static_cast<std::int64_t>(errno) : n;
      lock.lock();
      done_.push_back(IoCompletion{r.user_data, result});
      done_cv_.notify_one();
    }
  }

  std::uint32_t depth_ = 0;
  std::uint32_t in_flight_ = 0;  // touched by the submitting thread only
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  std::vector<int> fds_;
  std::deque<IoRequest> queue_;
  std::deque<IoCompletion> done_;
  std::vector<std::thread> workers_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> make_psync_engine(const IoEngineOptions& options) {
  return PsyncEngine::create(options);
}

}  // namespace tz::nvme
