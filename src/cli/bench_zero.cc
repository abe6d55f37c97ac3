// `tierzero bench zero`: a synthetic layered model on the real ZeRO engine, as `bench store` is
// for the store. Unit l is a dense layer h' = tanh(W_l h) (the last without tanh) over --tokens
// rows of --hidden features, with loss 0.5 * mean over rows of |h_L - t|^2, computed on the host
// with ops/gemm.h's sgemm (the device must be host-accessible: HostDevice). --ranks N runs N ranks
// as threads (LocalComm, one HostDevice each). Prints one JSON object per step and a summary
// (--json), or a table.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "core/config.h"
#include "core/dtype.h"
#include "core/dtype_element.h"
#include "core/units.h"
#include "ops/gemm.h"
#include "train/report.h"
#include "zero/engine.h"

namespace tz::cli {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct BenchZeroOptions {
  int layers = 16;
  int hidden = 1024;
  int tokens = 512;
  int stage = 3;
  int ranks = 1;
  std::string offload_param = "none";
  std::string offload_optimizer = "none";
  std::string nvme_path;
  std::string device_budget = "4G";
  std::string host_budget = "0";
  std::string dtype = "bf16";
  int steps = 4;
  std::string config;
  bool json = false;
};

int fail(const Status& st) { return report_failure("bench zero", st); }

// The synthetic model on one rank's engine.
class LayeredModel {
 public:
  LayeredModel(zero::Engine& e, int layers, int hidden, int tokens)
      : e_(e), layers_(layers), hidden_(hidden), tokens_(tokens) {}

  Status build() {
    for (int l = 0; l < layers_; ++l) {
      zero::UnitSpec u;
      u.name = "layer" + std::to_string(l);
      u.tensors.push_back({"weight", {hidden_, hidden_}});
      TZ_ASSIGN_OR_RETURN(zero::UnitId id, e_.register_unit(u));
      units_.push_back(id);
    }
    return e_.finalize();
  }

  Status init(std::uint64_t seed) {
    const auto h = static_cast<std::size_t>(hidden_);
    std::vector<float> w(h * h);
    for (int l = 0; l < layers_; ++l) {
      std::mt19937_64 rng(seed + static_cast<std::uint64_t>(l));
      std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(static_cast<float>(hidden_)));
      for (float& x : w) x = dist(rng);
      TZ_RETURN_IF_ERROR(e_.set_tensor(units_[static_cast<std::size_t>(l)], 0, w));
    }
    return Status::ok();
  }

  // One micro-batch; returns its mean loss.
  Result<double> micro_batch(std::uint64_t data_seed) {
    const auto h = static_cast<std::size_t>(hidden_);
    const auto t = static_cast<std::size_t>(tokens_);
    // The ranks share this machine's cores (as threads, or as processes on one node).
    const int gt = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                   std::max(1, e_.world_size()));
    std::vector<std::vector<float>> acts(static_cast<std::size_t>(layers_) + 1,
                                         std::vector<float>(t * h));
    std::vector<float> target(t * h);
    std::mt19937_64 rng(data_seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (float& x : acts[0]) x = dist(rng);
    for (float& x : target) x = 0.5f * dist(rng);
    std::vector<float> w(h * h);
    for (int l = 0; l < layers_; ++l) {
      const zero::UnitId id = units_[static_cast<std::size_t>(l)];
      TZ_ASSIGN_OR_RETURN(zero::UnitViews v, e_.gather(id));
      TZ_RETURN_IF_ERROR(e_.compute_stream().synchronize());
      for (std::size_t i = 0; i < h * h; ++i) w[i] = load_element(v[0].data, v[0].dtype, i);
      TZ_RETURN_IF_ERROR(e_.release(id));
      auto& in = acts[static_cast<std::size_t>(l)];
      auto& out = acts[static_cast<std::size_t>(l) + 1];
      // out[t x h] = in[t x h] * W^T
      ops::cpu_sgemm(gt, false, true, t, h, h, in.data(), h, w.data(), h, 0.0f, out.data(), h);
      if (l + 1 < layers_) {
        for (float& x : out) x = std::tanh(x);
      }
    }
    double loss = 0;
    std::vector<float> dh(t * h);
    const auto scale = static_cast<float>(e_.loss_scale());
    const auto& last = acts[static_cast<std::size_t>(layers_)];
    for (std::size_t i = 0; i < dh.size(); ++i) {
      const float d = last[i] - target[i];
      loss += 0.5 * static_cast<double>(d) * d;
      dh[i] = d / static_cast<float>(tokens_) * scale;
    }
    loss /= static_cast<double>(tokens_);
    std::vector<float> dw(h * h), din(t * h);
    for (int l = layers_ - 1; l >= 0; --l) {
      const zero::UnitId id = units_[static_cast<std::size_t>(l)];
      TZ_ASSIGN_OR_RETURN(zero::UnitViews v, e_.gather(id));
      TZ_ASSIGN_OR_RETURN(zero::UnitViews g, e_.grad(id));
      TZ_RETURN_IF_ERROR(e_.compute_stream().synchronize());
      for (std::size_t i = 0; i < h * h; ++i) w[i] = load_element(v[0].data, v[0].dtype, i);
      const auto& in = acts[static_cast<std::size_t>(l)];
      const auto& out = acts[static_cast<std::size_t>(l) + 1];
      if (l + 1 < layers_) {
        for (std::size_t i = 0; i < dh.size(); ++i) dh[i] *= 1.0f - out[i] * out[i];
      }
      // dW[h x h] = dz^T * in; din[t x h] = dz * W
      ops::cpu_sgemm(gt, true, false, h, h, t, dh.data(), h, in.data(), h, 0.0f, dw.data(), h);
      ops::cpu_sgemm(gt, false, false, t, h, h, dh.data(), h, w.data(), h, 0.0f, din.data(), h);
      for (std::size_t i = 0; i < h * h; ++i) store_element(g[0].data, g[0].dtype, i, dw[i]);
      TZ_RETURN_IF_ERROR(e_.release(id));
      TZ_RETURN_IF_ERROR(e_.reduce(id));
      dh.swap(din);
    }
    return loss;
  }

 private:
  zero::Engine& e_;
  int layers_, hidden_, tokens_;
  std::vector<zero::UnitId> units_;
};

std::string config_text(const BenchZeroOptions& o) {
  json j;
  j["train_micro_batch_size_per_gpu"] = 1;
  j["gradient_clipping"] = 1.0;
  j["bf16"]["enabled"] = o.dtype == "bf16";
  if (o.dtype == "fp16") j["fp16"]["enabled"] = true;
  j["optimizer"]["type"] = "AdamW";
  j["optimizer"]["params"]["lr"] = 1e-3;
  j["optimizer"]["params"]["weight_decay"] = 0.01;
  j["zero_optimization"]["stage"] = o.stage;
  j["zero_optimization"]["offload_optimizer"]["device"] = o.offload_optimizer;
  j["zero_optimization"]["offload_param"]["device"] = o.offload_param;
  if (!o.nvme_path.empty()) {
    j["zero_optimization"]["offload_optimizer"]["nvme_path"] = o.nvme_path;
    j["zero_optimization"]["offload_param"]["nvme_path"] = o.nvme_path;
  }
  return j.dump();
}

// Parse: the flags and the config into the engine's options (kInvalidArgument naming the flag).
Result<zero::EngineOptions> parse(const BenchZeroOptions& o) {
  if (o.layers <= 0 || o.hidden <= 0 || o.tokens <= 0 || o.steps <= 0 || o.ranks <= 0) {
    return Status::invalid_argument(
        "--layers, --hidden, --tokens, --steps and --ranks must be positive");
  }
  if (o.dtype != "bf16" && o.dtype != "fp16" && o.dtype != "fp32") {
    return Status::invalid_argument("--dtype: expected bf16, fp16 or fp32, got " + o.dtype);
  }
  TZ_ASSIGN_OR_RETURN(std::uint64_t device_budget, parse_size(o.device_budget));
  TZ_ASSIGN_OR_RETURN(std::uint64_t host_budget, parse_size(o.host_budget));
  ConfigLoad load = o.config.empty() ? load_config_text(config_text(o))
                                     : load_config_file(o.config);
  if (!load.ok()) return load.status();
  zero::EngineOptions eo;
  eo.config = load.config;
  // The flags decide the stage, offloads, dtype and budget; a --config file supplies the rest
  // (optimizer, schedule, clipping, accumulation, fp16 scaling, aio, ...).
  eo.config.zero.stage = o.stage;
  eo.config.zero.offload_optimizer.device = o.offload_optimizer;
  eo.config.zero.offload_param.device = o.offload_param;
  eo.config.bf16 = o.dtype == "bf16";
  eo.config.fp16.enabled = o.dtype == "fp16";
  eo.config.tierzero.device_budget = device_budget;
  eo.nvme_path = o.nvme_path;
  eo.host_budget_bytes = host_budget;
  eo.activation_bytes = 0;  // the synthetic model computes in host memory
  return eo;
}

// The run's result: one JSON line per step (rank 0) and the summary; printed as JSON lines or
// as the table.
struct ZeroResult {
  std::mutex mu;  // rank 0's thread writes, the caller reads after the ranks joined
  std::vector<json> step_lines;
  json summary;

  void print(const BenchZeroOptions& o, const zero::EngineOptions& eo) const {
    BenchReport out(o.json);
    out.text(cell("bench zero: stage %d, %d rank(s), %s params, optimizer %s, params %s, %s",
                  eo.config.zero.stage, o.ranks,
                  format_bytes(summary["params"].get<double>()).c_str(),
                  eo.config.zero.offload_optimizer.device.c_str(),
                  eo.config.zero.offload_param.device.c_str(), o.dtype.c_str()));
    out.table({{"step", 5},
               {"step_s", 10},
               {"bound_s", 10},
               {"loss", 12},
               {"nvme B/param", 14},
               {"peak device", 14}});
    for (const json& l : step_lines) {
      out.result(l, {cell("%lld", l["step"].get<long long>()),
                     cell("%.3f", l["step_s"].get<double>()),
                     cell("%.3f", l["bound_s"].get<double>()),
                     cell("%.6f", l["loss"].get<double>()),
                     cell("%.2f", l["nvme_bytes_per_param"].get<double>()),
                     format_bytes(l["peak_bytes"]["device"].get<double>())});
    }
    out.record(summary);
    out.text("params_xxh3 " + summary["params_xxh3"].get<std::string>());
  }
};

// One step's JSON line.
json step_line(const BenchZeroOptions& o, const zero::EngineOptions& eo, zero::Engine& engine,
               const zero::StepReport& rep, double loss) {
  json line;
  line["bench"] = "zero";
  line["stage"] = eo.config.zero.stage;
  line["ranks"] = o.ranks;
  line["params"] = engine.param_count();
  line["step"] = rep.step;
  line["skipped"] = rep.skipped;
  line["step_s"] = rep.step_s;
  line["bound_s"] = rep.bound_s;
  line["bound_term"] = rep.bound_term;
  line["bound_terms_s"] = rep.bound_terms.to_json();
  line["nvme_ceiling_scale"] = rep.nvme_ceiling_scale;
  line["loss"] = loss;
  line["grad_norm"] = rep.grad_norm;
  line["loss_scale"] = rep.loss_scale;
  line["stall_s"] = {{"gather", rep.stall_gather_s},
                     {"reduce", rep.stall_reduce_s},
                     {"optimizer", rep.stall_optimizer_s}};
  line["comm_bytes"] = rep.comm_bytes;
  line["comm_formula_bytes"] = rep.comm_formula_bytes;
  line["peak_bytes"] = rep.peak_bytes.to_json();
  line["plan_bytes"] = engine.plan_bytes().to_json();
  line["nvme_read_bytes"] = rep.nvme_read_bytes;
  line["nvme_write_bytes"] = rep.nvme_write_bytes;
  line["nvme_bytes_per_param"] = static_cast<double>(rep.nvme_read_bytes + rep.nvme_write_bytes) /
                                 static_cast<double>(engine.param_count());
  return line;
}

// The summary: the last step's line with the medians of the later steps, the parameters' hash,
// the plan, the ceilings and the machine.
json summary_json(const BenchZeroOptions& o, const zero::EngineOptions& eo, zero::Engine& engine,
                  json last, const std::vector<double>& step_s, const std::vector<double>& bound_s,
                  const std::vector<zero::BoundTerms>& terms, std::uint64_t hash) {
  json summary = std::move(last);
  summary["summary"] = true;
  // Steps after the first follow the store's trace; the first one also warms it.
  std::vector<double> later(step_s.begin() + (step_s.size() > 1 ? 1 : 0), step_s.end());
  std::vector<double> later_bound(bound_s.begin() + (bound_s.size() > 1 ? 1 : 0), bound_s.end());
  summary["step_s"] = median(later);
  summary["bound_s"] = median(later_bound);
  summary["bound_terms_s"] =
      median_bound_terms(std::vector<zero::BoundTerms>(terms.begin() + (terms.size() > 1 ? 1 : 0),
                                                       terms.end()))
          .to_json();
  summary["steps"] = o.steps;
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  summary["params_xxh3"] = hex;
  summary["plan"] = engine.plan_json();
  summary["bandwidth_bytes_per_s"] = train::bandwidth_json(eo);
  summary["machine"] = machine_json();
  return summary;
}

// One rank's run: the engine, the model, the steps; rank 0 records the lines and the summary.
Status run_rank(const BenchZeroOptions& o, zero::EngineOptions eo, int rank, gpu::Device& dev,
                comm::Comm& comm, SharedCeilings& ceilings, ZeroResult& result) {
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine, zero::Engine::create(eo, dev, comm));
  LayeredModel model(*engine, o.layers, o.hidden, o.tokens);
  TZ_RETURN_IF_ERROR(model.build());  // the engine's memory plan is checked here
  // The bound's bandwidths, once the plan is checked (a run it refuses spends nothing on the
  // probe). The synthetic model runs on HostDevice, whose host <-> device copies are memcpy, so
  // the copy term is always measured.
  TZ_RETURN_IF_ERROR(ceilings.measure(/*device_is_host_memory=*/true, eo));
  engine->set_bound_bandwidths(eo.nvme_read_bytes_per_s, eo.nvme_write_bytes_per_s,
                               eo.copy_bytes_per_s);
  TZ_RETURN_IF_ERROR(model.init(1234));
  const int k = engine->gradient_accumulation_steps();
  std::vector<double> step_s, bound_s;
  std::vector<zero::BoundTerms> terms;
  for (int step = 0; step < o.steps; ++step) {
    double loss = 0;
    for (int b = 0; b < k; ++b) {
      const std::uint64_t seed = (static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(k) +
                                  static_cast<std::uint64_t>(b)) * 1000003u +
                                 static_cast<std::uint64_t>(rank);
      TZ_ASSIGN_OR_RETURN(double l, model.micro_batch(seed));
      loss += l / k;
    }
    TZ_ASSIGN_OR_RETURN(zero::StepReport rep, engine->step());
    if (rank != 0) continue;
    json line = step_line(o, eo, *engine, rep, loss);
    step_s.push_back(rep.step_s);
    bound_s.push_back(rep.bound_s);
    terms.push_back(rep.bound_terms);
    std::lock_guard lock(result.mu);
    result.step_lines.push_back(std::move(line));
  }
  TZ_ASSIGN_OR_RETURN(std::uint64_t hash, engine->params_xxh3());
  if (rank == 0) {
    std::lock_guard lock(result.mu);
    result.summary =
        summary_json(o, eo, *engine, result.step_lines.back(), step_s, bound_s, terms, hash);
  }
  return Status::ok();
}

// parse -> run (each rank measures the bound's bandwidths once its plan is checked) -> report.
int run(const BenchZeroOptions& o) {
  Result<zero::EngineOptions> parsed = parse(o);
  if (!parsed) return fail(parsed.status());
  zero::EngineOptions eo = std::move(parsed).value();
  count_probe_in_plan(eo);  // the ranks probe once their plan is checked (run_rank)
  SharedCeilings ceilings("bench zero");
  ZeroResult result;
  Status st = zero::run_local_ranks(
      o.ranks, eo.config.tierzero.device_budget,
      [&](int rank, gpu::Device& dev, comm::Comm& comm) {
        return run_rank(o, eo, rank, dev, comm, ceilings, result);
      });
  if (!st.is_ok()) return fail(st);
  result.print(o, eo);
  return 0;
}

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* bench = tree.group("bench", "Measure components against their ceilings");
  auto o = std::make_shared<BenchZeroOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "zero", "A synthetic layered model on the ZeRO engine: step time against the bound, NVMe "
              "bytes per parameter, comm and memory against the formulas");
  cmd->add_option("--layers", o->layers, "Units (dense layers)");
  cmd->add_option("--hidden", o->hidden, "Features per layer (weights hidden x hidden)");
  cmd->add_option("--tokens", o->tokens, "Rows per micro-batch");
  cmd->add_option("--stage", o->stage, "ZeRO stage 0-3");
  cmd->add_option("--ranks", o->ranks, "Ranks as threads (LocalComm, one HostDevice each)");
  cmd->add_option("--offload-param", o->offload_param, "none|cpu|nvme (stage 3)");
  cmd->add_option("--offload-optimizer", o->offload_optimizer, "none|cpu|nvme");
  cmd->add_option("--nvme-path", o->nvme_path, "Directory for swap files");
  cmd->add_option("--device-budget", o->device_budget, "Device memory per rank (e.g. 64M)");
  cmd->add_option("--host-budget", o->host_budget, "Host tier per rank (0 = the engine's plan)");
  cmd->add_option("--dtype", o->dtype, "bf16|fp16|fp32 (fp16 with dynamic loss scaling)");
  cmd->add_option("--steps", o->steps, "Optimizer steps");
  cmd->add_option("--config", o->config, "A DeepSpeed-style config for everything else");
  cmd->add_flag("--json", o->json, "One JSON object per step and a summary");
  cmd->callback([o] { exit_code() = run(*o); });
});

}  // namespace
}  // namespace tz::cli
