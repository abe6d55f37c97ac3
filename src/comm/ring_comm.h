// Private to comm/: the ring algorithms that LocalComm and MpiComm share, written against a
// Transport (send to the right neighbour while receiving from the left one). Operations run on a
// host-accessible device's stream as host callbacks, so they are asynchronous and stream-ordered
// like NCCL's; the bytes each rank sends and receives are counted as they move.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "comm/comm.h"

namespace tz::comm {

// A reusable buffer that grows to the largest size asked (no zeroing).
class ScratchBuffer {
 public:
  std::byte* get(std::size_t bytes);

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t bytes_ = 0;
};

// A ring of `size` ranks. Calls come from one thread at a time per rank (the stream worker).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends send[0 .. send_bytes) to rank rank()+1 while receiving recv_bytes from rank()-1 into
  // recv; either side may be 0 bytes (skipped). The left neighbour's matching call sends exactly
  // recv_bytes. Returns when both are done and `send` may be reused.
  virtual Status sendrecv(const void* send, std::size_t send_bytes, void* recv,
                          std::size_t recv_bytes) = 0;
  // As sendrecv, but the incoming bytes are reduced instead of stored: dst[i] = local[i] +
  // incoming[i] in `dtype` (dst may equal local; dst must not overlap `send`). The default
  // receives into a reusable scratch buffer first; LocalComm reads the sender's buffer directly.
  virtual Status sendrecv_reduce(const void* send, std::size_t send_bytes, void* dst,
                                 const void* local, std::size_t recv_bytes, DType dtype);
  virtual Status barrier() = 0;

 private:
  ScratchBuffer scratch_;
};

// dst[i] = a[i] + b[i] for n elements of `dtype`, computed in fp32 and rounded to `dtype`; dst
// may alias a or b.
void reduce_add(DType dtype, void* dst, const void* a, const void* b, std::size_t n);


class RingComm : public Comm {
 public:
  RingComm(std::unique_ptr<Transport> transport, std::string backend, int local_rank)
      : transport_(std::move(transport)), backend_(std::move(backend)), local_rank_(local_rank) {}

  std::string_view backend() const override { return backend_; }
  int rank() const override { return transport_->rank(); }
  int world_size() const override { return transport_->size(); }
  int local_rank() const override { return local_rank_; }

  Status all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                    gpu::Stream& stream) override;
  Status reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                        gpu::Stream& stream) override;
  Status all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                    gpu::Stream& stream) override;
  Status broadcast(void* buffer, std::size_t count, DType dtype, int root,
                   gpu::Stream& stream) override;
  Status barrier(gpu::Stream& stream) override;
  Status async_error() const override;

  // The same collectives run synchronously on the calling thread (the bodies of the enqueued
  // operations; public for benchmarks and tests of the algorithms themselves).
  Status run_all_gather(const void* send, void* recv, std::size_t count, DType dtype);
  Status run_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                            ReduceOp op);
  Status run_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  Status run_broadcast(void* buffer, std::size_t count, DType dtype, int root);
  Status run_barrier();

 private:
  // Checks that `stream` belongs to a host-accessible device, then enqueues `body` on it; the
  // body's error (if any) becomes async_error() and later bodies are skipped.
  template <typename Body>
  Status enqueue(gpu::Stream& stream, const char* what, Body body);
  // A world of one rank: the collective is a device-to-device copy of `bytes` from `send` to
  // `recv` on `stream` (nothing when they are the same buffer or bytes is 0), so it runs on any
  // device, a GPU's included, with nothing sent or received.
  Status single_rank(CollectiveOp op, const void* send, void* recv, std::size_t bytes,
                     gpu::Stream& stream);
  Status sendrecv(CollectiveOp op, const void* send, std::size_t send_bytes, void* recv,
                  std::size_t recv_bytes, std::uint64_t& sent, std::uint64_t& received);

  // Operations of this communicator run one at a time (they share the partial-sum buffers).
  std::mutex run_mu_;
  ScratchBuffer partial_[2];

  std::unique_ptr<Transport> transport_;
  std::string backend_;
  int local_rank_;
  mutable std::mutex error_mu_;
  Status first_error_;  // guarded by error_mu_
};

}  // namespace tz::comm
