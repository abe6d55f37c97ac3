// `tierzero bench pins`: the cost of one store pin as the number of blocks grows (issue 14, defect
// 5). A device-only trace walk over N host-homed blocks of 4 KiB on HostDevice: step 0 records the
// trace, each timed step pins (kRead on the device), waits for and releases every block in the
// same order. With a device fraction of 1 every block fits, so a timed pin finds its block
// resident and measures the store's bookkeeping alone; below 1 the walk evicts and loads on the
// way. Reports the median over the timed steps of the mean µs per pin, per block count, and the
// ratio of the dearest to the cheapest (flat: near 1).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "cpu/pinned_pool.h"
#include "gpu/host_device.h"
#include "store/stack.h"
#include "store/store.h"

namespace tz::cli {
namespace {

using json = nlohmann::ordered_json;

constexpr std::uint64_t kBlockBytes = 4096;

struct PinsBenchOptions {
  std::vector<std::uint32_t> blocks = {500, 2000, 8000};
  double device_fraction = 1.0;
  std::uint32_t steps = 3;
  bool json = false;
};

struct PinCost {
  double median_us = 0;  // per pin: the median over the timed steps of each step's mean
  double min_us = 0;
  double max_us = 0;
  std::uint64_t device_budget = 0;
};

Result<PinCost> pin_cost(std::uint32_t n, double fraction, std::uint32_t steps) {
  const std::uint64_t total = kBlockBytes * n;
  store::StoreOptions so;
  so.device_budget_bytes = std::max<std::uint64_t>(
      kBlockBytes, static_cast<std::uint64_t>(fraction * static_cast<double>(total)));
  so.host_budget_bytes = total + (1 << 20);
  so.chunk_bytes = 1 << 20;
  so.staging_buffers = 1;
  TZ_ASSIGN_OR_RETURN(auto device, gpu::HostDevice::create(so.device_budget_bytes));
  store::StackDescription sd;
  sd.pool.budget_bytes = 2 * so.host_budget_bytes + so.chunk_bytes + (8 << 20);
  sd.pool.slab_bytes = 32ull << 20;
  sd.pool.huge_pages = false;
  sd.pool.prefault = false;
  sd.pool.lock = MemlockPolicy::kOff;
  sd.register_pool = false;
  sd.store = so;  // no swap space: every block is homed in the host tier
  std::vector<double> per_step;
  {
    TZ_ASSIGN_OR_RETURN(store::TieredStack stack, store::build_stack(sd, *device));
    store::Store* st = stack.store.get();
    std::vector<store::BlockId> ids;
    for (std::uint32_t i = 0; i < n; ++i) {
      TZ_ASSIGN_OR_RETURN(store::BlockId id, st->create_block(kBlockBytes, store::Tier::kHost,
                                                              "b" + std::to_string(i)));
      ids.push_back(id);
    }
    TZ_RETURN_IF_ERROR(st->drain());
    for (std::uint32_t step = 0; step <= steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      for (store::BlockId id : ids) {
        TZ_ASSIGN_OR_RETURN(store::Lease lease,
                            st->pin(id, store::Tier::kDevice, store::Access::kRead));
        TZ_RETURN_IF_ERROR(lease.wait());
      }
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      st->mark_step();
      if (step > 0) per_step.push_back(s * 1e6 / n);  // step 0 records the trace
    }
    TZ_RETURN_IF_ERROR(st->drain());
  }
  PinCost c;
  c.median_us = median(per_step);
  c.min_us = *std::min_element(per_step.begin(), per_step.end());
  c.max_us = *std::max_element(per_step.begin(), per_step.end());
  c.device_budget = so.device_budget_bytes;
  return c;
}

int fail(const Status& st) { return report_failure("bench pins", st); }

int run(const PinsBenchOptions& o) {
  if (o.blocks.empty()) return fail(Status::invalid_argument("--blocks: give at least one count"));
  for (std::uint32_t n : o.blocks) {
    if (n == 0) return fail(Status::invalid_argument("--blocks: every count must be positive"));
  }
  if (!(o.device_fraction > 0 && o.device_fraction <= 1)) {
    return fail(Status::invalid_argument("--device-fraction must be in (0, 1]"));
  }
  BenchReport out(o.json);
  std::vector<double> medians;
  for (std::uint32_t n : o.blocks) {
    auto c = pin_cost(n, o.device_fraction, o.steps);
    if (!c) {
      return fail(std::move(c).take_status().with_context("bench pins: " + std::to_string(n) +
                                                          " blocks"));
    }
    medians.push_back(c->median_us);
    json j;
    j["bench"] = "pins";
    j["blocks"] = n;
    j["block_bytes"] = kBlockBytes;
    j["device_fraction"] = o.device_fraction;
    j["device_budget_bytes"] = c->device_budget;
    j["timed_steps"] = o.steps;
    j["us_per_pin"] = c->median_us;
    j["us_per_pin_min"] = c->min_us;
    j["us_per_pin_max"] = c->max_us;
    j["machine"] = machine_json();
    out.record(j);
    out.text(cell("blocks %6u  block 4096 B  device %.2f of the bytes  %10.2f us per pin "
                  "(steps %.2f..%.2f)",
                  n, o.device_fraction, c->median_us, c->min_us, c->max_us));
  }
  const auto [lo, hi] = std::minmax_element(medians.begin(), medians.end());
  const double spread = *lo > 0 ? *hi / *lo : 0;
  json j;
  j["bench"] = "pins";
  j["summary"] = true;
  j["spread"] = spread;  // dearest over cheapest median per pin
  out.record(j);
  out.text(cell("spread: the dearest pin costs %.2fx the cheapest", spread));
  return 0;
}

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* bench = tree.group("bench", "Measure the offload path");
  CLI::App* cmd = bench->add_subcommand(
      "pins", "Cost of one store pin against the number of blocks (device-only trace walk)");
  auto opts = std::make_shared<PinsBenchOptions>();
  cmd->add_option("--blocks", opts->blocks, "Block counts to measure, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--device-fraction", opts->device_fraction,
                  "Device budget as a fraction of the blocks' bytes (1: every block fits)")
      ->capture_default_str();
  cmd->add_option("--steps", opts->steps, "Timed steps after the recording one (median reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "One JSON object per block count, then a summary");
  cmd->callback([opts] { exit_code() = run(*opts); });
});

}  // namespace
}  // namespace tz::cli
