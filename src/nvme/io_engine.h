// IoEngine: the one interface over the kernel's asynchronous block I/O (io_uring, libaio, psync
// worker threads). An engine moves single requests and reports raw results; cutting transfers,
// retrying transient errors, completing short transfers and naming failures is IoQueue's job, so
// every backend (and the fault-injecting wrapper) gets the same rules.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tz::nvme {

enum class IoOp : std::uint8_t { kRead, kWrite };
enum class IoEngineKind : std::uint8_t { kIoUring, kLibaio, kPsync };

const char* io_engine_name(IoEngineKind kind);
// "io_uring", "libaio" or "psync" (also "uring", "aio"); "auto" is the caller's to handle.
Result<IoEngineKind> parse_io_engine(std::string_view name);

// One request as the kernel sees it. `file` is a slot returned by IoEngine::add_file.
struct IoRequest {
  IoOp op = IoOp::kRead;
  int file = -1;
  std::uint64_t offset = 0;
  void* buf = nullptr;
  std::uint32_t len = 0;
  std::uint64_t user_data = 0;
};

// `result`: bytes transferred (possibly fewer than asked) or -errno.
struct IoCompletion {
  std::uint64_t user_data = 0;
  std::int64_t result = 0;
};

struct IoEngineOptions {
  std::uint32_t queue_depth = 32;  // requests in flight at most (ring size for io_uring)
  bool sqpoll = false;             // io_uring: kernel thread polls the submission queue
  std::uint32_t sqpoll_idle_ms = 100;
  std::uint32_t psync_threads = 0;  // psync: worker threads (0: min(queue_depth, 8))
  std::uint32_t max_files = 64;     // io_uring: registered-file table size
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual IoEngineKind kind() const = 0;
  const char* name() const { return io_engine_name(kind()); }
  // Most requests in flight at once; submitting past it is a programmer error.
  virtual std::uint32_t capacity() const = 0;
  // Requests submitted and not yet returned by reap().
  virtual std::uint32_t in_flight() const = 0;
  // Makes an open descriptor addressable as a slot (io_uring: a registered file). The caller
  // keeps ownership of `fd`; it must stay open while requests may use the slot.
  virtual Result<int> add_file(int fd) = 0;
  // Registers memory that requests will point into (the pinned pool's slabs) so the kernel need
  // not pin pages per request. Optional: requests may also use unregistered memory. Once only.
  virtual Status register_buffers(std::span<const iovec> regions) = 0;
  // True when register_buffers succeeded and requests into those regions use them.
  virtual bool buffers_registered() const = 0;
  // True when add_file slots are kernel-registered (io_uring fixed files).
  virtual bool files_registered() const { return false; }
  // Queues the requests. An engine may defer handing them to the kernel until the next reap()
  // or flush(), so that submitting and waiting share one syscall (io_uring). Errors mean the
  // engine itself failed (the ring is unusable); per-request failures arrive as completions.
  virtual Status submit(std::span<const IoRequest> requests) = 0;
  // Hands every queued request to the kernel now (callers that will not reap soon).
  virtual Status flush() { return Status::ok(); }
  // Copies up to out.size() completions into `out`, first waiting until at least
  // min(min_complete, in_flight()) are available. Returns how many were copied.
  virtual Result<std::size_t> reap(std::span<IoCompletion> out, std::size_t min_complete) = 0;
};

// Creates a backend. Errors: kUnavailable when the kernel refuses (io_uring disabled, io_setup
// limit reached), with the reason.
Result<std::unique_ptr<IoEngine>> make_io_engine(IoEngineKind kind, const IoEngineOptions& options);

}  // namespace tz::nvme
