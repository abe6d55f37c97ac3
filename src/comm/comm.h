// The Comm interface: the collectives ZeRO needs (all_gather, reduce_scatter, all_reduce,
// broadcast, barrier) on device buffers, asynchronous on a gpu::Stream, with per-operation byte
// counters of what this rank sent and received, so that communication volume can be checked
// against DESIGN.md's formulas. Backends: NcclComm (GPUs), MpiComm (CPU processes), LocalComm
// (ranks as threads of one process).
//
// Semantics follow NCCL: every rank calls the same collectives in the same order with the same
// counts; a call enqueues the operation on `stream` and returns; the result is ready when the
// stream reaches it. All ranks' buffers use the same dtype.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"
#include "gpu/device.h"

namespace tz::comm {

enum class ReduceOp : std::uint8_t { kSum, kAvg };

enum class CollectiveOp : std::uint8_t {
  kAllGather = 0,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kBarrier,
};
inline constexpr std::size_t kCollectiveOpCount = 5;
std::string_view collective_op_name(CollectiveOp op);

struct OpCounters {
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;      // payload bytes this rank put on the wire
  std::uint64_t bytes_received = 0;  // payload bytes this rank took off the wire
};

struct CommCounters {
  std::array<OpCounters, kCollectiveOpCount> ops{};
  const OpCounters& operator[](CollectiveOp op) const {
    return ops[static_cast<std::size_t>(op)];
  }
  OpCounters total() const;
};

// Byte counts of the ring algorithms for `world` ranks, elements of `elem_bytes` (the formulas
// the counters are checked against; NcclComm counts with them, as NCCL does not report bytes).
// all_gather / reduce_scatter: `count` is the per-rank count; all_reduce / broadcast: the total.
// For all_reduce the count is split into `world` chunks of count*i/world boundaries and rank r
// sends every chunk but r in the reduce-scatter phase and every chunk but r+1 in the gather.
OpCounters ring_bytes(CollectiveOp op, int world, int rank, std::size_t count,
                      std::size_t elem_bytes, int root = 0);

class Comm {
 public:
  virtual ~Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // "local", "mpi" or "nccl".
  virtual std::string_view backend() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Rank among the processes (or threads) of this host.
  virtual int local_rank() const = 0;

  // recv[r*count .. (r+1)*count) = rank r's send[0 .. count) for every r. `send` may equal
  // recv + rank*count (in place). recv holds world_size*count elements.
  virtual Status all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                            gpu::Stream& stream) = 0;
  // recv[0 .. count) = op over ranks of their send[rank*count .. (rank+1)*count). send holds
  // world_size*count elements; `recv` may equal send + rank*count (in place).
  virtual Status reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                ReduceOp op, gpu::Stream& stream) = 0;
  // recv[0 .. count) = op over ranks of send[0 .. count); send == recv is in place.
  virtual Status all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                            ReduceOp op, gpu::Stream& stream) = 0;
  // buffer[0 .. count) of rank `root` is copied to every rank's buffer.
  virtual Status broadcast(void* buffer, std::size_t count, DType dtype, int root,
                           gpu::Stream& stream) = 0;
  // Completes on every rank's stream once every rank's stream has reached it.
  virtual Status barrier(gpu::Stream& stream) = 0;

  // The first error an enqueued operation hit while running (an MPI failure on the stream's
  // worker), or OK. Operations after a failure are skipped.
  virtual Status async_error() const { return Status::ok(); }

  CommCounters counters() const;
  void reset_counters();

 protected:
  Comm() = default;
  // Adds one call and its bytes to `op`'s counters (thread-safe: operations run on stream threads).
  void count(CollectiveOp op, std::uint64_t sent, std::uint64_t received);

 private:
  struct AtomicCounters {
    std::atomic<std::uint64_t> calls{0};
    std::atomic<std::uint64_t> bytes_sent{0};
    std::atomic<std::uint64_t> bytes_received{0};
  };
  std::array<AtomicCounters, kCollectiveOpCount> counters_{};
};

}  // namespace tz::comm
