// The libaio backend: io_submit / io_getevents on one kernel AIO context, the same request model
// as io_uring. Requests io_submit could not take yet (EAGAIN, partial submission) wait in a
// backlog that is flushed before the next wait; requests it refused complete with their error.
//
// Counting: in_flight_ = backlog_ + in_kernel_ + failed_. Only in_kernel_ requests can ever come
// back from io_getevents, so that is what a wait may ask for; when everything left is in the
// backlog (the kernel said EAGAIN with none of ours in flight) reap backs off instead of spinning.
#include <libaio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "core/assert.h"
#include "core/check.h"
#include "nvme/engines.h"

namespace tz::nvme {

namespace {

class AioEngine final : public IoEngine {
 public:
  static Result<std::unique_ptr<IoEngine>> create(const IoEngineOptions& options) {
    auto engine = std::unique_ptr<AioEngine>(new AioEngine());
    engine->depth_ = std::max<std::uint32_t>(1, options.queue_depth);
    const int rc = io_setup(static_cast<int>(engine->depth_), &engine->ctx_);
    if (rc < 0) {
      Status st = check_neg_errno(rc, "io_setup (see /proc/sys/fs/aio-max-nr)");
      return Status(ErrorCode::kUnavailable, st.sys_code(), st.message());
    }
    engine->ctx_ok_ = true;
    engine->iocbs_.resize(engine->depth_);
    engine->events_.resize(engine->depth_);
    engine->user_data_.resize(engine->depth_);
    for (std::uint32_t i = 0; i < engine->depth_; ++i) engine->free_.push_back(i);
    return std::unique_ptr<IoEngine>(std::move(engine));
  }

  ~AioEngine() override {
    if (ctx_ok_) {
      // In-flight requests at destruction are a caller bug; io_destroy waits for them anyway.
      const int rc = io_destroy(ctx_);
      (void)rc;
    }
  }

  IoEngineKind kind() const override { return IoEngineKind::kLibaio; }
  std::uint32_t capacity() const override { return depth_; }
  std::uint32_t in_flight() const override { return in_flight_; }
  bool buffers_registered() const override { return false; }

  Result<int> add_file(int fd) override {
    fds_.push_back(fd);
    return static_cast<int>(fds_.size() - 1);
  }

  // libaio has no buffer registration; the kernel pins pages per request.
  Status register_buffers(std::span<const iovec>) override { return Status::ok(); }

  Status submit(std::span<const IoRequest> requests) override {
    TZ_ASSERT(in_flight_ + requests.size() <= depth_, "libaio: submit past queue depth");
    for (const IoRequest& r : requests) {
      TZ_ASSERT(r.file >= 0 && static_cast<std::size_t>(r.file) < fds_.size(), "bad file slot");
      TZ_ASSERT(!free_.empty());
      const std::uint32_t slot = free_.back();
      free_.pop_back();
      iocb* cb = &iocbs_[slot];
      const int fd = fds_[static_cast<std::size_t>(r.file)];
      if (r.op == IoOp::kRead) {
        io_prep_pread(cb, fd, r.buf, r.len, static_cast<long long>(r.offset));
      } else {
        io_prep_pwrite(cb, fd, r.buf, r.len, static_cast<long long>(r.offset));
      }
      cb->data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(slot));
      user_data_[slot] = r.user_data;
      backlog_.push_back(cb);
      ++in_flight_;
    }
    return flush();
  }

  Result<std::size_t> reap(std::span<IoCompletion> out, std::size_t min_complete) override {
    std::size_t got = 0;
    const std::size_t want = std::min<std::size_t>({min_complete, in_flight_, out.size()});
    std::uint32_t idle_rounds = 0;
    auto idle_since = std::chrono::steady_clock::now();
    while (true) {
      TZ_RETURN_IF_ERROR(flush());
      // Requests io_submit refused outright complete here with their error.
      while (got < out.size() && !failed_.empty()) {
        out[got++] = failed_.front();
        failed_.pop_front();
        --in_flight_;
      }
      if (got == out.size()) break;
      if (in_kernel_ > 0) {
        idle_rounds = 0;
        const std::size_t room = std::min<std::size_t>(out.size() - got, in_kernel_);
        const long min_nr = got < want ? static_cast<long>(std::min(want - got, room)) : 0;
        const int n = io_getevents(ctx_, min_nr, static_cast<long>(room), events_.data(), nullptr);
        if (n == -EINTR) continue;
        if (n < 0) return check_neg_errno(n, "io_getevents");
        for (int i = 0; i < n; ++i) {
          const auto slot =
              static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(events_[i].data));
          // res is the byte count or -errno stored in an unsigned long.
          out[got].user_data = user_data_[slot];
          out[got].result = static_cast<long>(events_[i].res);
          ++got;
          free_.push_back(slot);
          --in_flight_;
          --in_kernel_;
        }
        if (got >= want) break;
        continue;
      }
      if (got >= want || backlog_.empty()) break;
      // Nothing of ours is in the kernel and it refused the backlog with EAGAIN: no completion
      // of ours will free room, so wait for other users of the system-wide AIO limit, backing
      // off from 20 us to 1 ms, and give up when it stays refused.
      if (idle_rounds == 0) idle_since = std::chrono::steady_clock::now();
      if (std::chrono::steady_clock::now() - idle_since > kEagainGiveUp) {
        return Status(ErrorCode::kUnavailable, EAGAIN,
                      "libaio: io_submit refused " + std::to_string(backlog_.size()) +
                          " request(s) with EAGAIN for " +
                          std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                             kEagainGiveUp).count()) +
                          " s while none of this engine's were in flight; the system-wide AIO "
                          "limit (/proc/sys/fs/aio-max-nr, in use: /proc/sys/fs/aio-nr) may be "
                          "exhausted, or use the io_uring engine");
      }
      std::this_thread::sleep_for(
          std::chrono::microseconds(std::min<std::uint32_t>(1000, 20u << std::min(idle_rounds, 6u))));
      ++idle_rounds;
    }
    return got;
  }

 private:
  AioEngine() = default;

  Status flush() {
    while (!backlog_.empty()) {
      const int n = io_submit(ctx_, static_cast<long>(backlog_.size()), backlog_.data());
      if (n > 0) {
        backlog_.erase(backlog_.begin(), backlog_.begin() + n);
        in_kernel_ += static_cast<std::uint32_t>(n);
        continue;
      }
      if (n == -EINTR) continue;
      if (n == -EAGAIN) return Status::ok();  // kernel busy: try again at the next reap
      if (n == 0) return Status::ok();
      // The first iocb was refused (EBADF, EINVAL, ...): complete it with that error.
      iocb* cb = backlog_.front();
      backlog_.erase(backlog_.begin());
      const auto slot = static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(cb->data));
      failed_.push_back(IoCompletion{user_data_[slot], n});
      free_.push_back(slot);
    }
    return Status::ok();
  }

  io_context_t ctx_ = nullptr;
  bool ctx_ok_ = false;
  std::uint32_t depth_ = 0;
  static constexpr std::chrono::seconds kEagainGiveUp{30};

  std::uint32_t in_flight_ = 0;  // submitted by the caller and not yet reaped
  std::uint32_t in_kernel_ = 0;  // accepted by io_submit and not yet returned by io_getevents
  std::vector<int> fds_;
  std::vector<iocb> iocbs_;
  std::vector<io_event> events_;
  std::vector<std::uint64_t> user_data_;
  std::vector<std::uint32_t> free_;
  std::vector<iocb*> backlog_;
  std::deque<IoCompletion> failed_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> make_aio_engine(const IoEngineOptions& options) {
  return AioEngine::create(options);
}

}  // namespace tz::nvme
