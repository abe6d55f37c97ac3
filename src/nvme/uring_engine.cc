// The io_uring backend: registered buffers (the pinned pool's slabs), registered files, one
// io_uring_enter per batch, completions reaped from the shared ring without a syscall per request,
// and optional SQPOLL.
#include <liburing.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/assert.h"
#include "core/check.h"
#include "core/log.h"
#include "nvme/engines.h"

namespace tz::nvme {

namespace {

class UringEngine final : public IoEngine {
 public:
  static Result<std::unique_ptr<IoEngine>> create(const IoEngineOptions& options) {
    auto engine = std::unique_ptr<UringEngine>(new UringEngine());
    engine->depth_ = std::max<std::uint32_t>(1, options.queue_depth);
    io_uring_params params{};
    params.cq_entries = engine->depth_ * 2;
    unsigned flags = IORING_SETUP_CQSIZE;
    if (options.sqpoll) {
      flags |= IORING_SETUP_SQPOLL;
      params.sq_thread_idle = options.sqpoll_idle_ms;
    } else {
      // One thread submits and reaps; completions run as task work when we enter the kernel.
      flags |= IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN;
    }
    params.flags = flags;
    int rc = io_uring_queue_init_params(engine->depth_, &engine->ring_, &params);
    if (rc == -EINVAL && !options.sqpoll) {
      // Kernels before 6.0 lack SINGLE_ISSUER / COOP_TASKRUN.
      params = io_uring_params{};
      params.cq_entries = engine->depth_ * 2;
      params.flags = IORING_SETUP_CQSIZE;
      rc = io_uring_queue_init_params(engine->depth_, &engine->ring_, &params);
    }
    if (rc < 0) {
      Status st = check_neg_errno(rc, "io_uring_queue_init");
      return Status(ErrorCode::kUnavailable, st.sys_code(), st.message());
    }
    engine->ring_ok_ = true;
    engine->max_files_ = std::max<std::uint32_t>(1, options.max_files);
    rc = io_uring_register_files_sparse(&engine->ring_, engine->max_files_);
    if (rc < 0) {
      TZ_LOG_DEBUG("io_uring: sparse file table refused (%s); using plain descriptors",
                   std::strerror(-rc));
    } else {
      engine->fixed_files_ = true;
    }
    return std::unique_ptr<IoEngine>(std::move(engine));
  }

  ~UringEngine() override {
    if (ring_ok_) io_uring_queue_exit(&ring_);
  }

  IoEngineKind kind() const override { return IoEngineKind::kIoUring; }
  std::uint32_t capacity() const override { return depth_; }
  std::uint32_t in_flight() const override { return in_flight_; }
  bool buffers_registered() const override { return !buffers_.empty(); }
  bool files_registered() const override { return fixed_files_; }

  Result<int> add_file(int fd) override {
    const int slot = static_cast<int>(fds_.size());
    if (fixed_files_) {
      if (fds_.size() >= max_files_) {
        return Status::invalid_argument("io_uring: more than " + std::to_string(max_files_) +
                                        " files (raise IoEngineOptions::max_files)");
      }
      int one = fd;
      const int rc = io_uring_register_files_update(&ring_, static_cast<unsigned>(slot), &one, 1);
      if (rc < 0) return check_neg_errno(rc, "io_uring_register_files_update");
    }
    fds_.push_back(fd);
    return slot;
  }

  Status register_buffers(std::span<const iovec> regions) override {
    TZ_ASSERT(buffers_.empty(), "io_uring buffers registered twice");
    if (regions.empty()) return Status::ok();
    const int rc = io_uring_register_buffers(&ring_, regions.data(),
                                             static_cast<unsigned>(regions.size()));
    if (rc < 0) {
      return check_neg_errno(rc, "io_uring_register_buffers (memlock limit too low? see "
                                 "`ulimit -l`)");
    }
    buffers_.assign(regions.begin(), regions.end());
    return Status::ok();
  }

  Status submit(std::span<const IoRequest> requests) override {
    TZ_ASSERT(in_flight_ + requests.size() <= depth_, "io_uring: submit past queue depth");
    for (const IoRequest& r : requests) {
      TZ_ASSERT(r.file >= 0 && static_cast<std::size_t>(r.file) < fds_.size(), "bad file slot");
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      TZ_ASSERT(sqe != nullptr, "io_uring: submission queue full below queue depth");
      const int buf_index = buffer_index(r.buf, r.len);
      const int fd = fixed_files_ ? r.file : fds_[static_cast<std::size_t>(r.file)];
      if (r.op == IoOp::kRead) {
        if (buf_index >= 0) {
          io_uring_prep_read_fixed(sqe, fd, r.buf, r.len, r.offset, buf_index);
        } else {
          io_uring_prep_read(sqe, fd, r.buf, r.len, r.offset);
        }
      } else {
        if (buf_index >= 0) {
          io_uring_prep_write_fixed(sqe, fd, r.buf, r.len, r.offset, buf_index);
        } else {
          io_uring_prep_write(sqe, fd, r.buf, r.len, r.offset);
        }
      }
      if (fixed_files_) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(sqe, r.user_data);
      ++in_flight_;
      ++unsubmitted_;
    }
    // Handed to the kernel by the next reap (together with the wait) or flush().
    return Status::ok();
  }

  Status flush() override { return unsubmitted_ > 0 ? enter(0) : Status::ok(); }

  Result<std::size_t> reap(std::span<IoCompletion> out, std::size_t min_complete) override {
    std::size_t want = std::min<std::size_t>(min_complete, in_flight_);
    want = std::min(want, out.size());
    std::size_t got = peek(out);
    if (got >= want) {
      TZ_RETURN_IF_ERROR(flush());
      return got;
    }
    while (got < want) {
      // Submits anything still queued and waits in one syscall.
      TZ_RETURN_IF_ERROR(enter(static_cast<unsigned>(want - got)));
      got += peek(out.subspan(got));
    }
    return got;
  }

 private:
  UringEngine() = default;

  // Submits queued SQEs, optionally waiting for `wait_nr` completions. EINTR, EAGAIN and EBUSY
  // are transient: the SQEs stay queued and the next call submits them.
  Status enter(unsigned wait_nr) {
    for (;;) {
      const int rc = wait_nr > 0 ? io_uring_submit_and_wait(&ring_, wait_nr) : io_uring_submit(&ring_);
      if (rc >= 0) {
        unsubmitted_ = io_uring_sq_ready(&ring_);
        return Status::ok();
      }
      if (rc == -EINTR) continue;
      if (rc == -EAGAIN || rc == -EBUSY) {
        // The kernel is short of resources or the CQ is full: let the caller reap and retry.
        sched_yield();
        return Status::ok();
      }
      return check_neg_errno(rc, "io_uring_submit");
    }
  }

  std::size_t peek(std::span<IoCompletion> out) {
    if (out.empty()) return 0;
    io_uring_cqe* cqes[64];
    const unsigned n = io_uring_peek_batch_cqe(
        &ring_, cqes, static_cast<unsigned>(std::min<std::size_t>(out.size(), 64)));
    for (unsigned i = 0; i < n; ++i) {
      out[i].user_data = io_uring_cqe_get_data64(cqes[i]);
      out[i].result = cqes[i]->res;
    }
    io_uring_cq_advance(&ring_, n);
    TZ_ASSERT(n <= in_flight_, "io_uring: more completions than requests");
    in_flight_ -= n;
    return n;
  }

  int buffer_index(const void* buf, std::uint32_t len) const {
    const auto p = reinterpret_cast<std::uintptr_t>(buf);
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      const auto base = reinterpret_cast<std::uintptr_t>(buffers_[i].iov_base);
      if (p >= base && p + len <= base + buffers_[i].iov_len) return static_cast<int>(i);
    }
    return -1;
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  bool fixed_files_ = false;
  std::uint32_t depth_ = 0;
  std::uint32_t in_flight_ = 0;
  std::uint32_t unsubmitted_ = 0;  // prepared SQEs not yet handed to the kernel
  std::uint32_t max_files_ = 0;
  std::vector<int> fds_;
  std::vector<iovec> buffers_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> make_uring_engine(const IoEngineOptions& options) {
  return UringEngine::create(options);
}

}  // namespace tz::nvme
