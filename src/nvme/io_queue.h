// IoQueue turns transfers (any length, any number of files) into engine requests: it checks the
// O_DIRECT rules before submission, cuts transfers into block-sized requests with at most
// `depth_per_file` in flight per file, retries EINTR/EAGAIN, completes short reads and writes,
// and turns every other failure into a Status naming the file, offset and length. An operation
// reports success only when every one of its bytes landed.
//
// Not thread-safe: one thread starts operations and drives the engine (start/poll/wait), and it
// must be the thread that created the engine: the io_uring backend sets up its ring with
// IORING_SETUP_SINGLE_ISSUER, so submissions from any other thread fail with EEXIST.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "nvme/io_engine.h"

namespace tz::nvme {

struct IoQueueOptions {
  std::uint64_t block_bytes = 8ull << 20;  // largest request; a multiple of 4 KiB, at most 1 GiB
  std::uint32_t depth_per_file = 32;       // requests in flight per file at most
  std::uint32_t max_transient_retries = 1000;  // EINTR/EAGAIN retries of one request
};

// A file the queue may address. `align_bytes` is the O_DIRECT alignment (buffer address, offset
// and length) enforced when `direct` is true.
struct IoFile {
  int fd = -1;
  std::string path;
  bool direct = false;
  std::uint32_t align_bytes = 4096;
};

// One contiguous range of one file. `file` is an id returned by IoQueue::add_file.
struct Transfer {
  IoOp op = IoOp::kRead;
  int file = -1;
  std::uint64_t offset = 0;
  void* buf = nullptr;
  std::uint64_t len = 0;
};

struct IoQueueStats {
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t requests = 0;           // requests submitted, resubmissions included
  std::uint64_t transient_retries = 0;  // EINTR / EAGAIN
  std::uint64_t short_transfers = 0;    // completions with fewer bytes than asked
  std::uint64_t max_in_flight_bytes = 0;
};

using IoOpId = std::uint64_t;

class IoQueue {
 public:
  // Takes ownership of the engine. Errors: kInvalidArgument for a block size that is not a
  // multiple of 4 KiB or exceeds 1 GiB, or a zero depth.
  static Result<IoQueue> create(std::unique_ptr<IoEngine> engine, const IoQueueOptions& options);

  IoQueue(IoQueue&&) noexcept;
  IoQueue& operator=(IoQueue&&) noexcept;
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;
  // Waits for requests still in flight (their memory may be written by the kernel) and drops them.
  ~IoQueue();

  // Registers the file with the engine. The descriptor stays the caller's; it must stay open
  // while the queue lives. Returns the file id for Transfer::file.
  Result<int> add_file(const IoFile& file);
  // Registers the regions with the engine as fixed buffers (the pinned pool's slabs go through
  // store::register_pool_with_queue, which sits above both nvme/ and cpu/).
  Status register_buffers(std::span<const iovec> regions);

  // Starts an operation made of `transfers`. Errors come back before anything is submitted:
  // kInvalidArgument for an unknown file, an empty or null transfer, or an O_DIRECT violation
  // ("O_DIRECT on <path> needs buffer, offset and length aligned to N bytes: offset 4097 is
  // not"). The transfers' buffers must stay valid until the operation completes.
  Result<IoOpId> start(std::span<const Transfer> transfers);
  // Submits and reaps without blocking; returns an engine failure.
  Status poll();
  // True when the operation finished (its status is then taken by wait()).
  bool done(IoOpId id) const;
  // Drives the engine until `id` completes and returns its outcome: OK only when every byte was
  // transferred; otherwise the first error, naming the file, offset and length of the request.
  // Other operations keep progressing meanwhile.
  Status wait(IoOpId id);
  // start + wait.
  Status run(std::span<const Transfer> transfers);

  IoEngine& engine() { return *engine_; }
  const IoQueueOptions& options() const { return options_; }
  const IoQueueStats& stats() const { return stats_; }
  std::size_t file_count() const { return files_.size(); }
  const IoFile& file(int id) const { return files_[static_cast<std::size_t>(id)].info; }

 private:
  struct Chunk {
    IoOpId op = 0;
    IoOp kind = IoOp::kRead;
    int file = -1;
    std::uint64_t offset = 0;
    std::byte* buf = nullptr;
    std::uint64_t len = 0;       // bytes still to transfer
    std::uint64_t orig_offset = 0;  // the request as first cut, for messages
    std::uint64_t orig_len = 0;
    std::uint32_t retries = 0;
  };
  struct FileState {
    IoFile info;
    int slot = -1;
    std::uint32_t in_flight = 0;
    std::deque<Chunk> pending;
  };
  struct OpState {
    std::uint64_t chunks_left = 0;  // pending or in flight
    Status status;
    bool failed = false;
    double start_us = -1;  // trace start (-1: tracing was off at start())
    std::uint64_t bytes = 0;
    const char* name = "io";
  };

  IoQueue(std::unique_ptr<IoEngine> engine, const IoQueueOptions& options);
  Status pump(bool block);
  void fill();
  void complete(std::size_t slot, std::int64_t result);
  void finish_chunk(const Chunk& c, Status status);
  void trace_if_done(const OpState& op) const;

  std::unique_ptr<IoEngine> engine_;
  IoQueueOptions options_;
  std::vector<FileState> files_;
  std::unordered_map<IoOpId, OpState> ops_;
  IoOpId next_op_ = 1;
  std::vector<Chunk> slots_;            // in-flight chunks by user_data
  std::vector<std::size_t> free_slots_;
  std::vector<IoRequest> batch_;
  std::vector<IoCompletion> cqes_;
  std::size_t next_file_ = 0;  // round-robin start for fill()
  std::uint64_t in_flight_bytes_ = 0;
  IoQueueStats stats_;
};

}  // namespace tz::nvme
