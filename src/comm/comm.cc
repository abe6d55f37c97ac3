// Comm's backend-independent parts: op names, byte counters and the ring byte formulas.
#include "comm/comm.h"

namespace tz::comm {

std::string_view collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kBarrier:
      return "barrier";
  }
  return "unknown";
}

OpCounters CommCounters::total() const {
  OpCounters t;
  for (const OpCounters& c : ops) {
    t.calls += c.calls;
    t.bytes_sent += c.bytes_sent;
    t.bytes_received += c.bytes_received;
  }
  return t;
}

OpCounters ring_bytes(CollectiveOp op, int world, int rank, std::size_t count,
                      std::size_t elem_bytes, int root) {
  TZ_ASSERT(world >= 1 && rank >= 0 && rank < world);
  OpCounters c;
  c.calls = 1;
  const std::uint64_t n = static_cast<std::uint64_t>(world);
  const std::uint64_t bytes = static_cast<std::uint64_t>(count) * elem_bytes;
  switch (op) {
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
      c.bytes_sent = c.bytes_received = (n - 1) * bytes;
      break;
    case CollectiveOp::kAllReduce: {
      if (world == 1) break;
      auto chunk = [&](int i) {
        const std::uint64_t k = static_cast<std::uint64_t>((i % world + world) % world);
        return (count * (k + 1) / n - count * k / n) * elem_bytes;
      };
      c.bytes_sent = 2 * bytes - chunk(rank) - chunk(rank + 1);
      c.bytes_received = 2 * bytes - chunk(rank - 1) - chunk(rank);
      break;
    }
    case CollectiveOp::kBroadcast: {
      const int pos = (rank - root + world) % world;
      c.bytes_sent = pos < world - 1 ? bytes : 0;
      c.bytes_received = pos > 0 ? bytes : 0;
      break;
    }
    case CollectiveOp::kBarrier:
      break;
  }
  return c;
}

CommCounters Comm::counters() const {
  CommCounters out;
  for (std::size_t i = 0; i < kCollectiveOpCount; ++i) {
    out.ops[i].calls = counters_[i].calls.load(std::memory_order_relaxed);
    out.ops[i].bytes_sent = counters_[i].bytes_sent.load(std::memory_order_relaxed);
    out.ops[i].bytes_received = counters_[i].bytes_received.load(std::memory_order_relaxed);
  }
  return out;
}

void Comm::reset_counters() {
  for (AtomicCounters& c : counters_) {
    c.calls.store(0, std::memory_order_relaxed);
    c.bytes_sent.store(0, std::memory_order_relaxed);
    c.bytes_received.store(0, std::memory_order_relaxed);
  }
}

void Comm::count(CollectiveOp op, std::uint64_t sent, std::uint64_t received) {
  AtomicCounters& c = counters_[static_cast<std::size_t>(op)];
  c.calls.fetch_add(1, std::memory_order_relaxed);
  c.bytes_sent.fetch_add(sent, std::memory_order_relaxed);
  c.bytes_received.fetch_add(received, std::memory_order_relaxed);
}

}  // namespace tz::comm
