// `tierzero bench store`: walks a layered model forward and backward through the tiered store as
// stage-3 training does (store/walk.h; each layer's parameter shard pinned on the device for a
// synthetic compute time; backward rewrites it, standing for the gradient and updated parameters
// an offloaded step writes home), and reports per step the achieved bandwidth per link, the stall
// fraction, bytes per tier and the lower bound from the disk's raw throughput measured in the
// same run.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "core/log.h"
#include "core/trace.h"
#include "core/units.h"
#include "cpu/pinned_pool.h"
#include "gpu/select.h"
#include "nvme/io_engine.h"
#include "nvme/swap_space.h"
#include "store/pool_registration.h"
#include "store/stack.h"
#include "store/store.h"
#include "store/walk.h"

namespace tz::cli {
namespace {

struct BenchStoreOptions {
  std::string model_bytes = "8G";
  int layers = 32;
  std::string device_budget = "1G";
  std::string host_budget = "2G";
  std::vector<std::string> nvme_paths;
  double compute_ms_per_layer = 0;
  int steps = 4;
  std::string policy = "trace";
  std::string engine = "auto";
  std::string chunk = "8M";
  int staging = 32;
  int read_ahead = -1;  // staging buffers for read ahead; -1: half of --staging
  std::string in_flight = "128M";
  std::string io_grouping = "auto";
  std::uint32_t host_prefetch_depth = store::StoreOptions{}.host_prefetch_depth;
  std::string device = "auto";
  std::string trace_out;
  bool json = false;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int fail(const Status& st) { return report_failure("bench store", st); }

struct RawBandwidth {
  double read_gbps = 0;
  double write_gbps = 0;
  double mixed_gbps = 0;  // reads and writes at once, both directions together
  double h2d_gbps = 0;
  double d2h_gbps = 0;
};

// The disk's time for a step's reads and writes at the given raw speeds, by the faster schedule
// measured: one direction after the other (serial), or the bytes that pair up as concurrent
// reads and writes at the mixed rate and the rest alone (mixed). The bound takes the faster, so
// it never credits the store for a schedule the disk would have run slower.
struct NvmeTime {
  double serial_s;
  double mixed_s;
  double best_s() const { return std::min(serial_s, mixed_s); }
};

NvmeTime nvme_time(double rd, double wr, double read_gbps, double write_gbps, double mixed_gbps) {
  const double serial_s = rd / (read_gbps * 1e9) + wr / (write_gbps * 1e9);
  const double paired = std::min(rd, wr);
  const double mixed_s = mixed_gbps > 0 ? 2 * paired / (mixed_gbps * 1e9) +
                                              (rd - paired) / (read_gbps * 1e9) +
                                              (wr - paired) / (write_gbps * 1e9)
                                        : serial_s;
  return NvmeTime{serial_s, mixed_s};
}

// Adds one step's bounds to its JSON line from the disk measured before (`raw`) and after the
// walk (their mean), the copy ceilings and the compute time; returns how far the disk's bound
// moves between the two measurements (relative).
double add_bounds(nlohmann::json& j, const RawBandwidth& raw, const RawBandwidth& after_raw,
                  double compute_s) {
  const double rd = j["nvme_read_bytes"].get<double>();
  const double wr = j["nvme_write_bytes"].get<double>();
  const double h2d = j["h2d_bytes"].get<double>();
  const double d2h = j["d2h_bytes"].get<double>();
  const double step_s = j["step_s"].get<double>();
  const NvmeTime t = nvme_time(rd, wr, (raw.read_gbps + after_raw.read_gbps) / 2,
                               (raw.write_gbps + after_raw.write_gbps) / 2,
                               (raw.mixed_gbps + after_raw.mixed_gbps) / 2);
  const double before_s = nvme_time(rd, wr, raw.read_gbps, raw.write_gbps, raw.mixed_gbps).best_s();
  const double after_s =
      nvme_time(rd, wr, after_raw.read_gbps, after_raw.write_gbps, after_raw.mixed_gbps).best_s();
  const double change = std::min(before_s, after_s) > 0
                            ? std::abs(after_s - before_s) / std::min(before_s, after_s)
                            : 0.0;
  const double serial_s = t.serial_s;
  const double mixed_s = t.mixed_s;
  const double nvme_s = t.best_s();
  const double bound_s = std::max({compute_s, nvme_s, h2d / (raw.h2d_gbps * 1e9),
                                    d2h / (raw.d2h_gbps * 1e9)});
  j["bound_s"] = bound_s;
  j["nvme_bound_s"] = nvme_s;
  j["nvme_serial_s"] = serial_s;
  j["nvme_mixed_s"] = mixed_s;
  j["step_over_serial_bound"] = step_s / std::max({compute_s, serial_s, h2d / (raw.h2d_gbps * 1e9),
                                                   d2h / (raw.d2h_gbps * 1e9)});
  j["step_over_bound"] = step_s / bound_s;
  j["raw_read_gbps_after"] = after_raw.read_gbps;
  j["raw_write_gbps_after"] = after_raw.write_gbps;
  j["raw_mixed_gbps_after"] = after_raw.mixed_gbps;
  j["raw_change"] = change;
  return change;
}

// One step's line: JSON, or a row of the table.
void print_step(const nlohmann::json& j, const BenchStoreOptions& o) {
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  const double rd = j["nvme_read_bytes"].get<double>();
  const double wr = j["nvme_write_bytes"].get<double>();
  const double h2d = j["h2d_bytes"].get<double>();
  const double step_s = j["step_s"].get<double>();
  const double bound_s = j["bound_s"].get<double>();
  std::printf("%-5d %-6s %8.2f %8.2f %8.3f %9.3f %8.1f%% %9s %10s %9.2f %9.2f %9.2f\n",
              j["step"].get<int>(), o.policy.c_str(), step_s, bound_s, step_s / bound_s,
              j["step_over_serial_bound"].get<double>(),
              100.0 * j["stall_fraction"].get<double>(), format_bytes(rd).c_str(),
              format_bytes(wr).c_str(), rd / step_s / 1e9, wr / step_s / 1e9, h2d / step_s / 1e9);
}

// Steps 2.. together: a write that an early write-back issues near the end of one step completes
// (and is counted) in the next, so single steps' byte counts and bounds swing with it; the sums
// over the steps that follow the trace do not.
void print_summary(const std::vector<nlohmann::json>& results, double raw_change,
                   const BenchStoreOptions& o) {
  if (results.size() <= 1) return;
  double step_sum = 0;
  double bound_sum = 0;
  double stall_sum = 0;
  double rd_sum = 0;
  double wr_sum = 0;
  for (std::size_t i = 1; i < results.size(); ++i) {
    const nlohmann::json& j = results[i];
    step_sum += j["step_s"].get<double>();
    bound_sum += j["bound_s"].get<double>();
    stall_sum += j["stall_s"].get<double>();
    rd_sum += j["nvme_read_bytes"].get<double>();
    wr_sum += j["nvme_write_bytes"].get<double>();
  }
  const double n = static_cast<double>(results.size() - 1);
  const std::string steps = "2-" + std::to_string(results.size());
  if (o.json) {
    nlohmann::json sum = {{"bench", "store"},
                          {"policy", o.policy},
                          {"summary", "steps " + steps},
                          {"step_s", step_sum / n},
                          {"bound_s", bound_sum / n},
                          {"step_over_bound", step_sum / bound_sum},
                          {"raw_change", raw_change},
                          {"stall_fraction", stall_sum / step_sum},
                          {"nvme_read_bytes", rd_sum / n},
                          {"nvme_write_bytes", wr_sum / n}};
    std::printf("%s\n", sum.dump().c_str());
  } else {
    std::printf("steps %s: %.2f s per step, bound %.2f s, ratio %.3f, stall %.1f%%, NVMe %s read and "
                "%s written per step\n",
                steps.c_str(), step_sum / n, bound_sum / n, step_sum / bound_sum,
                100.0 * stall_sum / step_sum, format_bytes(rd_sum / n).c_str(),
                format_bytes(wr_sum / n).c_str());
  }
}

// Sequential O_DIRECT throughput of the swap space itself over `bytes`, the same chunking and
// bytes in flight the store uses: what the disk gives with nothing else in the way.
Status measure_disk(nvme::SwapSpace& swap, PinnedPool& pool, std::uint64_t bytes,
                    std::uint64_t chunk, std::uint64_t in_flight, RawBandwidth* out) {
  const std::uint64_t n_bufs = std::max<std::uint64_t>(1, in_flight / chunk);
  std::vector<PinnedBuffer> bufs;
  for (std::uint64_t i = 0; i < n_bufs; ++i) {
    TZ_ASSIGN_OR_RETURN(PinnedBuffer b, pool.allocate(chunk));
    std::memset(b.data(), static_cast<int>(0x5a + i), chunk);
    bufs.push_back(std::move(b));
  }
  TZ_ASSIGN_OR_RETURN(nvme::SwapExtent ext, swap.allocate(bytes));
  nvme::IoQueue& q = swap.queue();
  auto pass = [&](std::vector<nvme::IoOp> dirs, std::uint64_t len) -> Result<double> {
    // dirs[i % dirs.size()] is the direction of chunk i; chunks cycle over the buffers.
    std::vector<nvme::IoOpId> ids(bufs.size(), 0);
    const double t0 = now_s();
    const std::uint64_t count = len / chunk;
    for (std::uint64_t i = 0; i < count; ++i) {
      const std::size_t slot = i % bufs.size();
      if (ids[slot] != 0) TZ_RETURN_IF_ERROR(q.wait(ids[slot]));
      const nvme::IoOp dir = dirs[i % dirs.size()];
      // Mixed passes read the first half of the extent and write the second.
      const std::uint64_t off = dirs.size() > 1
                                    ? (dir == nvme::IoOp::kRead ? 0 : len / 2) + (i / 2) * chunk
                                    : i * chunk;
      auto tr = swap.transfers(dir, ext, off, bufs[slot].data(), chunk);
      TZ_ASSIGN_OR_RETURN(ids[slot], q.start(tr));
    }
    for (nvme::IoOpId id : ids) {
      if (id != 0) TZ_RETURN_IF_ERROR(q.wait(id));
    }
    return static_cast<double>(count * chunk) / (now_s() - t0) / 1e9;
  };
  const std::uint64_t len = bytes / chunk * chunk;
  TZ_ASSIGN_OR_RETURN(out->write_gbps, pass({nvme::IoOp::kWrite}, len));
  TZ_ASSIGN_OR_RETURN(out->read_gbps, pass({nvme::IoOp::kRead}, len));
  const std::uint64_t mixed = std::min<std::uint64_t>(len, 4ull << 30) / (2 * chunk) * (2 * chunk);
  if (mixed >= 2 * chunk) {
    TZ_ASSIGN_OR_RETURN(out->mixed_gbps, pass({nvme::IoOp::kRead, nvme::IoOp::kWrite}, mixed));
  }
  swap.free(ext);
  return Status::ok();
}

// Host <-> device copy bandwidth on the device's copy streams (memcpy on HostDevice).
Status measure_copies(gpu::Device& device, PinnedPool& pool, std::uint64_t bytes,
                      RawBandwidth* out) {
  TZ_ASSIGN_OR_RETURN(PinnedBuffer host, pool.allocate(bytes));
  TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer dev, device.allocate(bytes));
  std::memset(host.data(), 1, bytes);
  for (int dir = 0; dir < 2; ++dir) {
    gpu::Stream& s = dir == 0 ? device.h2d_stream() : device.d2h_stream();
    double best = 0;
    for (int r = 0; r < 3; ++r) {
      const double t0 = now_s();
      if (dir == 0) {
        TZ_RETURN_IF_ERROR(device.copy_async(dev.data(), host.data(), bytes,
                                             gpu::CopyKind::kHostToDevice, s));
      } else {
        TZ_RETURN_IF_ERROR(device.copy_async(host.data(), dev.data(), bytes,
                                             gpu::CopyKind::kDeviceToHost, s));
      }
      TZ_RETURN_IF_ERROR(s.synchronize());
      best = std::max(best, static_cast<double>(bytes) / (now_s() - t0) / 1e9);
    }
    (dir == 0 ? out->h2d_gbps : out->d2h_gbps) = best;
  }
  return Status::ok();
}

int run(const BenchStoreOptions& o) {
  auto model = parse_size(o.model_bytes);
  auto dev_budget = parse_size(o.device_budget);
  auto host_budget = parse_size(o.host_budget);
  auto chunk = parse_size(o.chunk);
  auto in_flight = parse_size(o.in_flight);
  for (const auto* r : {&model, &dev_budget, &host_budget, &chunk, &in_flight}) {
    if (!r->is_ok()) return fail(r->status());
  }
  if (o.layers <= 0 || o.steps <= 0) return fail(Status::invalid_argument("--layers and --steps must be positive"));
  auto policy = store::parse_policy(o.policy);
  if (!policy) return fail(policy.status());
  const std::uint64_t layer_bytes = (*model / static_cast<std::uint64_t>(o.layers)) / 4096 * 4096;
  if (layer_bytes == 0) return fail(Status::invalid_argument("--model-bytes is too small for --layers"));
  if (layer_bytes > *dev_budget) {
    return fail(Status::invalid_argument("one layer (" + format_bytes(static_cast<double>(layer_bytes)) +
                                         ") does not fit the device budget"));
  }
  if (!o.trace_out.empty()) Trace::global().enable();

  gpu::DeviceOptions dopt;
  auto choice = gpu::parse_device_choice(o.device);
  if (!choice) return fail(choice.status());
  dopt.choice = *choice;
  dopt.budget_bytes = *dev_budget + layer_bytes;  // room for the copy-bandwidth probe buffer
  auto device = gpu::open_device(dopt);
  if (!device) return fail(device.status());

  store::StackDescription sd;
  sd.pool.slab_bytes =
      std::min<std::uint64_t>(1ull << 30, std::max<std::uint64_t>(256ull << 20, layer_bytes));
  sd.pool.budget_bytes = *host_budget + static_cast<std::uint64_t>(o.staging) * *chunk +
                         2 * layer_bytes + *in_flight + sd.pool.slab_bytes;
  store::SwapDescription& sw = sd.swap.emplace();
  sw.engine_name = o.engine;
  sw.swap.paths = o.nvme_paths;
  sw.swap.bytes_per_path = (*model + layer_bytes * 4) / o.nvme_paths.size() + (64ull << 20);
  sw.queue_options.block_bytes = std::min<std::uint64_t>(*chunk, 1ull << 20);
  sw.queue_options.depth_per_file = 64;
  sw.engine_options.queue_depth = 64;
  // The pool (registered with the device) and the swap factory; the store comes after the
  // disk's own throughput is measured.
  auto stack = store::prepare_stack(sd, **device);
  if (!stack) return fail(stack.status());
  PinnedPool* pool = stack->pool.get();
  const store::Store::SwapFactory& make_swap = stack->make_swap;
  const char* engine_name = stack->io_engine.c_str();

  // The disk's own throughput over the same bytes, through a swap space of its own on this
  // thread, gone before the store makes its own.
  RawBandwidth raw;
  {
    auto swap = make_swap();
    if (!swap) return fail(swap.status());
    // Unregistered buffers work too (slower on io_uring); the store logs the same refusal.
    store::register_pool_with_queue((*swap)->queue(), *pool).ignore();
    if (Status st = measure_disk(**swap, *pool, *model, *chunk, *in_flight, &raw); !st.is_ok()) {
      return fail(st);
    }
  }
  if (Status st = measure_copies(**device, *pool, layer_bytes, &raw); !st.is_ok()) return fail(st);
  if (!o.json) {
    std::printf("raw: disk read %s, write %s, mixed %s; h2d %s, d2h %s (engine %s)\n",
                format_rate(raw.read_gbps * 1e9).c_str(), format_rate(raw.write_gbps * 1e9).c_str(),
                format_rate(raw.mixed_gbps * 1e9).c_str(), format_rate(raw.h2d_gbps * 1e9).c_str(),
                format_rate(raw.d2h_gbps * 1e9).c_str(), engine_name);
  }

  store::StoreOptions so;
  so.device_budget_bytes = *dev_budget;
  so.host_budget_bytes = *host_budget;
  so.policy = *policy;
  so.chunk_bytes = *chunk;
  so.staging_buffers = static_cast<std::uint32_t>(o.staging);
  so.read_ahead_buffers =
      static_cast<std::uint32_t>(o.read_ahead >= 0 ? o.read_ahead : o.staging / 2);
  so.max_io_in_flight_bytes = *in_flight;
  so.host_prefetch_depth = o.host_prefetch_depth;
  // auto: group reads and writes only when mixing them costs the disk throughput (measured
  // above: mixed below 80% of the slower direction alone).
  std::string grouping = o.io_grouping;
  if (grouping == "auto") {
    grouping = raw.mixed_gbps < 0.8 * std::min(raw.read_gbps, raw.write_gbps) ? "grouped" : "mixed";
  }
  so.io_grouping = grouping == "mixed" ? store::IoGrouping::kMixed : store::IoGrouping::kGrouped;
  if (Status st = store::open_store(*stack, so, **device); !st.is_ok()) return fail(st);
  store::Store* s = stack->store.get();

  std::vector<store::BlockId> ids;
  for (int i = 0; i < o.layers; ++i) {
    auto id = s->create_block(layer_bytes, store::Tier::kNvme, "layer" + std::to_string(i));
    if (!id) return fail(id.status());
    ids.push_back(*id);
  }
  // Step 0: write every layer once (write-only pins, no loads), so the disk holds real bytes.
  for (int i = 0; i < o.layers; ++i) {
    auto l = s->pin(ids[static_cast<std::size_t>(i)], store::Tier::kHost, store::Access::kWrite);
    if (!l) return fail(l.status());
    if (Status st = l->wait(); !st.is_ok()) return fail(st);
    std::memset(l->data(), i & 0xff, layer_bytes);
  }
  if (Status st = s->drain(); !st.is_ok()) return fail(st);
  s->mark_step();

  const auto compute = std::chrono::microseconds(static_cast<long>(o.compute_ms_per_layer * 1000));
  double stall_total = 0;
  nlohmann::json long_stalls = nlohmann::json::array();  // visits that waited over 10 ms
  Trace& trace = Trace::global();
  auto visit = [&](const store::Visit& v) -> Status {
    const int i = v.layer;
    const double t0 = now_s();
    const double t0_us = trace.now_us();
    TZ_ASSIGN_OR_RETURN(store::Lease l, s->pin(ids[static_cast<std::size_t>(i)], store::Tier::kDevice, v.access));
    TZ_RETURN_IF_ERROR(l.wait());
    const double waited = now_s() - t0;
    stall_total += waited;
    if (waited > 0.010) {
      long_stalls.push_back({{"pass", store::pass_name(v.pass)},
                             {"layer", i},
                             {"ms", waited * 1e3}});
    }
    if (compute.count() > 0) std::this_thread::sleep_for(compute);
    l.release();
    if (trace.enabled()) {
      trace.span("bench walk", std::string(store::pass_name(v.pass)) + " layer " + std::to_string(i),
                 t0_us, trace.now_us());
    }
    return Status::ok();
  };
  const double compute_s = 2.0 * o.layers * o.compute_ms_per_layer / 1000.0;
  std::vector<nlohmann::json> results;  // printed once the disk is measured again
  for (int step = 1; step <= o.steps; ++step) {
    const store::StoreStats before = s->stats();
    stall_total = 0;
    long_stalls = nlohmann::json::array();
    const double t0 = now_s();
    const double step_us = trace.now_us();
    if (Status st = store::walk_step(o.layers, visit); !st.is_ok()) return fail(st);
    s->mark_step();
    const double step_s = now_s() - t0;
    if (trace.enabled()) trace.span("bench steps", "step " + std::to_string(step), step_us, trace.now_us());
    const store::StoreStats after = s->stats();
    auto link = [&](store::Link l) {
      return static_cast<double>(after.link(l).bytes - before.link(l).bytes);
    };
    const double rd = static_cast<double>(after.nvme_read_bytes() - before.nvme_read_bytes());
    const double wr = static_cast<double>(after.nvme_write_bytes() - before.nvme_write_bytes());
    const double h2d = link(store::Link::kHostToDevice) + link(store::Link::kNvmeToDevice);
    const double d2h = link(store::Link::kDeviceToHost) + link(store::Link::kDeviceToNvme);
    nlohmann::json links;
    for (std::size_t li = 0; li < store::kLinkCount; ++li) {
      const auto l = static_cast<store::Link>(li);
      const double busy = after.link(l).busy_s - before.link(l).busy_s;
      links[store::link_name(l)] = {{"bytes", link(l)},
                                    {"busy_gbps", busy > 0 ? link(l) / busy / 1e9 : 0.0}};
    }
    nlohmann::json j = {
        {"bench", "store"},
        {"policy", o.policy},
        {"step", step},
        {"layers", o.layers},
        {"layer_bytes", layer_bytes},
        {"model_bytes", layer_bytes * static_cast<std::uint64_t>(o.layers)},
        {"device_budget_bytes", *dev_budget},
        {"host_budget_bytes", *host_budget},
        {"compute_ms_per_layer", o.compute_ms_per_layer},
        {"step_s", step_s},
        {"compute_s", compute_s},
        {"stall_s", stall_total},
        {"stall_fraction", stall_total / step_s},
        {"nvme_read_bytes", rd},
        {"nvme_write_bytes", wr},
        {"nvme_read_gbps", rd / step_s / 1e9},
        {"nvme_write_gbps", wr / step_s / 1e9},
        {"h2d_bytes", h2d},
        {"d2h_bytes", d2h},
        {"read_ahead_bytes", after.read_ahead_bytes - before.read_ahead_bytes},
        {"read_ahead_dropped_bytes",
         after.read_ahead_dropped_bytes - before.read_ahead_dropped_bytes},
        {"links", links},
        {"raw_read_gbps", raw.read_gbps},
        {"raw_write_gbps", raw.write_gbps},
        {"raw_mixed_gbps", raw.mixed_gbps},
        {"raw_h2d_gbps", raw.h2d_gbps},
        {"raw_d2h_gbps", raw.d2h_gbps},
        {"io_grouping", grouping},
        {"engine", engine_name},
        {"device", (*device)->name()},
        {"peak_device_bytes", after.tier(store::Tier::kDevice).peak_bytes},
        {"peak_host_bytes", after.tier(store::Tier::kHost).peak_bytes},
        {"trace_deviations", after.trace_deviations - before.trace_deviations},
        {"long_stalls", long_stalls},
        {"machine", machine_json()},
    };
    results.push_back(std::move(j));
  }
  if (Status st = s->drain(); !st.is_ok()) return fail(st);
  if (!o.trace_out.empty()) {
    if (Status st = Trace::global().write(o.trace_out); !st.is_ok()) return fail(st);
  }
  stack->store.reset();  // its swap space goes before the disk is measured again
  if (!o.json) {
    std::printf("%-5s %-6s %8s %8s %8s %9s %9s %9s %10s %9s %9s %9s\n", "step", "policy",
                "step_s", "bound_s", "ratio", "vs_serial", "stall", "nvme_rd", "nvme_wr", "rd GB/s", "wr GB/s", "h2d GB/s");
  }

  // The disk again, after the walk: the machine is shared, so the bound uses the mean of the
  // measurements before and after (both are reported).
  RawBandwidth after_raw;
  {
    auto swap = make_swap();
    if (!swap) return fail(swap.status());
    if (Status st = measure_disk(**swap, *pool, *model, *chunk, *in_flight, &after_raw);
        !st.is_ok()) {
      return fail(st);
    }
  }
  // The bound uses the mean of the measurements before and after the walk. How far the bound
  // would move with either one alone (`raw_change`) is how uncertain it is when the disk's own
  // speed drifted during the run.
  double raw_change = 0;
  for (nlohmann::json& j : results) {
    raw_change = std::max(raw_change, add_bounds(j, raw, after_raw, compute_s));
    print_step(j, o);
  }
  print_summary(results, raw_change, o);
  if (raw_change > 0.15) {
    TZ_LOG_WARN("bench store: the disk's speed drifted during the run: the bound from the raw "
                "measurement before the walk and the one from after it differ by %.0f%%, so the "
                "ratios (against their mean) are uncertain by about as much",
                100 * raw_change);
  }
  if (!o.json) {
    std::printf("raw after: disk read %s, write %s, mixed %s (bound uses the means: the faster of "
                "serial and mixed for each step's mix)\n",
                format_rate(after_raw.read_gbps * 1e9).c_str(),
                format_rate(after_raw.write_gbps * 1e9).c_str(),
                format_rate(after_raw.mixed_gbps * 1e9).c_str());
  }
  std::fflush(stdout);
  return 0;
}

TZ_REGISTER_COMMAND([](tz::cli::CommandTree& tree) {
  CLI::App* bench = tree.group("bench", "Measure the offload path");
  CLI::App* cmd = bench->add_subcommand(
      "store", "Walk a layered model through the tiered store (device, pinned host, NVMe) as "
               "stage-3 training does; report stalls and the bound from the raw disk speed");
  auto opts = std::make_shared<BenchStoreOptions>();
  cmd->add_option("--model-bytes", opts->model_bytes, "Parameter bytes of the model (all on NVMe)")
      ->capture_default_str();
  cmd->add_option("--layers", opts->layers, "Layers (one block each)")->capture_default_str();
  cmd->add_option("--device-budget", opts->device_budget, "Device tier budget")
      ->capture_default_str();
  cmd->add_option("--host-budget", opts->host_budget, "Pinned host tier budget")
      ->capture_default_str();
  cmd->add_option("--nvme-path", opts->nvme_paths, "Directory for the swap file (repeat to stripe)")
      ->required();
  cmd->add_option("--compute-ms-per-layer", opts->compute_ms_per_layer,
                  "Synthetic compute per layer visit")
      ->capture_default_str();
  cmd->add_option("--steps", opts->steps, "Timed steps (step 1 records the trace)")
      ->capture_default_str();
  cmd->add_option("--policy", opts->policy, "trace or lru")
      ->check(CLI::IsMember({"trace", "lru"}))
      ->capture_default_str();
  cmd->add_option("--engine", opts->engine, "auto, io_uring, libaio or psync")
      ->check(CLI::IsMember({"auto", "io_uring", "libaio", "psync"}))
      ->capture_default_str();
  cmd->add_option("--chunk", opts->chunk, "NVMe transfer and checksum unit (4 KiB multiple)")
      ->capture_default_str();
  cmd->add_option("--staging", opts->staging, "Pinned staging buffers of the NVMe<->device pipeline")
      ->capture_default_str();
  cmd->add_option("--read-ahead", opts->read_ahead,
                  "Staging buffers that may hold NVMe pieces read ahead of their device load "
                  "(default: half of --staging; 0: off)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--in-flight", opts->in_flight, "NVMe bytes in flight at most")
      ->capture_default_str();
  cmd->add_option("--io-grouping", opts->io_grouping,
                  "grouped (one direction at a time), mixed, or auto (from the raw measurement)")
      ->check(CLI::IsMember({"auto", "grouped", "mixed"}))
      ->capture_default_str();
  cmd->add_option("--host-prefetch-depth", opts->host_prefetch_depth,
                  "Device uses loaded ahead from the host tier (past them only NVMe loads start)")
      ->capture_default_str();
  cmd->add_option("--device", opts->device, "auto, host or cuda")->capture_default_str();
  cmd->add_option("--trace-out", opts->trace_out, "Write a Chrome trace of the moves and of the walk (steps, layer visits) here");
  cmd->add_flag("--json", opts->json, "One JSON object per step");
  cmd->callback([opts] { tz::cli::exit_code() = run(*opts); });
});

}  // namespace
}  // namespace tz::cli
