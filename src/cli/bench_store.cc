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
#include "gpu/select.h"
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

// The ceilings of the run: the disk (before the walk) and the host<->device copies.
struct RawBandwidth : DiskCeiling, CopyCeiling {};

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
double add_bounds(nlohmann::json& j, const RawBandwidth& raw, const DiskCeiling& after_raw,
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

// The table of steps (human form).
void step_table(BenchReport& report) {
  report.table({{"step", 5, true},
                {"policy", 6, true},
                {"step_s", 8},
                {"bound_s", 8},
                {"ratio", 8},
                {"vs_serial", 9},
                {"stall", 9},
                {"nvme_rd", 9},
                {"nvme_wr", 10},
                {"rd GB/s", 9},
                {"wr GB/s", 9},
                {"h2d GB/s", 9}});
}

// One step's result: its JSON line, or its row of the table.
void report_step(const BenchReport& report, const nlohmann::json& j, const BenchStoreOptions& o) {
  const double rd = j["nvme_read_bytes"].get<double>();
  const double wr = j["nvme_write_bytes"].get<double>();
  const double h2d = j["h2d_bytes"].get<double>();
  const double step_s = j["step_s"].get<double>();
  const double bound_s = j["bound_s"].get<double>();
  report.result(j, {cell("%d", j["step"].get<int>()), o.policy, cell("%.2f", step_s),
                    cell("%.2f", bound_s), cell("%.3f", step_s / bound_s),
                    cell("%.3f", j["step_over_serial_bound"].get<double>()),
                    cell("%.1f%%", 100.0 * j["stall_fraction"].get<double>()), format_bytes(rd),
                    format_bytes(wr), cell("%.2f", rd / step_s / 1e9),
                    cell("%.2f", wr / step_s / 1e9), cell("%.2f", h2d / step_s / 1e9)});
}

// Steps 2.. together: a write that an early write-back issues near the end of one step completes
// (and is counted) in the next, so single steps' byte counts and bounds swing with it; the sums
// over the steps that follow the trace do not.
void report_summary(const BenchReport& report, const std::vector<nlohmann::json>& results,
                    double raw_change, const BenchStoreOptions& o) {
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
  report.record(nlohmann::json{{"bench", "store"},
                               {"policy", o.policy},
                               {"summary", "steps " + steps},
                               {"step_s", step_sum / n},
                               {"bound_s", bound_sum / n},
                               {"step_over_bound", step_sum / bound_sum},
                               {"raw_change", raw_change},
                               {"stall_fraction", stall_sum / step_sum},
                               {"nvme_read_bytes", rd_sum / n},
                               {"nvme_write_bytes", wr_sum / n}});
  report.text(cell("steps %s: %.2f s per step, bound %.2f s, ratio %.3f, stall %.1f%%, NVMe %s "
                   "read and %s written per step",
                   steps.c_str(), step_sum / n, bound_sum / n, step_sum / bound_sum,
                   100.0 * stall_sum / step_sum, format_bytes(rd_sum / n).c_str(),
                   format_bytes(wr_sum / n).c_str()));
}

// The options in numbers.
struct Sizes {
  std::uint64_t model = 0;
  std::uint64_t device_budget = 0;
  std::uint64_t host_budget = 0;
  std::uint64_t chunk = 0;
  std::uint64_t in_flight = 0;
  std::uint64_t layer_bytes = 0;  // one layer's block, a 4 KiB multiple
  store::Policy policy = store::Policy::kTrace;
};

Result<Sizes> parse(const BenchStoreOptions& o) {
  Sizes z;
  TZ_ASSIGN_OR_RETURN(z.model, parse_size(o.model_bytes));
  TZ_ASSIGN_OR_RETURN(z.device_budget, parse_size(o.device_budget));
  TZ_ASSIGN_OR_RETURN(z.host_budget, parse_size(o.host_budget));
  TZ_ASSIGN_OR_RETURN(z.chunk, parse_size(o.chunk));
  TZ_ASSIGN_OR_RETURN(z.in_flight, parse_size(o.in_flight));
  if (o.layers <= 0 || o.steps <= 0) {
    return Status::invalid_argument("--layers and --steps must be positive");
  }
  TZ_ASSIGN_OR_RETURN(z.policy, store::parse_policy(o.policy));
  z.layer_bytes = (z.model / static_cast<std::uint64_t>(o.layers)) / 4096 * 4096;
  if (z.layer_bytes == 0) {
    return Status::invalid_argument("--model-bytes is too small for --layers");
  }
  if (z.layer_bytes > z.device_budget) {
    return Status::invalid_argument("one layer (" +
                                    format_bytes(static_cast<double>(z.layer_bytes)) +
                                    ") does not fit the device budget");
  }
  return z;
}

Result<std::unique_ptr<gpu::Device>> open_bench_device(const BenchStoreOptions& o,
                                                       const Sizes& z) {
  gpu::DeviceOptions dopt;
  TZ_ASSIGN_OR_RETURN(dopt.choice, gpu::parse_device_choice(o.device));
  dopt.budget_bytes = z.device_budget + z.layer_bytes;  // room for the copy-bandwidth probe buffer
  return gpu::open_device(dopt);
}

// The pool (registered with the device) and the swap space's engine and queue; the store comes
// after the disk's own throughput is measured.
store::StackDescription describe_stack(const BenchStoreOptions& o, const Sizes& z) {
  store::StackDescription sd;
  sd.pool.slab_bytes =
      std::min<std::uint64_t>(1ull << 30, std::max<std::uint64_t>(256ull << 20, z.layer_bytes));
  sd.pool.budget_bytes = z.host_budget + static_cast<std::uint64_t>(o.staging) * z.chunk +
                         2 * z.layer_bytes + z.in_flight + sd.pool.slab_bytes;
  store::SwapDescription& sw = sd.swap.emplace();
  sw.engine_name = o.engine;
  sw.swap.paths = o.nvme_paths;
  sw.swap.bytes_per_path = (z.model + z.layer_bytes * 4) / o.nvme_paths.size() + (64ull << 20);
  sw.queue_options.block_bytes = std::min<std::uint64_t>(z.chunk, 1ull << 20);
  sw.queue_options.depth_per_file = 64;
  sw.engine_options.queue_depth = 64;
  return sd;
}

// The store's options; --io-grouping auto groups reads and writes only when mixing them costs
// the disk throughput (measured: mixed below 80% of the slower direction alone).
store::StoreOptions store_options(const BenchStoreOptions& o, const Sizes& z,
                                  const DiskCeiling& disk, std::string* grouping) {
  store::StoreOptions so;
  so.device_budget_bytes = z.device_budget;
  so.host_budget_bytes = z.host_budget;
  so.policy = z.policy;
  so.chunk_bytes = z.chunk;
  so.staging_buffers = static_cast<std::uint32_t>(o.staging);
  so.read_ahead_buffers =
      static_cast<std::uint32_t>(o.read_ahead >= 0 ? o.read_ahead : o.staging / 2);
  so.max_io_in_flight_bytes = z.in_flight;
  so.host_prefetch_depth = o.host_prefetch_depth;
  *grouping = o.io_grouping;
  if (*grouping == "auto") {
    *grouping =
        disk.mixed_gbps < 0.8 * std::min(disk.read_gbps, disk.write_gbps) ? "grouped" : "mixed";
  }
  so.io_grouping = *grouping == "mixed" ? store::IoGrouping::kMixed : store::IoGrouping::kGrouped;
  return so;
}

// Makes the layers' blocks and writes every layer once (step 0: write-only pins, no loads), so
// the disk holds real bytes.
Result<std::vector<store::BlockId>> write_layers(store::Store& s, int layers,
                                                 std::uint64_t layer_bytes) {
  std::vector<store::BlockId> ids;
  for (int i = 0; i < layers; ++i) {
    TZ_ASSIGN_OR_RETURN(store::BlockId id, s.create_block(layer_bytes, store::Tier::kNvme,
                                                          "layer" + std::to_string(i)));
    ids.push_back(id);
  }
  for (int i = 0; i < layers; ++i) {
    TZ_ASSIGN_OR_RETURN(store::Lease l, s.pin(ids[static_cast<std::size_t>(i)], store::Tier::kHost,
                                              store::Access::kWrite));
    TZ_RETURN_IF_ERROR(l.wait());
    std::memset(l.data(), i & 0xff, layer_bytes);
  }
  TZ_RETURN_IF_ERROR(s.drain());
  s.mark_step();
  return ids;
}

// What one walk needs besides the store: the fields every step's line repeats.
struct WalkContext {
  const BenchStoreOptions& o;
  const Sizes& z;
  const RawBandwidth& raw;
  std::string grouping;
  std::string engine;
  std::string device;
};

// One step's line from the store's counters before and after it.
nlohmann::json step_record(const WalkContext& c, int step, double step_s, double stall_s,
                           const nlohmann::json& long_stalls, const store::StoreStats& before,
                           const store::StoreStats& after) {
  auto link = [&](store::Link l) {
    return static_cast<double>(after.link(l).bytes - before.link(l).bytes);
  };
  const double rd = static_cast<double>(after.nvme_read_bytes() - before.nvme_read_bytes());
  const double wr = static_cast<double>(after.nvme_write_bytes() - before.nvme_write_bytes());
  nlohmann::json links;
  for (std::size_t li = 0; li < store::kLinkCount; ++li) {
    const auto l = static_cast<store::Link>(li);
    const double busy = after.link(l).busy_s - before.link(l).busy_s;
    links[store::link_name(l)] = {{"bytes", link(l)},
                                  {"busy_gbps", busy > 0 ? link(l) / busy / 1e9 : 0.0}};
  }
  return {
      {"bench", "store"},
      {"policy", c.o.policy},
      {"step", step},
      {"layers", c.o.layers},
      {"layer_bytes", c.z.layer_bytes},
      {"model_bytes", c.z.layer_bytes * static_cast<std::uint64_t>(c.o.layers)},
      {"device_budget_bytes", c.z.device_budget},
      {"host_budget_bytes", c.z.host_budget},
      {"compute_ms_per_layer", c.o.compute_ms_per_layer},
      {"step_s", step_s},
      {"compute_s", 2.0 * c.o.layers * c.o.compute_ms_per_layer / 1000.0},
      {"stall_s", stall_s},
      {"stall_fraction", stall_s / step_s},
      {"nvme_read_bytes", rd},
      {"nvme_write_bytes", wr},
      {"nvme_read_gbps", rd / step_s / 1e9},
      {"nvme_write_gbps", wr / step_s / 1e9},
      {"h2d_bytes", link(store::Link::kHostToDevice) + link(store::Link::kNvmeToDevice)},
      {"d2h_bytes", link(store::Link::kDeviceToHost) + link(store::Link::kDeviceToNvme)},
      {"read_ahead_bytes", after.read_ahead_bytes - before.read_ahead_bytes},
      {"read_ahead_dropped_bytes", after.read_ahead_dropped_bytes - before.read_ahead_dropped_bytes},
      {"links", links},
      {"raw_read_gbps", c.raw.read_gbps},
      {"raw_write_gbps", c.raw.write_gbps},
      {"raw_mixed_gbps", c.raw.mixed_gbps},
      {"raw_h2d_gbps", c.raw.h2d_gbps},
      {"raw_d2h_gbps", c.raw.d2h_gbps},
      {"io_grouping", c.grouping},
      {"engine", c.engine},
      {"device", c.device},
      {"peak_device_bytes", after.tier(store::Tier::kDevice).peak_bytes},
      {"peak_host_bytes", after.tier(store::Tier::kHost).peak_bytes},
      {"trace_deviations", after.trace_deviations - before.trace_deviations},
      {"long_stalls", long_stalls},
      {"machine", machine_json()},
  };
}

// The timed steps: each walks the layers forward and backward (store/walk.h), each visit pinning
// the layer on the device for the synthetic compute time. One line per step, bounds added later.
Result<std::vector<nlohmann::json>> walk(const WalkContext& c, store::Store& s,
                                         const std::vector<store::BlockId>& ids) {
  const auto compute =
      std::chrono::microseconds(static_cast<long>(c.o.compute_ms_per_layer * 1000));
  double stall_total = 0;
  nlohmann::json long_stalls = nlohmann::json::array();  // visits that waited over 10 ms
  Trace& trace = Trace::global();
  auto visit = [&](const store::Visit& v) -> Status {
    const int i = v.layer;
    const double t0 = now_s();
    const double t0_us = trace.now_us();
    TZ_ASSIGN_OR_RETURN(store::Lease l,
                        s.pin(ids[static_cast<std::size_t>(i)], store::Tier::kDevice, v.access));
    TZ_RETURN_IF_ERROR(l.wait());
    const double waited = now_s() - t0;
    stall_total += waited;
    if (waited > 0.010) {
      long_stalls.push_back({{"pass", store::pass_name(v.pass)}, {"layer", i}, {"ms", waited * 1e3}});
    }
    if (compute.count() > 0) std::this_thread::sleep_for(compute);
    l.release();
    if (trace.enabled()) {
      trace.span("bench walk", std::string(store::pass_name(v.pass)) + " layer " + std::to_string(i),
                 t0_us, trace.now_us());
    }
    return Status::ok();
  };
  std::vector<nlohmann::json> results;
  for (int step = 1; step <= c.o.steps; ++step) {
    const store::StoreStats before = s.stats();
    stall_total = 0;
    long_stalls = nlohmann::json::array();
    const double t0 = now_s();
    const double step_us = trace.now_us();
    TZ_RETURN_IF_ERROR(store::walk_step(c.o.layers, visit));
    s.mark_step();
    const double step_s = now_s() - t0;
    if (trace.enabled()) {
      trace.span("bench steps", "step " + std::to_string(step), step_us, trace.now_us());
    }
    results.push_back(step_record(c, step, step_s, stall_total, long_stalls, before, s.stats()));
  }
  TZ_RETURN_IF_ERROR(s.drain());
  return results;
}

std::string raw_line(const RawBandwidth& raw, const std::string& engine) {
  return cell("raw: disk read %s, write %s, mixed %s; h2d %s, d2h %s (engine %s)",
              format_rate(raw.read_gbps * 1e9).c_str(), format_rate(raw.write_gbps * 1e9).c_str(),
              format_rate(raw.mixed_gbps * 1e9).c_str(), format_rate(raw.h2d_gbps * 1e9).c_str(),
              format_rate(raw.d2h_gbps * 1e9).c_str(), engine.c_str());
}

// The steps with their bounds (from the means of the disk measured before and after the walk:
// the machine is shared), the summary, and how far the bound would move with either measurement
// alone (`raw_change`: how uncertain it is when the disk's own speed drifted during the run).
void report_steps(BenchReport& report, const BenchStoreOptions& o,
                  std::vector<nlohmann::json>& results, const RawBandwidth& raw,
                  const DiskCeiling& after_raw) {
  step_table(report);
  const double compute_s = 2.0 * o.layers * o.compute_ms_per_layer / 1000.0;
  double raw_change = 0;
  for (nlohmann::json& j : results) {
    raw_change = std::max(raw_change, add_bounds(j, raw, after_raw, compute_s));
    report_step(report, j, o);
  }
  report_summary(report, results, raw_change, o);
  if (raw_change > 0.15) {
    TZ_LOG_WARN("bench store: the disk's speed drifted during the run: the bound from the raw "
                "measurement before the walk and the one from after it differ by %.0f%%, so the "
                "ratios (against their mean) are uncertain by about as much",
                100 * raw_change);
  }
  report.text(cell("raw after: disk read %s, write %s, mixed %s (bound uses the means: the faster "
                   "of serial and mixed for each step's mix)",
                   format_rate(after_raw.read_gbps * 1e9).c_str(),
                   format_rate(after_raw.write_gbps * 1e9).c_str(),
                   format_rate(after_raw.mixed_gbps * 1e9).c_str()));
}

// Everything after parsing: build the stack, measure the ceilings, open the store, walk,
// measure the disk again (the store and its swap space gone), report.
Status run_bench(const BenchStoreOptions& o, const Sizes& z, BenchReport& report) {
  if (!o.trace_out.empty()) Trace::global().enable();
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Device> device, open_bench_device(o, z));
  TZ_ASSIGN_OR_RETURN(store::TieredStack stack, store::prepare_stack(describe_stack(o, z), *device));
  RawBandwidth raw;
  TZ_ASSIGN_OR_RETURN(static_cast<DiskCeiling&>(raw),
                      measure_stack_disk(stack, z.model, z.chunk, z.in_flight));
  TZ_ASSIGN_OR_RETURN(static_cast<CopyCeiling&>(raw),
                      measure_stack_copies(stack, *device, z.layer_bytes));
  report.text(raw_line(raw, stack.io_engine));
  WalkContext c{o, z, raw, "", stack.io_engine, device->name()};
  TZ_RETURN_IF_ERROR(store::open_store(stack, store_options(o, z, raw, &c.grouping), *device));
  TZ_ASSIGN_OR_RETURN(std::vector<store::BlockId> ids, write_layers(*stack.store, o.layers, z.layer_bytes));
  TZ_ASSIGN_OR_RETURN(std::vector<nlohmann::json> results, walk(c, *stack.store, ids));
  if (!o.trace_out.empty()) TZ_RETURN_IF_ERROR(Trace::global().write(o.trace_out));
  stack.store.reset();  // its swap space goes before the disk is measured again
  TZ_ASSIGN_OR_RETURN(DiskCeiling after_raw, measure_stack_disk(stack, z.model, z.chunk, z.in_flight));
  report_steps(report, o, results, raw, after_raw);
  return Status::ok();
}

int run(const BenchStoreOptions& o) {
  Result<Sizes> z = parse(o);
  if (!z) return fail(z.status());
  BenchReport report(o.json);
  if (Status st = run_bench(o, *z, report); !st.is_ok()) return fail(st);
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
