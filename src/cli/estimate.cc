// `tierzero estimate`: the engine's memory plan (zero/plan.h) for a model and a config,
// per tier and per term, next to DESIGN.md's formula for the stage and DeepSpeed's estimator
// formulas; whether the run fits this machine and, when not, which setting to change; with
// --all a table over every stage and offload choice, with --measure two real training steps and
// their peaks per tier next to the plan. docs/estimate.md describes the terms and the formulas.

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "cli/train_setup.h"
#include "comm/select.h"
#include "core/config.h"
#include "core/host_probe.h"
#include "core/units.h"
#include "cpu/data_path.h"
#include "gpu/select.h"
#include "gpu/workspaces.h"
#include "model/data.h"
#include "model/factory.h"
#include "store/stats.h"
#include "zero/engine.h"
#include "zero/layout.h"
#include "zero/plan.h"

namespace tz::cli {
namespace {

using store::Tier;

struct EstimateFlags {
  std::string config_path;
  std::string model;
  int ranks = 1;
  int seq = 0;
  int micro_batch = 0;     // 0: the config's train_micro_batch_size_per_gpu
  int checkpointing = -1;  // -1: the model's default
  std::string nvme_path;
  std::string data;  // --measure: a corpus instead of seeded random tokens
  std::string lora;     // --lora r=R,...: adapters on a frozen base (docs/lora.md)
  std::string adapter;  // --adapter DIR: the same from a PEFT folder's adapter_config.json
  bool json = false;
  bool all = false;
  bool measure = false;
};

std::string gib(std::uint64_t bytes) { return format_bytes(static_cast<double>(bytes)); }

// Everything estimate knows about the run before any plan: what train would be given.
struct Setup {
  EstimateFlags flags;
  Config config;
  model::ModelDesc shape;
  model::ModelOptions model_options;
  std::vector<zero::UnitSpec> units;
  std::uint64_t params = 0;
  std::uint64_t largest_layer_params = 0;  // DeepSpeed's "largest layer": one module's parameters
  std::uint64_t device_budget_bytes = 0;   // per rank, as train's device(s) would have it
  std::string device_name;
  bool device_is_host = true;  // HostDevice: the "device" tier is host memory too
  gpu::DeviceWorkspaces workspaces;  // cuBLAS's and NCCL's, as train's device and comm would have
};

// The largest set of tensors one module owns directly (DeepSpeed's model_to_params counts
// parameters(recurse=False) per module): tensors grouped by unit and name up to the last dot
// ("attn.c_attn.weight" and "attn.c_attn.bias" are one Linear).
std::uint64_t largest_layer(const std::vector<zero::UnitSpec>& units) {
  std::uint64_t best = 0;
  for (const zero::UnitSpec& u : units) {
    std::vector<std::pair<std::string, std::uint64_t>> modules;
    for (const zero::TensorSpec& t : u.tensors) {
      const std::string module = t.name.substr(0, t.name.rfind('.'));
      auto it = std::find_if(modules.begin(), modules.end(),
                             [&](const auto& m) { return m.first == module; });
      if (it == modules.end()) {
        modules.emplace_back(module, t.numel());
      } else {
        it->second += t.numel();
      }
    }
    for (const auto& m : modules) best = std::max(best, m.second);
  }
  return best;
}

// The device budget one rank gets, as `tierzero train` opens its device(s): one rank in this
// process opens the machine's device; ranks as threads each get a HostDevice (run_local_ranks).
Status probe_device(Setup& s) {
  const std::uint64_t budget = s.config.tierzero.device_budget;
  if (s.flags.ranks == 1) {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Device> device,
                        gpu::open_device({.budget_bytes = budget}));
    s.device_budget_bytes = device->memory_stats().budget_bytes;
    s.device_name = device->name();
    s.device_is_host = device->host_accessible();
    s.workspaces = gpu::device_workspaces(*device, 1, false);
    return Status::ok();
  }
  return zero::run_local_ranks(s.flags.ranks, budget,
                               [&s](int rank, gpu::Device& device, comm::Comm& comm) {
                                 if (rank == 0) {
                                   s.device_budget_bytes = device.memory_stats().budget_bytes;
                                   s.device_name = device.name();
                                   s.device_is_host = device.host_accessible();
                                   s.workspaces = gpu::device_workspaces(
                                       device, s.flags.ranks, comm.backend() == "nccl");
                                 }
                                 return Status::ok();
                               });
}

Result<Setup> prepare(const EstimateFlags& f) {
  Setup s;
  s.flags = f;
  if (f.ranks < 1) return Status::invalid_argument("--ranks must be at least 1");
  if (f.seq < 0) return Status::invalid_argument("--seq must be positive");
  if (f.micro_batch < 0) return Status::invalid_argument("--micro-batch must be positive");
  if (f.all && f.measure) {
    return Status::invalid_argument("--measure runs the config's own stage and offload; not with "
                                    "--all");
  }
  TZ_ASSIGN_OR_RETURN(s.config, load_run_config("estimate", f.config_path, f.nvme_path));
  // --all plans nvme rows too, which take the path; one plan refuses it as `train` does.
  if (!f.all) TZ_RETURN_IF_ERROR(check_nvme_path_used(s.config, f.config_path, f.nvme_path));
  if (f.micro_batch > 0) {
    s.config.train_micro_batch_size_per_gpu = static_cast<std::uint64_t>(f.micro_batch);
    s.config.train_batch_size = 0;  // derived again from the new micro-batch
  }
  TZ_ASSIGN_OR_RETURN(s.shape, resolve_run_model(f.model, f.lora, f.adapter));
  if (f.seq > s.shape.seq) {
    return Status::invalid_argument("--seq " + std::to_string(f.seq) + " is longer than " +
                                    s.shape.name + "'s " + std::to_string(s.shape.seq) +
                                    " positions");
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  s.model_options = model_options_for(s.config, f.seq, f.checkpointing, std::max(1, cores / f.ranks));
  s.units = model::unit_specs(s.shape);
  s.params = 0;  // every unit's, adapters included
  for (const zero::UnitSpec& u : s.units) {
    for (const zero::TensorSpec& t : u.tensors) s.params += t.numel();
  }
  s.largest_layer_params = largest_layer(s.units);
  TZ_RETURN_IF_ERROR(probe_device(s));
  // The process's memory now, as `train`'s when it creates its engine (same binary, device open).
  (void)zero::process_baseline_bytes();
  return s;
}

// One stage and offload choice planned for the setup: the engine's plan (the same function
// finalize() calls), the formula, DeepSpeed's estimate and the verdict.
struct Estimate {
  Config config;
  zero::EngineOptions options;
  zero::PlanInputs inputs;
  zero::MemoryPlan plan;
  Status plan_status;  // the engine's own refusal (out of memory), if it would refuse
  zero::TierBytes formula;
  std::optional<zero::TierBytes> deepspeed;  // none where DeepSpeed's estimator has no row
  std::vector<std::string> paths;            // swap directories
  struct Check {
    std::string tier;
    bool ok = true;
    std::string text;
  };
  std::vector<Check> checks;
  bool fits() const {
    return std::all_of(checks.begin(), checks.end(), [](const Check& c) { return c.ok; });
  }
  // "yes", or "no (device, host)": the tiers that do not fit.
  std::string verdict() const {
    std::string over;
    for (const Check& c : checks) {
      if (!c.ok && over.find(c.tier) == std::string::npos) {
        over += (over.empty() ? "" : ", ") + c.tier;
      }
    }
    return over.empty() ? "yes" : "no (" + over + ")";
  }
};

// DeepSpeed's estimators (docs/estimate.md cites them): estimate_zero3_model_states_mem_needs
// (runtime/zero/stage3.py) and estimate_zero2_model_states_mem_needs (runtime/zero/
// stage_1_and_2.py, for stages 1 and 2), one node of N GPUs, zero_init, factor 1.5. Their CPU
// figure is per node; here it is divided by N to compare with one rank's plan. They have no NVMe
// column: an nvme offload is shown as their cpu offload. Stage 0 and parameter offload without
// optimizer offload have no row in their tables.
std::optional<zero::TierBytes> deepspeed_bytes(int stage, bool opt_offload, bool param_offload,
                                               double phi, double largest, int n) {
  const double factor = 1.5;
  double gpu = 0;
  double cpu = 0;
  if (stage == 3) {
    const double ll = 4 * largest;
    if (opt_offload && param_offload) {
      gpu = ll;
      cpu = phi * 18 * factor;
    } else if (opt_offload) {
      gpu = ll + 2 * phi / n;
      cpu = phi * 16 * factor;
    } else if (!param_offload) {
      gpu = ll + 18 * phi / n;
      cpu = largest * 4 * n * factor;
    } else {
      return std::nullopt;
    }
  } else if (stage == 1 || stage == 2) {
    if (opt_offload) {
      gpu = 2 * phi;
      cpu = phi * std::max(4.0 * n, 16.0) * factor;
    } else {
      gpu = 4 * phi + 16 * phi / n;
      cpu = phi * 4 * n * factor;
    }
  } else {
    return std::nullopt;
  }
  zero::TierBytes b;
  b.device = static_cast<std::uint64_t>(gpu);
  b.host = static_cast<std::uint64_t>(cpu / n);
  return b;
}

// Whether the planned run fits this machine, tier by tier, and which setting to change if not.
void check_machine(const Setup& s, Estimate& e) {
  const auto n = static_cast<std::uint64_t>(s.flags.ranks);
  const zero::TierBytes b = e.plan.bytes();
  if (!e.plan_status.is_ok()) {
    e.checks.push_back({"plan", false, e.plan_status.message()});
  }
  {
    Estimate::Check c{"device", b.device <= s.device_budget_bytes, ""};
    c.text = "device: " + gib(b.device) + " per rank, budget " + gib(s.device_budget_bytes) +
             " (" + s.device_name + ")";
    if (!c.ok) {
      // The advice starts with the largest term: activations, or the model's state.
      const std::uint64_t act = e.options.activation_bytes;
      const std::string state_advice =
          "offload the optimizer (zero_optimization.offload_optimizer.device), raise "
          "zero_optimization.stage, offload the parameters at stage 3";
      const std::string act_advice =
          "turn on activation checkpointing (--checkpointing 1), lower the micro-batch "
          "(--micro-batch) or the sequence (--seq)";
      if (act >= b.device - std::min(act, b.device)) {
        c.text += ": over, mostly activations (" + gib(act) + "); " + act_advice + ", or " +
                  state_advice;
      } else {
        c.text += ": over; " + state_advice + ", or " + act_advice;
      }
    }
    e.checks.push_back(c);
  }
  {
    // Ranks as threads of one process: every rank's pinned pools (the engine's, and the overlap
    // mode's when it keeps host buffers) are this process's, and on HostDevice the device tier is
    // host memory too. Each pool's slack is in its size; the process's other terms once (one
    // process). The host plan holds the overlap mode's host buffers; its process terms, both
    // pools' slack.
    const std::uint64_t overlap_pool = e.plan.overlap_pool.budget_bytes;
    const std::uint64_t per_rank = e.plan.pool.budget_bytes + overlap_pool;
    const std::uint64_t pool = n * per_rank;
    const std::uint64_t baseline = e.plan.process_bytes() + b.host - per_rank;
    const std::uint64_t need = pool + baseline + (s.device_is_host ? n * b.device : 0);
    const std::uint64_t avail = host_memory().available_bytes;
    Estimate::Check c{"host", avail == 0 || need <= avail, ""};
    c.text = "host: " + std::to_string(n) + " x " + gib(per_rank) + " pinned" +
             (overlap_pool > 0 ? " (" + gib(overlap_pool) + " of it the overlap mode's)" : "") +
             " + " + gib(baseline) + " process baseline" +
             (s.device_is_host ? " + the device tier (host memory here)" : "") + " = " + gib(need) +
             ", MemAvailable " + (avail == 0 ? "unknown" : gib(avail));
    if (!c.ok) {
      c.text += ": over; move state to NVMe (offload_optimizer.device / offload_param.device "
                "\"nvme\") or lower tierzero.host_budget";
    }
    const cpu::DataPathReport dp = cpu::data_path_report();
    if (!dp.memlock_unlimited && !dp.cap_ipc_lock && dp.memlock_limit_bytes < pool) {
      c.text += "; RLIMIT_MEMLOCK " + gib(dp.memlock_limit_bytes) + " locks less than the " +
                gib(pool) + " pinned (raise `ulimit -l`; the pool then runs unlocked)";
    }
    e.checks.push_back(c);
  }
  if (b.nvme > 0) {
    if (e.paths.empty()) {
      e.checks.push_back({"nvme", false,
                          "nvme: " + gib(b.nvme) + " per rank but no NVMe path (give --nvme-path "
                          "DIR or zero_optimization.offload_*.nvme_path)"});
    }
    for (const std::string& dir : e.paths) {
      // Every rank stripes its swap files over every path.
      const std::uint64_t need = n * e.plan.swap_bytes_per_path;
      // The same check as `tierzero train` makes before its first step.
      const Status st = check_swap_path(dir, need);
      Estimate::Check c{"nvme", st.is_ok(), ""};
      c.text = "nvme: " + dir + ": " + std::to_string(n) + " x " +
               gib(e.plan.swap_bytes_per_path) + " of swap";
      if (!st.is_ok()) c.text += ": " + st.message();
      e.checks.push_back(c);
    }
  }
}

// Plans `config` (the setup's, or one --all row's): what the engine would plan and refuse.
Result<Estimate> estimate_for(const Setup& s, const Config& config) {
  Estimate e;
  e.config = config;
  e.options = engine_options_for(config, s.shape, s.model_options, s.flags.nvme_path,
                                 static_cast<std::uint64_t>(config.tierzero.seed));
  e.paths = zero::swap_paths(e.options);
  TZ_ASSIGN_OR_RETURN(e.inputs, zero::plan_inputs(e.options, s.flags.ranks, s.device_budget_bytes));
  e.inputs.process_baseline_bytes = zero::process_baseline_bytes();
  // `train` measures its bound's bandwidths beside the engine's memory (unless
  // --no-bandwidth-probe).
  e.inputs.probe_host_bytes = engine_ceilings_host_bytes(s.device_is_host, e.options);
  e.inputs.cublas_workspace_bytes = s.workspaces.cublas;
  e.inputs.nccl_buffer_bytes = s.workspaces.nccl;
  std::vector<zero::UnitLayout> layouts;
  for (const zero::UnitSpec& u : s.units) layouts.push_back(zero::plan_unit_layout(u, s.flags.ranks));
  auto plan = zero::plan_memory(e.inputs, config, layouts);
  if (!plan.is_ok()) {
    if (plan.status().code() != ErrorCode::kOutOfMemory) return plan.status();
    // Over a budget: the engine would refuse. Plan without the budgets to show every term.
    e.plan_status = plan.status();
    zero::PlanInputs open = e.inputs;
    open.device_budget_bytes = ~0ull;
    open.host_budget_bytes = 0;
    Config relaxed = config;
    relaxed.tierzero.device_budget = 0;
    relaxed.tierzero.host_budget = 0;
    TZ_ASSIGN_OR_RETURN(e.plan, zero::plan_memory(open, relaxed, layouts));
  } else {
    e.plan = std::move(*plan);
  }
  e.inputs.grad = e.plan.grad;  // the gradient shards' home as the plan resolved it
  std::uint64_t frozen = 0;  // a LoRA base (--lora, --adapter): parameters only
  for (const zero::UnitSpec& u : s.units) {
    if (!u.frozen) continue;
    for (const zero::TensorSpec& t : u.tensors) frozen += t.numel();
  }
  e.formula = zero::formula_bytes(e.inputs, s.params, frozen);
  e.deepspeed = deepspeed_bytes(e.inputs.stage, e.inputs.optimizer != zero::Placement::kDevice,
                                e.inputs.param != zero::Placement::kDevice,
                                static_cast<double>(s.params),
                                static_cast<double>(s.largest_layer_params), s.flags.ranks);
  check_machine(s, e);
  return e;
}

// Two optimizer steps of the real trainer (engine + model, as `tierzero train` runs them) on
// seeded random tokens or --data; the largest peak per tier over the ranks.
Result<zero::TierBytes> measure(const Setup& s, const Estimate& e) {
  const int world = s.flags.ranks;
  const int seq = s.model_options.seq > 0 ? s.model_options.seq : s.shape.seq;
  const auto b = static_cast<std::uint64_t>(s.model_options.micro_batch);
  const std::uint64_t k = e.config.gradient_accumulation_steps;
  const std::uint64_t seed = static_cast<std::uint64_t>(e.config.tierzero.seed);
  std::shared_ptr<const model::TokenData> data;
  if (!s.flags.data.empty()) {
    TZ_ASSIGN_OR_RETURN(model::TokenData d, model::load_tokens(s.flags.data, s.shape.vocab));
    data = std::make_shared<const model::TokenData>(std::move(d));
  } else {
    data = std::make_shared<const model::TokenData>(model::synthetic_tokens(
        2 * b * static_cast<std::uint64_t>(seq) * k * static_cast<std::uint64_t>(world) + 1,
        s.shape.vocab, seed));
  }
  std::vector<zero::TierBytes> peaks(static_cast<std::size_t>(world));
  auto run_rank = [&](int rank, gpu::Device& device, comm::Comm& comm) -> Status {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine,
                        zero::Engine::create(e.options, device, comm));
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> net,
                        model::create_model(s.shape, s.model_options, *engine));
    TZ_RETURN_IF_ERROR(engine->finalize());
    TZ_RETURN_IF_ERROR(net->init_weights(seed));
    model::LoaderOptions lo{.micro_batch = static_cast<int>(b),
                            .seq = seq,
                            .rank = rank,
                            .world_size = world,
                            .shuffle = false,
                            .seed = seed};
    TZ_ASSIGN_OR_RETURN(model::DataLoader loader, model::DataLoader::create(data, lo));
    const auto bt = static_cast<std::size_t>(loader.tokens_per_micro_batch());
    std::vector<std::int32_t> tok(bt), tgt(bt);
    for (int step = 0; step < 2; ++step) {
      for (int m = 0; m < engine->gradient_accumulation_steps(); ++m) {
        loader.next(tok, tgt);
        TZ_RETURN_IF_ERROR(net->train_micro_batch(tok, tgt).status());
      }
      TZ_RETURN_IF_ERROR(engine->step().status());
    }
    // As train ends: the weights' hash gathers every unit's fp32 master (get_tensor's scratch).
    TZ_RETURN_IF_ERROR(engine->params_xxh3().status());
    TZ_RETURN_IF_ERROR(device.synchronize());
    peaks[static_cast<std::size_t>(rank)] = engine->peak_bytes();
    return Status::ok();
  };
  if (world == 1) {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Device> device,
                        gpu::open_device({.budget_bytes = e.config.tierzero.device_budget}));
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<comm::Comm> comm,
                        comm::open_comm(*device, comm::CommBackend::kAuto));
    TZ_RETURN_IF_ERROR(run_rank(0, *device, *comm));
  } else {
    TZ_RETURN_IF_ERROR(zero::run_local_ranks(world, e.config.tierzero.device_budget, run_rank));
  }
  zero::TierBytes out;
  for (const zero::TierBytes& p : peaks) {
    out.device = std::max(out.device, p.device);
    out.host = std::max(out.host, p.host);
    out.nvme = std::max(out.nvme, p.nvme);
  }
  return out;
}

nlohmann::ordered_json tier_json(const std::optional<zero::TierBytes>& b) {
  if (!b) return {{"device", nullptr}, {"host", nullptr}, {"nvme", nullptr}};
  return b->to_json();
}

std::string offload_name(zero::Placement p) {
  return p == zero::Placement::kDevice ? "none" : p == zero::Placement::kHost ? "cpu" : "nvme";
}

nlohmann::ordered_json estimate_json(const Estimate& e,
                                     const std::optional<zero::TierBytes>& measured) {
  nlohmann::ordered_json j;
  j["stage"] = e.inputs.stage;
  j["offload_optimizer"] = offload_name(e.inputs.optimizer);
  j["offload_param"] = offload_name(e.inputs.param);
  j["plan_bytes"] = e.plan.bytes().to_json();
  j["formula_bytes"] = e.formula.to_json();
  j["deepspeed_bytes"] = tier_json(e.deepspeed);
  if (measured) j["measured_peak_bytes"] = measured->to_json();
  nlohmann::ordered_json terms;
  for (const zero::PlanTerm& t : e.plan.terms) terms[store::tier_name(t.tier)][t.name] = t.bytes;
  for (const zero::PlanTerm& t : e.plan.process) terms["process"][t.name] = t.bytes;
  j["terms"] = terms;
  j["process_bytes"] = e.plan.process_bytes();
  j["fits"] = e.fits();
  nlohmann::ordered_json checks = nlohmann::ordered_json::array();
  for (const Estimate::Check& c : e.checks) {
    checks.push_back({{"tier", c.tier}, {"ok", c.ok}, {"text", c.text}});
  }
  j["checks"] = checks;
  return j;
}

nlohmann::ordered_json header_json(const Setup& s) {
  nlohmann::ordered_json j;
  j["command"] = "estimate";
  j["model"] = s.shape.name;
  j["params"] = s.params;
  j["largest_layer_params"] = s.largest_layer_params;
  j["ranks"] = s.flags.ranks;
  j["micro_batch"] = s.model_options.micro_batch;
  j["seq"] = s.model_options.seq > 0 ? s.model_options.seq : s.shape.seq;
  j["checkpointing"] = model::checkpointing_enabled(s.shape, s.model_options);
  j["device"] = s.device_name;
  j["device_budget_bytes"] = s.device_budget_bytes;
  return j;
}

// Activation bytes of the model with checkpointing on and off (the plan counts the one in use).
std::pair<std::uint64_t, std::uint64_t> activations_with_without(const Setup& s, DType compute) {
  model::ModelOptions on = s.model_options;
  on.checkpointing = 1;
  model::ModelOptions off = s.model_options;
  off.checkpointing = 0;
  return {model::activation_bytes(s.shape, on, compute),
          model::activation_bytes(s.shape, off, compute)};
}

void print_one(const Setup& s, const Estimate& e, const std::optional<zero::TierBytes>& measured) {
  const int seq = s.model_options.seq > 0 ? s.model_options.seq : s.shape.seq;
  const bool ckpt = model::checkpointing_enabled(s.shape, s.model_options);
  std::printf("%s: %llu parameters (largest layer %llu), stage %d, %s, %d rank(s), micro-batch %d x "
              "%d tokens, checkpointing %s\n",
              s.shape.name.c_str(), static_cast<unsigned long long>(s.params),
              static_cast<unsigned long long>(s.largest_layer_params), e.inputs.stage,
              std::string(dtype_name(e.inputs.compute_dtype)).c_str(), s.flags.ranks,
              s.model_options.micro_batch, seq, ckpt ? "on" : "off");
  std::printf("offload: optimizer %s, parameters %s; device %s, %s per rank\n\n",
              offload_name(e.inputs.optimizer).c_str(), offload_name(e.inputs.param).c_str(),
              s.device_name.c_str(), gib(s.device_budget_bytes).c_str());
  std::printf("the engine's plan, per rank:\n");
  for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    std::printf("  %s\n", store::tier_name(t));
    for (const zero::PlanTerm& p : e.plan.terms) {
      if (p.tier == t) std::printf("    %-62s %12s\n", p.name.c_str(), gib(p.bytes).c_str());
    }
  }
  std::printf("  process (host memory outside the tiers)\n");
  for (const zero::PlanTerm& p : e.plan.process) {
    std::printf("    %-62s %12s\n", p.name.c_str(), gib(p.bytes).c_str());
  }
  const auto [with, without] = activations_with_without(s, e.inputs.compute_dtype);
  std::printf("  (model activations: %s with checkpointing, %s without)\n\n", gib(with).c_str(),
              gib(without).c_str());
  const zero::TierBytes plan = e.plan.bytes();
  std::printf("  %-8s %12s %14s %16s%s\n", "tier", "plan", "formula", "DeepSpeed x1.5",
              measured ? "  measured peak  peak/plan" : "");
  auto row = [&](const char* name, std::uint64_t p, std::uint64_t f,
                 std::optional<std::uint64_t> d, std::optional<std::uint64_t> m) {
    std::printf("  %-8s %12s %14s %16s", name, gib(p).c_str(), gib(f).c_str(),
                d ? gib(*d).c_str() : "-");
    if (m) {
      std::printf("  %13s  %9.3f", gib(*m).c_str(),
                  p > 0 ? static_cast<double>(*m) / static_cast<double>(p) : 0.0);
    }
    std::printf("\n");
  };
  auto ds = [&](std::uint64_t zero::TierBytes::*f) -> std::optional<std::uint64_t> {
    if (!e.deepspeed) return std::nullopt;
    return (*e.deepspeed).*f;
  };
  auto ms = [&](std::uint64_t zero::TierBytes::*f) -> std::optional<std::uint64_t> {
    if (!measured) return std::nullopt;
    return (*measured).*f;
  };
  row("device", plan.device, e.formula.device, ds(&zero::TierBytes::device),
      ms(&zero::TierBytes::device));
  row("host", plan.host, e.formula.host, ds(&zero::TierBytes::host), ms(&zero::TierBytes::host));
  row("nvme", plan.nvme, e.formula.nvme, ds(&zero::TierBytes::nvme), ms(&zero::TierBytes::nvme));
  std::printf("\nfits this machine: %s\n", e.verdict().c_str());
  for (const Estimate::Check& c : e.checks) {
    std::printf("  [%s] %s\n", c.ok ? "ok" : "NO", c.text.c_str());
  }
}

// Every stage and offload choice, as DeepSpeed's estimators print their table.
Result<std::vector<Estimate>> estimate_all(const Setup& s) {
  std::vector<Estimate> rows;
  const char* places[] = {"none", "cpu", "nvme"};
  for (int stage = 0; stage <= 3; ++stage) {
    for (const char* opt : places) {
      if (stage == 0 && std::string(opt) != "none") continue;  // the config refuses it
      for (const char* param : places) {
        if (stage != 3 && std::string(param) != "none") continue;
        Config c = s.config;
        c.zero.stage = stage;
        c.zero.offload_optimizer.device = opt;
        c.zero.offload_param.device = param;
        TZ_ASSIGN_OR_RETURN(Estimate e, estimate_for(s, c));
        rows.push_back(std::move(e));
      }
    }
  }
  return rows;
}

void print_all(const Setup& s, const std::vector<Estimate>& rows) {
  std::printf("%s: %llu parameters (largest layer %llu), %d rank(s), micro-batch %d; per rank; "
              "device %s, %s\n",
              s.shape.name.c_str(), static_cast<unsigned long long>(s.params),
              static_cast<unsigned long long>(s.largest_layer_params), s.flags.ranks,
              s.model_options.micro_batch, s.device_name.c_str(),
              gib(s.device_budget_bytes).c_str());
  std::printf("%-5s %-5s %-5s | %10s %10s %10s | %10s %10s %10s | %10s %10s | %s\n", "stage",
              "optim", "param", "plan dev", "host", "nvme", "formula", "host", "nvme", "DS GPU",
              "DS CPU/rk", "fits");
  for (const Estimate& e : rows) {
    const zero::TierBytes p = e.plan.bytes();
    std::printf("%-5d %-5s %-5s | %10s %10s %10s | %10s %10s %10s | %10s %10s | %s\n",
                e.inputs.stage, offload_name(e.inputs.optimizer).c_str(),
                offload_name(e.inputs.param).c_str(), gib(p.device).c_str(), gib(p.host).c_str(),
                gib(p.nvme).c_str(), gib(e.formula.device).c_str(), gib(e.formula.host).c_str(),
                gib(e.formula.nvme).c_str(),
                e.deepspeed ? gib(e.deepspeed->device).c_str() : "-",
                e.deepspeed ? gib(e.deepspeed->host).c_str() : "-", e.verdict().c_str());
  }
}

int run(const EstimateFlags& flags) {
  auto setup = prepare(flags);
  if (!setup.is_ok()) {
    return report_failure("estimate", setup.status().message());
  }
  const Setup& s = *setup;
  if (flags.all) {
    auto rows = estimate_all(s);
    if (!rows.is_ok()) {
      return report_failure("estimate", rows.status().message());
    }
    if (flags.json) {
      nlohmann::ordered_json j = header_json(s);
      j["rows"] = nlohmann::ordered_json::array();
      for (const Estimate& e : *rows) j["rows"].push_back(estimate_json(e, std::nullopt));
      std::printf("%s\n", j.dump().c_str());
    } else {
      print_all(s, *rows);
    }
    return 0;
  }
  auto est = estimate_for(s, s.config);
  if (!est.is_ok()) {
    return report_failure("estimate", est.status().message());
  }
  std::optional<zero::TierBytes> measured;
  if (flags.measure) {
    if (!est->plan_status.is_ok()) {
      return report_failure("estimate", "--measure: " + est->plan_status.message());
    }
    auto m = measure(s, *est);
    if (!m.is_ok()) {
      return report_failure("estimate", "--measure: " + m.status().message());
    }
    measured = *m;
  }
  if (flags.json) {
    nlohmann::ordered_json j = header_json(s);
    const nlohmann::ordered_json body = estimate_json(*est, measured);
    for (auto it = body.begin(); it != body.end(); ++it) j[it.key()] = it.value();
    const auto [with, without] = activations_with_without(s, est->inputs.compute_dtype);
    j["activation_bytes"] = {{"with_checkpointing", with}, {"without_checkpointing", without}};
    j["machine"] = machine_json();
    std::printf("%s\n", j.dump().c_str());
  } else {
    print_one(s, *est, measured);
  }
  return est->fits() ? 0 : 2;
}

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  auto f = std::make_shared<EstimateFlags>();
  CLI::App* cmd = tree.root->add_subcommand(
      "estimate",
      "Memory per tier and term for a model and a config: the engine's plan, DESIGN.md's formula, "
      "DeepSpeed's estimate, whether it fits this machine (docs/estimate.md)");
  cmd->add_option("--config", f->config_path, "DeepSpeed-style JSON config")->required();
  cmd->add_option("--model", f->model,
                  "A preset (gpt2-124m|350m|774m|1.5b, llama-3.2-1b|3b, llama-3.1-8b, "
                  "qwen3-0.6b|4b, mistral-7b), gpt2:layers=L,heads=H,embd=E,vocab=V,seq=S, "
                  "llama:layers=L,heads=H,kv_heads=K,embd=E,ffn=F,vocab=V,seq=S, or a Hugging "
                  "Face folder (config.json)")
      ->required();
  cmd->add_option("--lora", f->lora,
                  "LoRA on a frozen base: r=R[,alpha=A][,targets=q_proj,v_proj,...|all-linear]"
                  "[,dropout=P] (docs/lora.md)");
  cmd->add_option("--adapter", f->adapter,
                  "LoRA as a PEFT adapter folder's adapter_config.json says (docs/lora.md)");
  cmd->add_option("--ranks", f->ranks, "Data-parallel ranks (default 1)");
  cmd->add_option("--seq", f->seq, "Tokens per sequence (default: the model's positions)")
      ->check(at_least_one());
  cmd->add_option("--micro-batch", f->micro_batch,
                  "Sequences per micro-batch (default: train_micro_batch_size_per_gpu)")
      ->check(at_least_one());
  cmd->add_option("--checkpointing", f->checkpointing,
                  "Activation checkpointing: 1 on, 0 off (default: as train)")
      ->check(CLI::Range(0, 1));
  cmd->add_option("--nvme-path", f->nvme_path, "Directory for both offloads' swap files");
  cmd->add_option("--data", f->data, "--measure: train on this corpus instead of random tokens");
  cmd->add_flag("--all", f->all, "A table over every stage 0-3 and offload choice");
  cmd->add_flag("--measure", f->measure,
                "Run two training steps and print the measured peak per tier next to the plan");
  cmd->add_flag("--json", f->json, "One JSON object");
  cmd->callback([f] { exit_code() = run(*f); });
});

}  // namespace
}  // namespace tz::cli
