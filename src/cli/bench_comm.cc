// `tierzero bench comm`: per collective and message size, time per operation, algorithm
// bandwidth and bus bandwidth computed as nccl-tests does (busbw = algbw x 2(n-1)/n for
// all_reduce, x (n-1)/n for all_gather and reduce_scatter, x 1 for broadcast). Runs LocalComm
// ranks as threads of this process, or one rank per process under mpirun/srun (MPI or NCCL);
// rank 0 prints.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "comm/launch_env.h"
#include "comm/local_comm.h"
#include "comm/select.h"
#include "core/units.h"
#include "gpu/select.h"

namespace tz::cli {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct CommOptions {
  std::string backend = "auto";
  std::string device = "auto";
  int ranks = 2;  // LocalComm only
  std::string min_bytes = "64K";
  std::string max_bytes = "16M";
  int factor = 4;
  int iters = 5;
  int repeats = 3;
  std::string ops = "all_reduce,all_gather,reduce_scatter,broadcast";
  std::string dtype = "fp32";
  bool json = false;
};

double bus_factor(comm::CollectiveOp op, int n) {
  const double dn = n;
  switch (op) {
    case comm::CollectiveOp::kAllReduce:
      return 2 * (dn - 1) / dn;
    case comm::CollectiveOp::kAllGather:
    case comm::CollectiveOp::kReduceScatter:
      return (dn - 1) / dn;
    default:
      return 1;
  }
}

struct Case {
  comm::CollectiveOp op;
  std::size_t bytes;  // nccl-tests' size: the full buffer (all_gather's output, reduce_scatter's input)
};

struct Row {
  Case c;
  std::size_t count;
  double time_us;
  double algbw_gbps;
  double busbw_gbps;
  std::uint64_t bytes_sent_per_op;  // rank 0's counter
};

// Runs the cases on one rank; returns rank 0's rows (other ranks return an empty vector).
Result<std::vector<Row>> run_rank(comm::Comm& comm, gpu::Device& device, gpu::Stream& stream,
                                  const std::vector<Case>& cases, DType dtype,
                                  const CommOptions& opts) {
  const int n = comm.world_size();
  const std::size_t es = dtype_size(dtype);
  std::size_t max_bytes = 0;
  for (const Case& c : cases) max_bytes = std::max(max_bytes, c.bytes);
  TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer send, device.allocate(max_bytes + 256));
  TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer recv, device.allocate(max_bytes + 256));
  TZ_RETURN_IF_ERROR(device.memset_async(send.data(), 0, max_bytes, stream));
  TZ_RETURN_IF_ERROR(device.memset_async(recv.data(), 0, max_bytes, stream));
  std::vector<Row> rows;
  for (const Case& c : cases) {
    const bool per_rank = c.op == comm::CollectiveOp::kAllGather ||
                          c.op == comm::CollectiveOp::kReduceScatter;
    const std::size_t count = per_rank ? c.bytes / (static_cast<std::size_t>(n) * es) : c.bytes / es;
    auto issue = [&]() -> Status {
      switch (c.op) {
        case comm::CollectiveOp::kAllReduce:
          return comm.all_reduce(send.data(), recv.data(), count, dtype, comm::ReduceOp::kSum, stream);
        case comm::CollectiveOp::kAllGather:
          return comm.all_gather(send.data(), recv.data(), count, dtype, stream);
        case comm::CollectiveOp::kReduceScatter:
          return comm.reduce_scatter(send.data(), recv.data(), count, dtype, comm::ReduceOp::kSum, stream);
        case comm::CollectiveOp::kBroadcast:
          return comm.broadcast(send.data(), count, dtype, 0, stream);
        case comm::CollectiveOp::kBarrier:
          return comm.barrier(stream);
      }
      return Status::internal("unknown op");
    };
    TZ_RETURN_IF_ERROR(issue());  // warm-up
    std::vector<double> times_us;
    comm.reset_counters();
    for (int rep = 0; rep < opts.repeats; ++rep) {
      TZ_RETURN_IF_ERROR(comm.barrier(stream));
      TZ_RETURN_IF_ERROR(stream.synchronize());
      const auto t0 = Clock::now();
      for (int i = 0; i < opts.iters; ++i) TZ_RETURN_IF_ERROR(issue());
      TZ_RETURN_IF_ERROR(stream.synchronize());
      times_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                         opts.iters);
    }
    TZ_RETURN_IF_ERROR(comm.async_error());
    const double t = median(times_us);
    const std::size_t moved = per_rank ? count * es * static_cast<std::size_t>(n) : count * es;
    const double algbw = static_cast<double>(moved) / (t * 1e-6) / 1e9;
    const comm::OpCounters counters = comm.counters()[c.op];
    rows.push_back({c, count, t, algbw, algbw * bus_factor(c.op, n),
                    counters.calls ? counters.bytes_sent / counters.calls : 0});
  }
  if (comm.rank() != 0) rows.clear();
  return rows;
}

int fail(const Status& st) { return report_failure("bench comm", st); }

// The options resolved: backend, device, dtype and the (op, size) cases.
struct CommSetup {
  comm::CommBackend backend = comm::CommBackend::kAuto;
  gpu::DeviceChoice device;
  DType dtype = DType::kF32;
  std::uint64_t max_bytes = 0;
  std::vector<Case> cases;
};

Result<std::vector<comm::CollectiveOp>> parse_ops(const std::string& list) {
  std::vector<comm::CollectiveOp> ops;
  std::stringstream ss(list);
  std::string name;
  while (std::getline(ss, name, ',')) {
    bool found = false;
    for (auto op : {comm::CollectiveOp::kAllReduce, comm::CollectiveOp::kAllGather,
                    comm::CollectiveOp::kReduceScatter, comm::CollectiveOp::kBroadcast}) {
      if (comm::collective_op_name(op) == name) ops.push_back(op), found = true;
    }
    if (!found) return Status::invalid_argument("--ops: unknown op '" + name + "'");
  }
  return ops;
}

Result<CommSetup> parse(const CommOptions& opts) {
  auto backend = comm::parse_comm_backend(opts.backend);
  auto choice = gpu::parse_device_choice(opts.device);
  auto min_b = parse_size(opts.min_bytes);
  auto max_b = parse_size(opts.max_bytes);
  auto dtype = parse_dtype(opts.dtype);
  if (!backend.is_ok() || !choice.is_ok() || !min_b.is_ok() || !max_b.is_ok() || !dtype ||
      *min_b == 0 || *min_b > *max_b || opts.factor < 2) {
    return Status::invalid_argument(
        "bad option (backend auto|local|mpi|nccl, device auto|host|cuda, "
        "0 < --min-bytes <= --max-bytes, --factor >= 2, dtype fp32|bf16|fp16)");
  }
  TZ_ASSIGN_OR_RETURN(std::vector<comm::CollectiveOp> ops, parse_ops(opts.ops));
  CommSetup setup{*backend, *choice, *dtype, *max_b, {}};
  for (auto op : ops) {
    for (std::uint64_t b = *min_b; b <= *max_b; b *= static_cast<std::uint64_t>(opts.factor)) {
      setup.cases.push_back({op, b});
    }
  }
  return setup;
}

// What the ranks measured: rank 0's rows, the world and the backend's name; `printing` is
// false on the other ranks of a launched run.
struct CommRun {
  std::vector<Row> rows;
  int world = 1;
  std::string backend_name;
  bool printing = true;
  bool failed = false;  // a rank other than 0 failed (rank 0 returns the error)
};

// LocalComm: --ranks ranks as threads of this process, each on a stream of its own.
Result<CommRun> run_local(const CommOptions& opts, const CommSetup& setup, gpu::Device& dev) {
  if (opts.ranks < 1 || opts.ranks > 256) {
    return Status::invalid_argument("--ranks must be in [1, 256]");
  }
  TZ_ASSIGN_OR_RETURN(auto group, comm::LocalComm::create_group(opts.ranks));
  CommRun run{{}, opts.ranks, "local", true, false};
  Status failure;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < opts.ranks; ++r) {
    threads.emplace_back([&, r] {
      Status st;
      auto stream = dev.create_stream("comm" + std::to_string(r));
      if (stream.is_ok()) {
        auto out = run_rank(*group[static_cast<std::size_t>(r)], dev, **stream, setup.cases,
                            setup.dtype, opts);
        if (out.is_ok() && r == 0) run.rows = std::move(*out);
        if (!out.is_ok()) st = std::move(out).take_status();
      } else {
        st = stream.status();
      }
      if (!st.is_ok()) {
        std::lock_guard lock(mu);
        if (failure.is_ok()) failure = st;
      }
    });
  }
  for (auto& t : threads) t.join();
  TZ_RETURN_IF_ERROR(failure);
  return run;
}

// One rank of a launched run (MPI or NCCL): this process's rank.
Result<CommRun> run_launched(const CommOptions& opts, const CommSetup& setup, gpu::Device& dev) {
  TZ_ASSIGN_OR_RETURN(auto c, comm::open_comm(dev, setup.backend));
  CommRun run{{}, c->world_size(), std::string(c->backend()), c->rank() == 0, false};
  TZ_ASSIGN_OR_RETURN(auto stream, dev.create_stream("comm"));
  Result<std::vector<Row>> rows = run_rank(*c, dev, *stream, setup.cases, setup.dtype, opts);
  if (!rows.is_ok() && run.printing) return rows.status();
  // The other ranks exit 1 without a message of their own: rank 0 reports.
  run.failed = !rows.is_ok();
  if (rows.is_ok()) run.rows = std::move(rows).value();
  return run;
}

void report(const CommOptions& opts, const CommSetup& setup, gpu::Device& dev,
            const CommRun& run) {
  // Single-thread memcpy of the largest message: the in-run ceiling for CPU collectives.
  const double peer = dev.kind() == gpu::DeviceKind::kHost
                          ? median(memcpy_gbps_samples(setup.max_bytes, 4))
                          : 0;
  BenchReport out(opts.json);
  out.text(cell("bench comm: backend %s, %d ranks, %s, %s; median of %d x %d iterations",
                run.backend_name.c_str(), run.world, dev.name().c_str(),
                std::string(dtype_name(setup.dtype)).c_str(), opts.repeats, opts.iters));
  out.table({{"op", 15, true},
             {"bytes", 12},
             {"count", 12},
             {"time_us", 12},
             {"algbw GB/s", 12},
             {"busbw GB/s", 12}});
  for (const Row& r : run.rows) {
    json j;
    j["bench"] = "comm";
    j["backend"] = run.backend_name;
    j["device"] = dev.name();
    j["op"] = comm::collective_op_name(r.c.op);
    j["ranks"] = run.world;
    j["dtype"] = dtype_name(setup.dtype);
    j["bytes"] = r.c.bytes;
    j["count"] = r.count;
    j["iters"] = opts.iters;
    j["repeats"] = opts.repeats;
    j["time_us_median"] = r.time_us;
    j["algbw_gbps"] = r.algbw_gbps;
    j["busbw_gbps"] = r.busbw_gbps;
    j["bytes_sent_per_op_rank0"] = r.bytes_sent_per_op;
    if (peer > 0) {
      j["peer"] = "single-thread memcpy";
      j["peer_gbps"] = peer;
      j["busbw_fraction_of_peer"] = r.busbw_gbps / peer;
    }
    j["machine"] = machine_json();
    out.result(j, {std::string(comm::collective_op_name(r.c.op)), cell("%zu", r.c.bytes),
                   cell("%zu", r.count), cell("%.1f", r.time_us), cell("%.3f", r.algbw_gbps),
                   cell("%.3f", r.busbw_gbps)});
  }
  if (peer > 0) out.text(cell("peer: single-thread memcpy %.2f GB/s", peer));
}

// parse -> build (device, communicators) -> measure -> report (rank 0).
int run(const CommOptions& opts) {
  Result<CommSetup> setup = parse(opts);
  if (!setup.is_ok()) return fail(setup.status());
  gpu::DeviceOptions dopts;
  dopts.choice = setup->device;
  auto device = gpu::open_device(dopts);
  if (!device.is_ok()) return fail(device.status());
  gpu::Device& dev = **device;
  const bool local = setup->backend == comm::CommBackend::kLocal ||
                     (setup->backend == comm::CommBackend::kAuto &&
                      dev.kind() == gpu::DeviceKind::kHost &&
                      comm::detect_launch_env().world_size == 1);
  Result<CommRun> run = local ? run_local(opts, *setup, dev) : run_launched(opts, *setup, dev);
  if (!run.is_ok()) return fail(run.status());
  if (!run->printing) return run->failed ? 1 : 0;
  report(opts, *setup, dev, *run);
  return 0;
}

}  // namespace

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* bench = tree.group("bench", "Measure the offload path");
  CLI::App* cmd = bench->add_subcommand(
      "comm", "Collective time, algorithm and bus bandwidth per op and size (nccl-tests style)");
  auto opts = std::make_shared<CommOptions>();
  cmd->add_option("--backend", opts->backend,
                  "auto, local (ranks as threads), mpi or nccl (one rank per process)")
      ->capture_default_str();
  cmd->add_option("--device", opts->device, "auto, host or cuda")->capture_default_str();
  cmd->add_option("--ranks", opts->ranks, "Ranks (threads) for the local backend")
      ->capture_default_str();
  cmd->add_option("--min-bytes", opts->min_bytes, "Smallest message")->capture_default_str();
  cmd->add_option("--max-bytes", opts->max_bytes, "Largest message")->capture_default_str();
  cmd->add_option("--factor", opts->factor, "Size multiplier between steps")->capture_default_str();
  cmd->add_option("--iters", opts->iters, "Operations per timed repeat")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--repeats", opts->repeats, "Timed repeats (median reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--ops", opts->ops, "Comma-separated collectives")->capture_default_str();
  cmd->add_option("--dtype", opts->dtype, "fp32, bf16 or fp16")->capture_default_str();
  cmd->add_flag("--json", opts->json, "One JSON object per result");
  cmd->callback([opts] { exit_code() = run(*opts); });
});

}  // namespace tz::cli
