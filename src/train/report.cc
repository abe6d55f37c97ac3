// Rank 0's step lines, progress bar and metrics records (train/report.h).
#include "train/report.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/units.h"

namespace tz::train {

std::string tier_text(const zero::TierBytes& b) {
  return "device " + format_bytes(static_cast<double>(b.device)) + " host " +
         format_bytes(static_cast<double>(b.host)) + " nvme " +
         format_bytes(static_cast<double>(b.nvme));
}

nlohmann::ordered_json bandwidth_json(const zero::EngineOptions& engine) {
  return {{"nvme_read", engine.nvme_read_bytes_per_s},
          {"nvme_write", engine.nvme_write_bytes_per_s},
          {"copy", engine.copy_bytes_per_s}};
}

std::string bound_terms_text(const zero::BoundTerms& t) {
  std::string text;
  auto add = [&](const char* name, double s) {
    if (s < 0) return;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s%s %.3f s", text.empty() ? "" : ", ", name, s);
    text += buf;
  };
  add("compute", t.compute_s);
  add("optimizer", t.optimizer_s);
  add("shared busy", t.shared_busy_s);
  add("nvme", t.nvme_s);
  add("copy", t.copy_s);
  return text;
}

Reporter::Reporter(int steps, std::uint64_t steps_per_print, std::uint64_t tokens_per_step,
                   nlohmann::ordered_json bandwidths, OutputFile* metrics, bool print)
    : steps_(steps),
      steps_per_print_(std::max<std::uint64_t>(1, steps_per_print)),
      tokens_per_step_(tokens_per_step),
      bandwidths_(std::move(bandwidths)),
      metrics_(metrics),
      print_(print) {
  // As core/progress.h decides: a bar on a terminal outside CI, plain lines otherwise.
  interactive_ = print_ && isatty(fileno(stderr)) == 1 && std::getenv("CI") == nullptr;
  if (interactive_) {
    bar_ = std::make_unique<Progress>("train", static_cast<std::uint64_t>(steps), "steps");
  }
}

void Reporter::line(const std::string& text) {
  if (!print_) return;
  if (interactive_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

namespace {

// What the rank's thread waited on, as shares of the step (docs/train.md, "Output"): gathering
// parameters from host/NVMe, reducing and copying gradients (without a GPU this includes the
// kernels' own compute, which the thread waits for there), the CPU optimizer step.
double share(const zero::StepReport& r, double s) { return r.step_s > 0 ? s / r.step_s : 0.0; }

// The swap disks' share of the step with a request in flight, for the step line: " | disk vda
// 63% busy"; nothing without one, or for a step under 50 ms, which the kernel's counters (in
// jiffies, 1-10 ms) cannot split.
std::string disks_text(const zero::StepReport& r) {
  std::string text;
  if (r.step_s < 0.05) return text;
  for (const zero::DiskStep& d : r.disks) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %.0f%% busy", 100 * d.busy_fraction);
    text += (text.empty() ? " | disk " : ", ") + d.device + buf;
  }
  return text;
}

}  // namespace

void Reporter::write_metrics(const zero::StepReport& r, double loss,
                             std::optional<double> val_loss) {
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["loss"] = loss;
  j["lr"] = r.lr;
  j["grad_norm"] = r.grad_norm;
  j["loss_scale"] = r.loss_scale;
  j["step_s"] = r.step_s;
  j["tokens_per_s"] = r.step_s > 0 ? static_cast<double>(tokens_per_step_) / r.step_s : 0;
  j["bound_s"] = r.bound_s;
  j["bound_term"] = r.bound_term;
  j["bound_terms_s"] = r.bound_terms.to_json();
  j["bandwidth_bytes_per_s"] = bandwidths_;
  j["nvme_ceiling_scale"] = r.nvme_ceiling_scale;
  j["stall_fraction"] = share(r, r.stall_s);
  j["wait_params_fraction"] = share(r, r.stall_gather_s);
  j["wait_grads_fraction"] = share(r, r.stall_reduce_s);
  j["wait_optimizer_fraction"] = share(r, r.stall_optimizer_s);
  j["bytes_in_use"] = r.bytes_in_use.to_json();
  j["skipped"] = r.skipped;
  j["nvme_read_bytes"] = r.nvme_read_bytes;
  j["nvme_write_bytes"] = r.nvme_write_bytes;
  j["gradient_nvme_read_bytes"] = r.gradient_nvme_read_bytes;
  j["gradient_nvme_write_bytes"] = r.gradient_nvme_write_bytes;
  j["writer_hashed_bytes"] = r.writer_hashed_bytes;
  j["state_read_ahead_bytes"] = r.state_read_ahead_bytes;
  j["trace_followed"] = r.trace_followed;
  j["process_cpu_s"] = r.process_cpu_s;
  nlohmann::ordered_json disks = nlohmann::ordered_json::object();
  for (const zero::DiskStep& d : r.disks) {
    disks[d.device] = {{"busy_fraction", d.busy_fraction},
                       {"mean_in_flight", d.mean_in_flight},
                       {"read_bytes", d.read_bytes},
                       {"write_bytes", d.write_bytes}};
  }
  j["disks"] = std::move(disks);
  if (val_loss) j["val_loss"] = *val_loss;
  // One write per line: the file holds whole records only. A failed write (a full disk) drops
  // the file, says so once and lets the run go on.
  if (Status ws = metrics_->write(j.dump() + "\n"); !ws.is_ok()) {
    line("warning: --metrics: " + ws.message() + "; no metrics file will be written");
    metrics_ = nullptr;
  }
}

// The bound's measured bandwidths, once, before the first step's line (none measured: nothing).
void Reporter::announce_bandwidths() {
  first_step_ = false;
  const double read = bandwidths_["nvme_read"].get<double>();
  const double write = bandwidths_["nvme_write"].get<double>();
  const double copy = bandwidths_["copy"].get<double>();
  std::string text;
  if (read > 0 && write > 0) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "disk read %.2f GB/s, write %.2f GB/s", read / 1e9,
                  write / 1e9);
    text = buf;
  }
  if (copy > 0) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%scopy %.1f GB/s (memcpy)", text.empty() ? "" : "; ",
                  copy / 1e9);
    text += buf;
  }
  if (!text.empty()) line("bound bandwidths: " + text);
}

void Reporter::step(const zero::StepReport& r, double loss, std::optional<double> val_loss) {
  if (first_step_) announce_bandwidths();
  if (metrics_ != nullptr) write_metrics(r, loss, val_loss);
  const bool last = r.step == steps_;
  if (static_cast<std::uint64_t>(r.step) % steps_per_print_ == 0 || last || val_loss) {
    const double tokens_per_s =
        r.step_s > 0 ? static_cast<double>(tokens_per_step_) / r.step_s : 0;
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "step %lld/%d | loss %.4f | lr %.3e | grad norm %.4f | loss scale %g | "
                  "%.3f s | %.0f tok/s | bound %.3f s (%s) | waits: params %.0f%% grads %.0f%% "
                  "optimizer %.0f%%",
                  static_cast<long long>(r.step), steps_, loss, r.lr, r.grad_norm, r.loss_scale,
                  r.step_s, tokens_per_s, r.bound_s, r.bound_term.c_str(),
                  100 * share(r, r.stall_gather_s),
                  100 * share(r, r.stall_reduce_s), 100 * share(r, r.stall_optimizer_s));
    line(buf + disks_text(r) + " | " + tier_text(r.bytes_in_use) +
         (r.skipped ? " | skipped (overflow)" : "") +
         (val_loss ? " | val loss " + std::to_string(*val_loss) : ""));
  }
  if (bar_) bar_->set(static_cast<std::uint64_t>(r.step));
}

void Reporter::finish() {
  if (bar_) bar_->finish();
}

}  // namespace tz::train
