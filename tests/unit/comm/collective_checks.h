// Per-rank checks of every collective against a float64 reference and of the byte counters
// against DESIGN.md's ring formulas, written against Comm& so that the same checks run for
// LocalComm (ranks as threads) and MpiComm (ranks as processes under mpirun). Every rank builds
// its input from (seed, rank, index), so each can compute the full expected result itself.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "core/dtype.h"
#include "core/dtype_element.h"
#include "gpu/device.h"

namespace tz::comm::testing {

// A small integer in [-8, 8]: sums over 8 ranks stay exact in bf16 and fp16, so any error is a
// data-movement error, not rounding.
inline int input_value(std::uint32_t seed, int rank, std::size_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(seed) << 32) ^
                    (static_cast<std::uint64_t>(rank) * 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  return static_cast<int>(x % 17) - 8;
}

inline void store(DType t, std::vector<std::uint8_t>& buf, std::size_t i, double v) {
  store_element(buf.data(), t, i, static_cast<float>(v));
}

inline double load(DType t, const std::vector<std::uint8_t>& buf, std::size_t i) {
  return load_element(buf.data(), t, i);
}

// Relative tolerance of one rounding to the dtype (the average's division).
inline double rel_tol(DType t) {
  return t == DType::kF32 ? 1e-6 : (t == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024);
}

struct Harness {
  Comm& comm;
  gpu::Device& device;
  gpu::Stream& stream;
  std::uint32_t seed;

  int n() const { return comm.world_size(); }
  int r() const { return comm.rank(); }

  gpu::DeviceBuffer upload(const std::vector<std::uint8_t>& host) {
    auto buf = device.allocate(host.size());
    EXPECT_TRUE(buf.is_ok()) << buf.status().to_string();
    if (!host.empty()) {
      EXPECT_TRUE(device.copy_async(buf->data(), host.data(), host.size(),
                                    gpu::CopyKind::kHostToDevice, stream).is_ok());
    }
    // `host` may be a temporary: the copy must be done before it goes away.
    EXPECT_TRUE(stream.synchronize().is_ok());
    return std::move(*buf);
  }
  std::vector<std::uint8_t> download(const gpu::DeviceBuffer& buf, std::size_t bytes) {
    std::vector<std::uint8_t> host(bytes);
    if (bytes > 0) {
      EXPECT_TRUE(device.copy_async(host.data(), buf.data(), bytes, gpu::CopyKind::kDeviceToHost,
                                    stream).is_ok());
    }
    EXPECT_TRUE(stream.synchronize().is_ok());
    EXPECT_TRUE(comm.async_error().is_ok()) << comm.async_error().to_string();
    return host;
  }
  std::string where(const char* op, std::size_t count, DType t) const {
    return std::string(op) + " world=" + std::to_string(n()) + " rank=" + std::to_string(r()) +
           " count=" + std::to_string(count) + " dtype=" + std::string(dtype_name(t)) +
           " seed=" + std::to_string(seed);
  }
};

inline void check_all_gather(Harness& h, std::size_t count, DType t, bool in_place) {
  const std::size_t es = dtype_size(t);
  const auto n = static_cast<std::size_t>(h.n());
  const auto r = static_cast<std::size_t>(h.r());
  const OpCounters before = h.comm.counters()[CollectiveOp::kAllGather];
  std::vector<std::uint8_t> full(n * count * es, 0xee);
  std::vector<std::uint8_t> mine(count * es);
  for (std::size_t i = 0; i < count; ++i) store(t, mine, i, input_value(h.seed, h.r(), i));
  gpu::DeviceBuffer recv;
  gpu::DeviceBuffer send;
  if (in_place) {
    if (!mine.empty()) std::memcpy(full.data() + r * count * es, mine.data(), mine.size());
    recv = h.upload(full);
    ASSERT_TRUE(h.comm.all_gather(recv.as<std::uint8_t>() + r * count * es, recv.data(), count, t,
                                  h.stream).is_ok());
  } else {
    send = h.upload(mine);
    recv = h.upload(full);
    ASSERT_TRUE(h.comm.all_gather(send.data(), recv.data(), count, t, h.stream).is_ok());
  }
  const std::vector<std::uint8_t> got = h.download(recv, full.size());
  for (std::size_t q = 0; q < n; ++q) {
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_EQ(load(t, got, q * count + i), input_value(h.seed, static_cast<int>(q), i))
          << h.where("all_gather", count, t) << " from rank " << q << " i=" << i;
    }
  }
  const OpCounters after = h.comm.counters()[CollectiveOp::kAllGather];
  EXPECT_EQ(after.calls - before.calls, 1u);
  EXPECT_EQ(after.bytes_sent - before.bytes_sent, (n - 1) * count * es) << h.where("all_gather", count, t);
  EXPECT_EQ(after.bytes_received - before.bytes_received, (n - 1) * count * es);
}

inline void check_reduce_scatter(Harness& h, std::size_t count, DType t, ReduceOp op,
                                 bool in_place) {
  const std::size_t es = dtype_size(t);
  const auto n = static_cast<std::size_t>(h.n());
  const auto r = static_cast<std::size_t>(h.r());
  const OpCounters before = h.comm.counters()[CollectiveOp::kReduceScatter];
  std::vector<std::uint8_t> in(n * count * es);
  for (std::size_t i = 0; i < n * count; ++i) store(t, in, i, input_value(h.seed, h.r(), i));
  gpu::DeviceBuffer send = h.upload(in);
  gpu::DeviceBuffer recv;
  void* out = nullptr;
  if (in_place) {
    out = send.as<std::uint8_t>() + r * count * es;
  } else {
    recv = h.upload(std::vector<std::uint8_t>(count * es, 0xee));
    out = recv.data();
  }
  ASSERT_TRUE(h.comm.reduce_scatter(send.data(), out, count, t, op, h.stream).is_ok());
  std::vector<std::uint8_t> all = h.download(in_place ? send : recv, in_place ? in.size() : count * es);
  const std::size_t base = in_place ? r * count : 0;
  for (std::size_t i = 0; i < count; ++i) {
    double ref = 0;
    for (std::size_t q = 0; q < n; ++q) ref += input_value(h.seed, static_cast<int>(q), r * count + i);
    if (op == ReduceOp::kAvg) ref /= static_cast<double>(n);
    const double got = load(t, all, base + i);
    ASSERT_NEAR(got, ref, rel_tol(t) * std::fabs(ref) + 1e-30)
        << h.where(op == ReduceOp::kAvg ? "reduce_scatter(avg)" : "reduce_scatter(sum)", count, t)
        << " i=" << i;
  }
  const OpCounters after = h.comm.counters()[CollectiveOp::kReduceScatter];
  EXPECT_EQ(after.bytes_sent - before.bytes_sent, (n - 1) * count * es);
  EXPECT_EQ(after.bytes_received - before.bytes_received, (n - 1) * count * es);
}

// Returns the bytes this rank sent and received, for the caller's sum-over-ranks check.
inline OpCounters check_all_reduce(Harness& h, std::size_t count, DType t, ReduceOp op,
                                   bool in_place) {
  const std::size_t es = dtype_size(t);
  const auto n = static_cast<std::size_t>(h.n());
  const OpCounters before = h.comm.counters()[CollectiveOp::kAllReduce];
  std::vector<std::uint8_t> in(count * es);
  for (std::size_t i = 0; i < count; ++i) store(t, in, i, input_value(h.seed, h.r(), i));
  gpu::DeviceBuffer send = h.upload(in);
  gpu::DeviceBuffer recv;
  if (!in_place) recv = h.upload(std::vector<std::uint8_t>(count * es, 0xee));
  gpu::DeviceBuffer& out = in_place ? send : recv;
  EXPECT_TRUE(h.comm.all_reduce(send.data(), out.data(), count, t, op, h.stream).is_ok());
  const std::vector<std::uint8_t> got = h.download(out, count * es);
  for (std::size_t i = 0; i < count; ++i) {
    double ref = 0;
    for (std::size_t q = 0; q < n; ++q) ref += input_value(h.seed, static_cast<int>(q), i);
    if (op == ReduceOp::kAvg) ref /= static_cast<double>(n);
    const double g = load(t, got, i);
    if (std::fabs(g - ref) > rel_tol(t) * std::fabs(ref) + 1e-30) {
      ADD_FAILURE() << h.where("all_reduce", count, t) << " i=" << i << " got " << g << " want " << ref;
      break;
    }
  }
  const OpCounters after = h.comm.counters()[CollectiveOp::kAllReduce];
  OpCounters delta{after.calls - before.calls, after.bytes_sent - before.bytes_sent,
                   after.bytes_received - before.bytes_received};
  // Evenly divisible: every rank moves 2(N-1)/N of the buffer each way (DESIGN.md's 2Φ).
  if (count % n == 0) {
    EXPECT_EQ(delta.bytes_sent, 2 * (n - 1) * (count / n) * es) << h.where("all_reduce", count, t);
    EXPECT_EQ(delta.bytes_received, 2 * (n - 1) * (count / n) * es);
  }
  return delta;
}

inline OpCounters check_broadcast(Harness& h, std::size_t count, DType t, int root) {
  const std::size_t es = dtype_size(t);
  const OpCounters before = h.comm.counters()[CollectiveOp::kBroadcast];
  std::vector<std::uint8_t> in(count * es);
  for (std::size_t i = 0; i < count; ++i) {
    store(t, in, i, h.r() == root ? input_value(h.seed, root, i) : 99.0);
  }
  gpu::DeviceBuffer buf = h.upload(in);
  EXPECT_TRUE(h.comm.broadcast(buf.data(), count, t, root, h.stream).is_ok());
  const std::vector<std::uint8_t> got = h.download(buf, in.size());
  for (std::size_t i = 0; i < count; ++i) {
    if (load(t, got, i) != input_value(h.seed, root, i)) {
      ADD_FAILURE() << h.where("broadcast", count, t) << " root=" << root << " i=" << i;
      break;
    }
  }
  const OpCounters after = h.comm.counters()[CollectiveOp::kBroadcast];
  const OpCounters delta{after.calls - before.calls, after.bytes_sent - before.bytes_sent,
                         after.bytes_received - before.bytes_received};
  const std::uint64_t bytes = count * es;
  EXPECT_EQ(delta.bytes_received, h.r() == root || h.n() == 1 ? 0u : bytes);
  return delta;
}

// Everything at once for one rank; sums of all_reduce and broadcast bytes over ranks are
// checked by the caller, who sees every rank (sum sent = 2(N-1)·bytes, = (N-1)·bytes).
struct RankTotals {
  std::uint64_t all_reduce_sent = 0;
  std::uint64_t all_reduce_received = 0;
  std::uint64_t broadcast_sent = 0;
};

inline const std::vector<std::size_t>& test_counts() {
  static const std::vector<std::size_t> counts = {0, 1, 2, 3, 7, 13, 1001, 65537};
  return counts;
}

inline RankTotals run_all_checks(Harness& h) {
  RankTotals totals;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (std::size_t count : test_counts()) {
      check_all_gather(h, count, t, false);
      check_all_gather(h, count, t, true);
      check_reduce_scatter(h, count, t, ReduceOp::kSum, false);
      check_reduce_scatter(h, count, t, ReduceOp::kAvg, true);
      for (bool in_place : {false, true}) {
        const OpCounters c =
            check_all_reduce(h, count, t, in_place ? ReduceOp::kAvg : ReduceOp::kSum, in_place);
        totals.all_reduce_sent += c.bytes_sent;
        totals.all_reduce_received += c.bytes_received;
      }
      const OpCounters b = check_broadcast(h, count, t, static_cast<int>(count % static_cast<std::size_t>(h.n())));
      totals.broadcast_sent += b.bytes_sent;
    }
  }
  // A broadcast larger than the pipelining piece (4 MiB), from the last rank.
  const OpCounters big = check_broadcast(h, (5u << 20) / 4 + 3, DType::kF32, h.n() - 1);
  totals.broadcast_sent += big.bytes_sent;
  EXPECT_TRUE(h.comm.barrier(h.stream).is_ok());
  EXPECT_TRUE(h.stream.synchronize().is_ok());
  EXPECT_TRUE(h.comm.async_error().is_ok());
  return totals;
}

// What the sums over ranks must be for run_all_checks (independent of how chunks split).
inline RankTotals expected_totals(int world) {
  RankTotals e;
  const auto n = static_cast<std::uint64_t>(world);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (std::size_t count : test_counts()) {
      const std::uint64_t bytes = count * dtype_size(t);
      e.all_reduce_sent += 2 * (2 * (n - 1) * bytes);  // two all_reduce calls
      e.all_reduce_received += 2 * (2 * (n - 1) * bytes);
      e.broadcast_sent += (n - 1) * bytes;
    }
  }
  e.broadcast_sent += (n - 1) * ((5u << 20) / 4 + 3) * 4;
  return e;
}


// Many collectives in flight at once: a seeded sequence (the same on every rank) of all_reduce,
// all_gather, reduce_scatter and broadcast on separate buffers, enqueued back to back with
// rank-specific random delays (host callbacks) between them, synchronized once at the end and
// then checked. Catches operations matched out of order or run before their inputs are ready.
inline void check_pipelined_sequence(Harness& h, std::uint32_t seed, int ops) {
  std::mt19937 shared(seed);                                  // same on every rank
  std::mt19937 local(seed * 31u + static_cast<std::uint32_t>(h.r()));  // differs per rank
  const auto n = static_cast<std::size_t>(h.n());
  struct Pending {
    CollectiveOp op;
    std::size_t count;
    DType dtype;
    int root;
    gpu::DeviceBuffer buf;
    std::size_t out_offset;  // element offset of the result in buf
  };
  std::vector<Pending> pending;
  for (int k = 0; k < ops; ++k) {
    const auto op = static_cast<CollectiveOp>(shared() % 4);
    const std::size_t count = shared() % 3000;
    const DType t = static_cast<DType>(shared() % 3);
    const int root = static_cast<int>(shared() % n);
    const std::size_t es = dtype_size(t);
    const std::uint32_t salt = seed + static_cast<std::uint32_t>(k) * 7919u;
    std::vector<std::uint8_t> host;
    std::size_t out_offset = 0;
    switch (op) {
      case CollectiveOp::kAllGather:
        host.assign(n * count * es, 0);
        for (std::size_t i = 0; i < count; ++i) {
          store(t, host, static_cast<std::size_t>(h.r()) * count + i, input_value(salt, h.r(), i));
        }
        break;
      case CollectiveOp::kReduceScatter:
        host.resize(n * count * es);
        for (std::size_t i = 0; i < n * count; ++i) store(t, host, i, input_value(salt, h.r(), i));
        out_offset = static_cast<std::size_t>(h.r()) * count;
        break;
      default:
        host.resize(count * es);
        for (std::size_t i = 0; i < count; ++i) {
          store(t, host, i, op == CollectiveOp::kBroadcast && h.r() != root ? 77.0
                                                                            : input_value(salt, h.r(), i));
        }
        break;
    }
    pending.push_back({op, count, t, root, h.upload(host), out_offset});
  }
  // All inputs are in place; now enqueue every collective without waiting in between.
  for (Pending& p : pending) {
    const CollectiveOp op = p.op;
    const std::size_t count = p.count;
    const DType t = p.dtype;
    const int root = p.root;
    const std::size_t es = dtype_size(t);
    const std::size_t out_offset = p.out_offset;
    if (local() % 2) {  // a delay only this rank sees, so ranks reach the op at different times
      const int us = static_cast<int>(local() % 1500);
      ASSERT_TRUE(h.device.host_callback(h.stream, [us] {
        std::this_thread::sleep_for(std::chrono::microseconds(us));
      }).is_ok());
    }
    auto* base = p.buf.as<std::uint8_t>();
    Status st;
    switch (op) {
      case CollectiveOp::kAllGather:
        st = h.comm.all_gather(base + static_cast<std::size_t>(h.r()) * count * es, base, count, t, h.stream);
        break;
      case CollectiveOp::kReduceScatter:
        st = h.comm.reduce_scatter(base, base + out_offset * es, count, t, ReduceOp::kSum, h.stream);
        break;
      case CollectiveOp::kAllReduce:
        st = h.comm.all_reduce(base, base, count, t, ReduceOp::kSum, h.stream);
        break;
      default:
        st = h.comm.broadcast(base, count, t, root, h.stream);
        break;
    }
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  ASSERT_TRUE(h.stream.synchronize().is_ok());
  ASSERT_TRUE(h.comm.async_error().is_ok());
  for (std::size_t k = 0; k < pending.size(); ++k) {
    const Pending& p = pending[k];
    const std::uint32_t salt = seed + static_cast<std::uint32_t>(k) * 7919u;
    const std::vector<std::uint8_t> got = h.download(p.buf, p.buf.size_bytes());
    for (std::size_t i = 0; i < p.count; ++i) {
      double want = 0;
      double value = 0;
      switch (p.op) {
        case CollectiveOp::kAllGather:
          for (std::size_t q = 0; q < n; ++q) {
            ASSERT_EQ(load(p.dtype, got, q * p.count + i), input_value(salt, static_cast<int>(q), i))
                << "op " << k << " all_gather seed " << seed;
          }
          continue;
        case CollectiveOp::kReduceScatter:
          for (std::size_t q = 0; q < n; ++q) {
            want += input_value(salt, static_cast<int>(q), p.out_offset + i);
          }
          value = load(p.dtype, got, p.out_offset + i);
          break;
        case CollectiveOp::kAllReduce:
          for (std::size_t q = 0; q < n; ++q) want += input_value(salt, static_cast<int>(q), i);
          value = load(p.dtype, got, i);
          break;
        default:
          want = input_value(salt, p.root, i);
          value = load(p.dtype, got, i);
          break;
      }
      ASSERT_EQ(value, want) << "op " << k << " (" << collective_op_name(p.op) << ", count "
                             << p.count << ", " << dtype_name(p.dtype) << ") i=" << i << " seed "
                             << seed << " rank " << h.r();
    }
  }
}

}  // namespace tz::comm::testing
