// Ring collectives over a Transport (comm/ring_comm.h). Rank r sends to r+1 and receives from
// r-1; reduce-scatter passes partial sums around the ring so that rank r ends with chunk r, and
// all-gather passes finished chunks around it. Reductions are computed in fp32 per element and
// rounded to the buffer's dtype at every hop, as NCCL does.
#include "comm/ring_comm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/dtype.h"

namespace tz::comm {
namespace {

constexpr std::size_t kBroadcastPieceBytes = 4u << 20;  // pipelining unit of the broadcast chain

int mod(int a, int n) { return ((a % n) + n) % n; }

template <typename T>
void add_typed(void* dst, const void* a, const void* b, std::size_t n) {
  auto* d = static_cast<T*>(dst);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) d[i] = from_f32<T>(to_f32(x[i]) + to_f32(y[i]));
}

}  // namespace

void reduce_add(DType dtype, void* dst, const void* a, const void* b, std::size_t n) {
  switch (dtype) {
    case DType::kF32:
      add_typed<float>(dst, a, b, n);
      return;
    case DType::kBF16:
      add_typed<bf16>(dst, a, b, n);
      return;
    case DType::kF16:
      add_typed<fp16>(dst, a, b, n);
      return;
  }
}

namespace {

template <typename T>
void divide_typed(void* data, std::size_t n, float divisor) {
  auto* d = static_cast<T*>(data);
  for (std::size_t i = 0; i < n; ++i) d[i] = from_f32<T>(to_f32(d[i]) / divisor);
}

void divide(DType dtype, void* data, std::size_t n, int divisor) {
  const float f = static_cast<float>(divisor);
  switch (dtype) {
    case DType::kF32:
      divide_typed<float>(data, n, f);
      return;
    case DType::kBF16:
      divide_typed<bf16>(data, n, f);
      return;
    case DType::kF16:
      divide_typed<fp16>(data, n, f);
      return;
  }
}

std::byte* bytes_of(void* p) { return static_cast<std::byte*>(p); }
const std::byte* bytes_of(const void* p) { return static_cast<const std::byte*>(p); }

}  // namespace

std::byte* ScratchBuffer::get(std::size_t bytes) {
  if (bytes > bytes_) {
    data_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
    bytes_ = bytes;
  }
  return data_.get();
}

Status Transport::sendrecv_reduce(const void* send, std::size_t send_bytes, void* dst,
                                  const void* local, std::size_t recv_bytes, DType dtype) {
  std::byte* incoming = scratch_.get(recv_bytes);
  TZ_RETURN_IF_ERROR(sendrecv(send, send_bytes, incoming, recv_bytes));
  reduce_add(dtype, dst, local, incoming, recv_bytes / dtype_size(dtype));
  return Status::ok();
}

Status RingComm::sendrecv(CollectiveOp /*op*/, const void* send, std::size_t send_bytes,
                          void* recv, std::size_t recv_bytes, std::uint64_t& sent,
                          std::uint64_t& received) {
  TZ_RETURN_IF_ERROR(transport_->sendrecv(send, send_bytes, recv, recv_bytes));
  sent += send_bytes;
  received += recv_bytes;
  return Status::ok();
}

Status RingComm::run_all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
  std::lock_guard run_lock(run_mu_);
  const int n = world_size();
  const int r = rank();
  const std::size_t s = count * dtype_size(dtype);
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  std::byte* out = bytes_of(recv);
  if (s > 0 && bytes_of(send) != out + static_cast<std::size_t>(r) * s) {
    std::memmove(out + static_cast<std::size_t>(r) * s, send, s);
  }
  for (int k = 0; k + 1 < n && s > 0; ++k) {
    const auto send_chunk = static_cast<std::size_t>(mod(r - k, n));
    const auto recv_chunk = static_cast<std::size_t>(mod(r - k - 1, n));
    TZ_RETURN_IF_ERROR(sendrecv(CollectiveOp::kAllGather, out + send_chunk * s, s,
                                out + recv_chunk * s, s, sent, received));
  }
  this->count(CollectiveOp::kAllGather, sent, received);
  return Status::ok();
}

Status RingComm::run_reduce_scatter(const void* send, void* recv, std::size_t count,
                                    DType dtype, ReduceOp op) {
  std::lock_guard run_lock(run_mu_);
  const int n = world_size();
  const int r = rank();
  const std::size_t s = count * dtype_size(dtype);
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  const std::byte* in = bytes_of(send);
  if (n == 1 || s == 0) {
    if (s > 0 && in != bytes_of(recv)) std::memmove(recv, in, s);
  } else {
    // Running sums alternate between two buffers: step k forwards one while the reduction of
    // what arrives from the left is written into the other (the outgoing one may still be read).
    std::byte* partial[2] = {partial_[0].get(s), partial_[1].get(s)};
    for (int k = 0; k + 1 < n; ++k) {
      const void* outgoing =
          k == 0 ? in + static_cast<std::size_t>(mod(r - 1, n)) * s : partial[k % 2];
      const auto chunk = static_cast<std::size_t>(mod(r - k - 2, n));
      void* target = k + 2 == n ? recv : partial[(k + 1) % 2];
      TZ_RETURN_IF_ERROR(transport_->sendrecv_reduce(outgoing, s, target, in + chunk * s, s, dtype));
      sent += s;
      received += s;
    }
  }
  if (op == ReduceOp::kAvg && n > 1) divide(dtype, recv, count, n);
  this->count(CollectiveOp::kReduceScatter, sent, received);
  return Status::ok();
}

Status RingComm::run_all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                                ReduceOp op) {
  std::lock_guard run_lock(run_mu_);
  const int n = world_size();
  const int r = rank();
  const std::size_t es = dtype_size(dtype);
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  std::byte* out = bytes_of(recv);
  if (count > 0 && bytes_of(send) != out) std::memmove(out, send, count * es);
  if (n > 1 && count > 0) {
    const auto n64 = static_cast<std::size_t>(n);
    auto begin = [&](int chunk) { return count * static_cast<std::size_t>(chunk) / n64; };
    auto len = [&](int chunk) { return begin(chunk + 1) - begin(chunk); };
    for (int k = 0; k + 1 < n; ++k) {  // reduce-scatter: rank r ends with chunk r reduced
      const int sc = mod(r - k - 1, n);
      const int rc = mod(r - k - 2, n);
      std::byte* target = out + begin(rc) * es;
      TZ_RETURN_IF_ERROR(transport_->sendrecv_reduce(out + begin(sc) * es, len(sc) * es, target,
                                                     target, len(rc) * es, dtype));
      sent += len(sc) * es;
      received += len(rc) * es;
    }
    if (op == ReduceOp::kAvg) divide(dtype, out + begin(r) * es, len(r), n);
    for (int k = 0; k + 1 < n; ++k) {  // all-gather of the reduced chunks
      const int sc = mod(r - k, n);
      const int rc = mod(r - k - 1, n);
      TZ_RETURN_IF_ERROR(sendrecv(CollectiveOp::kAllReduce, out + begin(sc) * es, len(sc) * es,
                                  out + begin(rc) * es, len(rc) * es, sent, received));
    }
  }
  this->count(CollectiveOp::kAllReduce, sent, received);
  return Status::ok();
}

Status RingComm::run_broadcast(void* buffer, std::size_t count, DType dtype, int root) {
  std::lock_guard run_lock(run_mu_);
  const int n = world_size();
  const int pos = mod(rank() - root, n);  // position in the chain that starts at root
  const std::size_t total = count * dtype_size(dtype);
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  std::byte* buf = bytes_of(buffer);
  for (std::size_t off = 0; off < total && n > 1; off += kBroadcastPieceBytes) {
    const std::size_t len = std::min(kBroadcastPieceBytes, total - off);
    if (pos > 0) {
      TZ_RETURN_IF_ERROR(sendrecv(CollectiveOp::kBroadcast, nullptr, 0, buf + off, len, sent,
                                  received));
    }
    if (pos + 1 < n) {
      TZ_RETURN_IF_ERROR(sendrecv(CollectiveOp::kBroadcast, buf + off, len, nullptr, 0, sent,
                                  received));
    }
  }
  this->count(CollectiveOp::kBroadcast, sent, received);
  return Status::ok();
}

Status RingComm::run_barrier() {
  std::lock_guard run_lock(run_mu_);
  TZ_RETURN_IF_ERROR(transport_->barrier());
  count(CollectiveOp::kBarrier, 0, 0);
  return Status::ok();
}

template <typename Body>
Status RingComm::enqueue(gpu::Stream& stream, const char* what, Body body) {
  gpu::Device& device = stream.device();
  if (!device.host_accessible()) {
    return Status::invalid_argument(backend_ + " comm: " + what + " across " +
                                    std::to_string(world_size()) + " ranks on " + device.name() +
                                    " needs host-accessible buffers (HostDevice); use NcclComm "
                                    "for CUDA devices (one rank needs neither)");
  }
  return device.host_callback(stream, [this, what, body = std::move(body)]() mutable {
    {
      std::lock_guard lock(error_mu_);
      if (!first_error_.is_ok()) return;  // an earlier failure poisons the communicator
    }
    Status st = body();
    if (!st.is_ok()) {
      std::lock_guard lock(error_mu_);
      if (first_error_.is_ok()) {
        first_error_ = std::move(st).with_context(backend_ + " " + what);
      }
    }
  });
}

Status RingComm::single_rank(CollectiveOp op, const void* send, void* recv, std::size_t bytes,
                             gpu::Stream& stream) {
  TZ_ASSERT(world_size() == 1);
  if (bytes > 0 && send != recv) {
    TZ_RETURN_IF_ERROR(stream.device().copy_async(recv, send, bytes,
                                                  gpu::CopyKind::kDeviceToDevice, stream));
  }
  count(op, 0, 0);
  return Status::ok();
}

Status RingComm::async_error() const {
  std::lock_guard lock(error_mu_);
  return first_error_;
}

Status RingComm::all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                            gpu::Stream& stream) {
  if (world_size() == 1) {
    return single_rank(CollectiveOp::kAllGather, send, recv, count * dtype_size(dtype), stream);
  }
  return enqueue(stream, "all_gather",
                 [=, this] { return run_all_gather(send, recv, count, dtype); });
}

Status RingComm::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                ReduceOp op, gpu::Stream& stream) {
  if (world_size() == 1) {  // the sum (and the average) over one rank is its own chunk
    return single_rank(CollectiveOp::kReduceScatter, send, recv, count * dtype_size(dtype),
                       stream);
  }
  return enqueue(stream, "reduce_scatter",
                 [=, this] { return run_reduce_scatter(send, recv, count, dtype, op); });
}

Status RingComm::all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                            ReduceOp op, gpu::Stream& stream) {
  if (world_size() == 1) {
    return single_rank(CollectiveOp::kAllReduce, send, recv, count * dtype_size(dtype), stream);
  }
  return enqueue(stream, "all_reduce",
                 [=, this] { return run_all_reduce(send, recv, count, dtype, op); });
}

Status RingComm::broadcast(void* buffer, std::size_t count, DType dtype, int root,
                           gpu::Stream& stream) {
  if (root < 0 || root >= world_size()) {
    return Status::invalid_argument("broadcast: root " + std::to_string(root) +
                                    " outside [0, " + std::to_string(world_size()) + ")");
  }
  if (world_size() == 1) return single_rank(CollectiveOp::kBroadcast, buffer, buffer, 0, stream);
  return enqueue(stream, "broadcast",
                 [=, this] { return run_broadcast(buffer, count, dtype, root); });
}

Status RingComm::barrier(gpu::Stream& stream) {
  if (world_size() == 1) return single_rank(CollectiveOp::kBarrier, nullptr, nullptr, 0, stream);
  return enqueue(stream, "barrier", [this] { return run_barrier(); });
}

}  // namespace tz::comm
