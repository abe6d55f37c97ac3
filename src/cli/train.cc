// `tierzero train`: parses the flags, checks what a run can get wrong up front (config, model,
// flags against the config, NVMe space, outputs), then hands the run to the training loop
// (train/trainer.h) on N rank threads of one process (--ranks) or one rank per process under
// mpirun/srun, and prints the summary. Ctrl-C and SIGTERM stop the loop after the current step.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "cli/train_setup.h"
#include "comm/launch_env.h"
#include "comm/select.h"
#include "core/config.h"
#include "core/output_file.h"
#include "core/trace.h"
#include "gpu/select.h"
#include "model/factory.h"
#include "train/report.h"
#include "train/trainer.h"

namespace tz::cli {
namespace {

struct TrainFlags {
  std::string config_path;
  std::string model;
  std::string data;
  std::string val_data;
  int eval_every = 0;
  int val_batches = 20;
  int steps = 50;
  int seq = 0;
  int ranks = 1;
  int cpu_threads = 0;
  int checkpointing = -1;  // -1: the model's default
  std::string nvme_path;
  std::string init;
  std::string save_weights;
  std::string lora;        // --lora r=R,...: adapters on a frozen base (docs/lora.md)
  std::string adapter;     // --adapter DIR: a PEFT adapter folder to start from
  std::string merge_into;  // --merge-into DIR: the base with the adapters merged
  std::string save_dir;  // checkpoints (docs/checkpoints.md)
  int save_every = 0;
  int keep = 3;  // a run saving every step would otherwise keep every checkpoint
  std::string resume;
  std::string metrics;
  std::string trace_out;
  std::optional<std::uint64_t> seed;
  bool shuffle = false;
  bool json = false;
  bool no_bandwidth_probe = false;  // leave the bound's NVMe and copy terms out (no probe)
};

// The signal that asked the run to stop: SIGINT (Ctrl-C) or SIGTERM (what cluster schedulers,
// mpirun and srun send on preemption), 0 while none has. Every rank reads it after a step and
// the ranks agree (any rank's flag stops all) through the per-step gather, so they all stop after
// the same step, save when --save-dir is set, and remove their swap files on the way out.
volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_stop_signal(int sig) {
  g_interrupted = sig;
  std::signal(sig, SIG_DFL);  // the same signal again ends the process at once
}

// Everything checked before a rank starts; shared read-only by the rank threads.
struct RunSetup {
  TrainFlags flags;
  Config config;
  model::ModelDesc shape;
  int world = 1;
  bool launched = false;  // one rank per process under a launcher
  comm::LaunchEnv launch;
  std::optional<train::Trainer> trainer;  // the loop (train/trainer.h), data loaded
};

// Bytes the optimizer keeps per parameter besides the fp32 master (its state arrays).
std::uint64_t optimizer_state_bytes_per_param(const Config& c) {
  const std::uint64_t state = c.tierzero.state_dtype == "bf16" ? 2 : 4;
  const std::string& t = c.optimizer.type;
  if (t == "Adam" || t == "AdamW") return 2 * state;
  if (t == "SGD") return c.optimizer.momentum > 0 ? state : 0;
  return state;  // Lion's m, Adagrad's sum
}

// The flags that need neither config nor model, and the launcher against --ranks.
Status check_flags(const TrainFlags& f, RunSetup& s) {
  if (f.steps < 1) return Status::invalid_argument("--steps must be at least 1");
  if (f.ranks < 1) return Status::invalid_argument("--ranks must be at least 1");
  {
    // Each rank thread runs its own engine: device streams, the store's mover, an optimizer
    // arena and its kernels' threads, each with its own buffers. Past a few per core they only
    // add memory and context switches (200 on 2 cores grew to 8 GB without finishing a step).
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int max_ranks = std::max(8, 8 * cores);
    if (f.ranks > max_ranks) {
      return Status::invalid_argument(
          "--ranks " + std::to_string(f.ranks) + ": at most " + std::to_string(max_ranks) +
          " ranks as threads on this machine's " + std::to_string(cores) +
          " cores (each runs its own engine, streams and optimizer threads); for more ranks "
          "run one process per rank under mpirun or srun");
    }
  }
  if (f.eval_every < 0) return Status::invalid_argument("--eval-every must be >= 0");
  if (f.eval_every > 0 && f.val_data.empty()) {
    return Status::invalid_argument("--eval-every needs --val-data");
  }
  s.launch = comm::detect_launch_env();
  s.launched = s.launch.world_size > 1;
  if (s.launched && f.ranks > 1) {
    return Status::invalid_argument(
        "--ranks " + std::to_string(f.ranks) + " under " + s.launch.launcher + " with " +
        std::to_string(s.launch.world_size) + " processes: use threads or processes, not both");
  }
  s.world = s.launched ? s.launch.world_size : f.ranks;
  const Config& c = s.config;
  const std::uint64_t b = c.train_micro_batch_size_per_gpu;
  const std::uint64_t k = c.gradient_accumulation_steps;
  if (c.train_batch_size != 0 &&
      c.train_batch_size != b * k * static_cast<std::uint64_t>(s.world)) {
    return Status::invalid_argument(
        f.config_path + ": train_batch_size " + std::to_string(c.train_batch_size) +
        " contradicts " + std::to_string(s.world) + " rank(s) x train_micro_batch_size_per_gpu " +
        std::to_string(b) + " x gradient_accumulation_steps " + std::to_string(k) + " = " +
        std::to_string(b * k * static_cast<std::uint64_t>(s.world)));
  }
  return Status::ok();
}

// NVMe: every path an offload names must take a file and hold its share of the state (the
// engine reports the exact plan; this is the early, approximate check).
// Parameters the optimizer updates (checkpoints hold their state): every unit's but a LoRA
// run's frozen base.
std::uint64_t trainable_params(const model::ModelDesc& shape) {
  std::uint64_t n = 0;
  for (const zero::UnitSpec& u : model::unit_specs(shape)) {
    if (u.frozen) continue;
    for (const zero::TensorSpec& t : u.tensors) n += t.numel();
  }
  return n;
}

Status check_nvme_space(const RunSetup& s, DType compute) {
  const TrainFlags& f = s.flags;
  const Config& c = s.config;
  TZ_RETURN_IF_ERROR(check_nvme_path_used(c, f.config_path, f.nvme_path));
  // Every unit's 16-bit parameters; the optimizer's state for the trainable ones only (with
  // LoRA the frozen base has none).
  const std::uint64_t trainable = trainable_params(s.shape);
  const std::uint64_t params =
      s.shape.param_count() + (s.shape.lora ? trainable : 0);
  std::vector<std::pair<std::string, std::uint64_t>> needs;
  auto add_need = [&](const std::string& config_path, std::uint64_t bytes) {
    const std::string dir = f.nvme_path.empty() ? config_path : f.nvme_path;
    for (auto& [d, n] : needs) {
      if (d == dir) {
        n += bytes;
        return;
      }
    }
    needs.emplace_back(dir, bytes);
  };
  if (c.zero.offload_param.device == "nvme") {
    add_need(c.zero.offload_param.nvme_path, params * dtype_size(compute));
  }
  if (c.zero.offload_optimizer.device == "nvme") {
    add_need(c.zero.offload_optimizer.nvme_path,
             trainable * (4 + optimizer_state_bytes_per_param(c)));
  }
  for (const auto& [dir, bytes] : needs) {
    if (dir.empty()) {
      return Status::invalid_argument(f.config_path +
                                      ": an offload device is nvme but no nvme_path is set "
                                      "(give --nvme-path DIR)");
    }
    TZ_RETURN_IF_ERROR(check_swap_path(dir, bytes));
  }
  return Status::ok();
}

// Every output the run will write, checked now rather than after the work: the folder can be
// written (made when missing), the file is none of the inputs, and a checkpoint (fp32 master
// plus the optimizer's state, as the save writes them) fits in the free space.
Status check_outputs(const RunSetup& s) {
  const TrainFlags& f = s.flags;
  const std::vector<std::string> inputs = {f.config_path, f.data, f.val_data, f.init};
  if (!f.save_weights.empty()) {
    if (s.shape.family == "gpt2") {
      TZ_RETURN_IF_ERROR(check_output("--save-weights", f.save_weights, inputs));
    } else {
      // The Llama family saves a folder: never the one the model was read from.
      if (!s.shape.folder.empty() &&
          std::filesystem::weakly_canonical(f.save_weights) ==
              std::filesystem::weakly_canonical(s.shape.folder)) {
        return Status::invalid_argument("--save-weights: " + f.save_weights +
                                        " is the model's own folder (--model); save elsewhere");
      }
      TZ_RETURN_IF_ERROR(check_folder("--save-weights", f.save_weights));
    }
  }
  if (!f.merge_into.empty()) {
    if (!s.shape.lora) {
      return Status::invalid_argument("--merge-into needs adapters (--lora or --adapter)");
    }
    if (!s.shape.folder.empty() && std::filesystem::weakly_canonical(f.merge_into) ==
                                       std::filesystem::weakly_canonical(s.shape.folder)) {
      return Status::invalid_argument("--merge-into: " + f.merge_into +
                                      " is the model's own folder (--model); write elsewhere");
    }
    TZ_RETURN_IF_ERROR(check_folder("--merge-into", f.merge_into));
  }
  const std::string trace = !f.trace_out.empty() ? f.trace_out : s.config.tierzero.trace_path;
  if (!trace.empty()) TZ_RETURN_IF_ERROR(check_output("--trace-out", trace, inputs));
  if (!f.metrics.empty()) TZ_RETURN_IF_ERROR(check_output("--metrics", f.metrics, inputs));
  if (!f.save_dir.empty()) {
    const std::uint64_t bytes =
        trainable_params(s.shape) * (4 + optimizer_state_bytes_per_param(s.config));
    TZ_RETURN_IF_ERROR(check_folder("--save-dir", f.save_dir, bytes));
  }
  return Status::ok();
}

// The loop's description of the run (train/trainer.h) from the flags and the config.
train::TrainSpec train_spec(const RunSetup& s, int seq) {
  const TrainFlags& f = s.flags;
  const Config& c = s.config;
  train::TrainSpec t;
  t.seed = f.seed.value_or(static_cast<std::uint64_t>(c.tierzero.seed));
  // Rank threads share the cores: each gets its share unless --cpu-threads says otherwise (one
  // process per rank under a launcher takes every core it may run on).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  t.model_options = model_options_for(
      c, seq, f.checkpointing,
      f.cpu_threads > 0 ? f.cpu_threads : (s.launched ? 0 : std::max(1, cores / s.world)));
  t.engine = engine_options_for(c, s.shape, t.model_options, f.nvme_path, t.seed);
  if (!f.no_bandwidth_probe) count_probe_in_plan(t.engine);  // bound_bandwidths_hook
  t.model = s.shape;
  t.world = s.world;
  t.steps = f.steps;
  t.data = f.data;
  t.val_data = f.val_data;
  t.eval_every = f.eval_every;
  t.val_batches = f.val_batches;
  t.shuffle = f.shuffle;
  t.init = f.init;
  t.save_dir = f.save_dir;
  t.save_every = f.save_every;
  t.keep = f.keep;
  t.resume = f.resume;
  t.save_weights = f.save_weights;
  t.merge_into = f.merge_into;
  t.base = model::base_identity(s.shape, f.init, t.seed);
  return t;
}

// The checks that need no rank: config, model, flags against the config, NVMe space, outputs,
// then the data (Trainer::create).
Result<RunSetup> prepare(const TrainFlags& f) {
  RunSetup s;
  s.flags = f;
  TZ_ASSIGN_OR_RETURN(s.config, load_run_config("train", f.config_path, f.nvme_path));
  TZ_ASSIGN_OR_RETURN(s.shape, resolve_run_model(f.model, f.lora, f.adapter));
  const int seq = f.seq > 0 ? f.seq : s.shape.seq;
  if (f.seq < 0) return Status::invalid_argument("--seq must be positive");
  if (seq > s.shape.seq) {
    return Status::invalid_argument("--seq " + std::to_string(seq) + " is longer than " +
                                    s.shape.name + "'s " + std::to_string(s.shape.seq) +
                                    " positions");
  }
  TZ_RETURN_IF_ERROR(check_flags(f, s));
  TZ_RETURN_IF_ERROR(check_nvme_space(s, compute_dtype_of(s.config)));
  TZ_RETURN_IF_ERROR(check_outputs(s));
  TZ_ASSIGN_OR_RETURN(train::Trainer trainer, train::Trainer::create(train_spec(s, seq)));
  s.trainer.emplace(std::move(trainer));
  return s;
}

// Median over the steps after the first (the first records the access trace and fills caches);
// over all of them when there is only one.
double steady_median(const std::vector<double>& v) {
  if (v.size() <= 1) return median(v);
  return median(std::vector<double>(v.begin() + 1, v.end()));
}

// The term that set the bound most often over the same steps (the last step's on a tie).
std::string steady_bound_term(const std::vector<std::string>& terms) {
  if (terms.empty()) return "compute";
  const std::vector<std::string> later(terms.begin() + (terms.size() > 1 ? 1 : 0), terms.end());
  std::string best = later.back();
  auto best_count = std::count(later.begin(), later.end(), best);
  for (const std::string& t : later) {
    const auto count = std::count(later.begin(), later.end(), t);
    if (count > best_count) {
      best = t;
      best_count = count;
    }
  }
  return best;
}

// Each bound term's median over the same steps.
zero::BoundTerms steady_bound_terms(const std::vector<zero::BoundTerms>& terms) {
  if (terms.size() <= 1) return median_bound_terms(terms);
  return median_bound_terms(std::vector<zero::BoundTerms>(terms.begin() + 1, terms.end()));
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void print_summary(const RunSetup& s, const train::TrainResult& r) {
  const double step_med = steady_median(r.step_s);
  const double tokens_per_s = step_med > 0 ? static_cast<double>(s.trainer->tokens_per_step()) / step_med : 0;
  if (s.flags.json) {
    nlohmann::ordered_json j;
    j["command"] = "train";
    j["model"] = s.shape.name;
    j["ranks"] = s.world;
    j["steps"] = r.steps;
    j["interrupted"] = r.interrupted;
    j["final_loss"] = r.final_loss;
    j["val_loss"] = r.val_loss ? nlohmann::ordered_json(*r.val_loss) : nlohmann::ordered_json();
    j["tokens_per_step"] = s.trainer->tokens_per_step();
    j["tokens_per_s"] = tokens_per_s;
    j["step_s_median"] = step_med;
    j["bound_s"] = steady_median(r.bound_s);
    j["bound_term"] = steady_bound_term(r.bound_term_names);
    j["bound_terms_s"] = steady_bound_terms(r.bound_terms).to_json();
    j["bandwidth_bytes_per_s"] = r.bandwidths;
    j["nvme_ceiling_scale"] = r.nvme_ceiling_scale;
    j["params"] = r.params;
    j["params_xxh3"] = hex64(r.params_xxh3);
    j["peak_bytes"] = r.peak_bytes.to_json();
    j["plan_bytes"] = r.plan_bytes.to_json();
    j["comm_bytes"] = r.comm_bytes;
    j["comm_formula_bytes"] = r.comm_formula_bytes;
    j["nvme_bytes_per_param"] = {{"read", steady_median(r.nvme_read_per_param)},
                                 {"write", steady_median(r.nvme_write_per_param)}};
    j["machine"] = machine_json();
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("trained %s for %lld steps on %d rank(s)%s: final loss %.4f", s.shape.name.c_str(),
              static_cast<long long>(r.steps), s.world, r.interrupted ? " (interrupted)" : "",
              r.final_loss);
  if (r.val_loss) std::printf(", val loss %.4f", *r.val_loss);
  std::printf("\n  %.0f tokens/s, median step %.3f s (bound %.3f s, %s), %llu params, xxh3 %s\n",
              tokens_per_s, step_med, steady_median(r.bound_s),
              steady_bound_term(r.bound_term_names).c_str(),
              static_cast<unsigned long long>(r.params), hex64(r.params_xxh3).c_str());
  if (!r.bound_terms.empty()) {
    std::printf("  bound terms: %s\n",
                train::bound_terms_text(steady_bound_terms(r.bound_terms)).c_str());
    if (r.nvme_ceiling_scale > 1) {
      std::printf("  the disk ran %.2fx the probe's bandwidths: the NVMe term counts that\n",
                  r.nvme_ceiling_scale);
    }
  }
  std::printf("  peak %s\n  plan %s\n  nvme per param per step: %.2f B read, %.2f B written\n",
              train::tier_text(r.peak_bytes).c_str(), train::tier_text(r.plan_bytes).c_str(),
              steady_median(r.nvme_read_per_param), steady_median(r.nvme_write_per_param));
}

// The hook that measures the bandwidths of the step's bound (train::TrainIo::bound_bandwidths;
// cli/bench_common.h SharedCeilings: the disk under the run's swap paths when a tier is on NVMe;
// memcpy for the copies on a host-memory device, whose copies are memcpy), once for every rank of
// this process, once their engine has checked its memory plan; rank 0 prints the figures before
// its first step line (train/report.h). None with --no-bandwidth-probe: the bound then leaves
// those terms out.
std::function<Status(bool, zero::EngineOptions&)> bound_bandwidths_hook(const RunSetup& s,
                                                                       SharedCeilings& probe) {
  if (s.flags.no_bandwidth_probe) return {};
  return [&probe](bool device_is_host_memory, zero::EngineOptions& eo) {
    return probe.measure(device_is_host_memory, eo)
        .with_context("measuring the step bound's bandwidths (--no-bandwidth-probe skips it)");
  };
}

// Runs every rank of this process: one under a launcher (the machine's device and the launcher's
// communicator), or the --ranks threads. Each rank measures the bound's bandwidths (once for all)
// after its plan is checked (bound_bandwidths_hook).
Status run_ranks(RunSetup& s, train::TrainIo io, train::TrainResult& summary) {
  const std::uint64_t budget = s.config.tierzero.device_budget;
  SharedCeilings probe("train");
  io.bound_bandwidths = bound_bandwidths_hook(s, probe);
  if (!s.launched && s.world > 1) {
    // The rank threads run on HostDevices (zero::run_local_ranks).
    return s.trainer->run_local_ranks(budget, io, &summary);
  }
  // One rank in this process: the device the machine has (CUDA or HostDevice) and the launcher's
  // communicator (NCCL on GPUs, MPI on CPUs; a single-rank LocalComm alone).
  TZ_ASSIGN_OR_RETURN(auto device, gpu::open_device({.budget_bytes = budget}));
  TZ_ASSIGN_OR_RETURN(auto comm, comm::open_comm(*device, comm::CommBackend::kAuto));
  return s.trainer->run_rank(comm->rank(), *device, *comm, io, &summary);
}

int run(const TrainFlags& flags) {
  auto setup = prepare(flags);
  if (!setup.is_ok()) {
    return report_failure("train", setup.status().message());
  }
  RunSetup& s = *setup;
  const std::string trace_path =
      !flags.trace_out.empty() ? flags.trace_out : s.config.tierzero.trace_path;
  if (!trace_path.empty()) Trace::global().enable();

  const bool writes = !s.launched || s.launch.rank == 0;
  // --metrics goes to a temporary name while the run goes and is renamed into place at its
  // end (core/output_file.h), also after a failed or interrupted run: its lines are whole records.
  std::optional<OutputFile> metrics_file;
  if (!flags.metrics.empty() && writes) {
    auto created = OutputFile::create("--metrics", flags.metrics,
                                      {flags.config_path, flags.data, flags.val_data, flags.init});
    if (!created.is_ok()) return report_failure("train", created.status());
    metrics_file.emplace(std::move(created).value());
  }
  train::TrainIo io;
  io.metrics = metrics_file ? &*metrics_file : nullptr;
  io.stop = [](std::int64_t) { return g_interrupted != 0; };
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  train::TrainResult summary;
  Status st = run_ranks(s, io, summary);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (metrics_file && metrics_file->is_open()) {
    if (Status ms = metrics_file->commit(); !ms.is_ok() && st.is_ok()) st = ms;
  }
  if (!st.is_ok()) {
    return report_failure("train", st.message());
  }
  if (!trace_path.empty()) {
    const std::string path = s.launched && s.launch.rank > 0
                                 ? trace_path + ".rank" + std::to_string(s.launch.rank)
                                 : trace_path;
    const Status ts = Trace::global().write(path);
    if (!ts.is_ok()) {
      return report_failure("train", ts.message());
    }
  }
  if (writes) print_summary(s, summary);
  // 128 + the signal, as a shell reports a process the signal ended (130 for Ctrl-C, 143 for
  // SIGTERM); a process stopped by another rank's signal reports SIGINT's.
  if (!summary.interrupted) return 0;
  return 128 + (g_interrupted != 0 ? static_cast<int>(g_interrupted) : SIGINT);
}

// The flags of `tierzero train` into `f` (the seed's option is returned: given or not).
CLI::Option* add_train_flags(CLI::App* cmd, TrainFlags& f, std::uint64_t& seed) {
  cmd->add_option("--config", f.config_path, "DeepSpeed-style JSON config")->required();
  cmd->add_option("--model", f.model,
                  "A preset (gpt2-124m|350m|774m|1.5b, llama-3.2-1b|3b, llama-3.1-8b, "
                  "qwen3-0.6b|4b, mistral-7b), gpt2:layers=L,heads=H,embd=E,vocab=V,seq=S, "
                  "llama:layers=L,heads=H,kv_heads=K,embd=E,ffn=F,vocab=V,seq=S, or a Hugging "
                  "Face folder (config.json + safetensors; its weights are the start)")
      ->required();
  cmd->add_option("--data", f.data,
                  "llm.c token file (.bin) or plain text read as bytes (vocab 256); default: "
                  "seeded random tokens");
  cmd->add_option("--val-data", f.val_data, "Validation corpus (same formats)");
  cmd->add_option("--eval-every", f.eval_every,
                  "Validation loss every K steps (and before the first); 0 = at the end only");
  cmd->add_option("--val-batches", f.val_batches,
                  "Validation micro-batches in the fixed set, over all ranks (default 20)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--steps", f.steps, "Optimizer steps (default 50)");
  cmd->add_option("--seq", f.seq, "Tokens per sequence (default: the model's positions)")
      ->check(at_least_one());
  cmd->add_option("--ranks", f.ranks, "Ranks as threads of this process (default 1)");
  cmd->add_option("--cpu-threads", f.cpu_threads,
                  "Threads of each rank's CPU kernels (default: the cores divided among --ranks)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--checkpointing", f.checkpointing,
                  "Activation checkpointing: 1 on, 0 off (default: on for presets above gpt2-124m)")
      ->check(CLI::Range(0, 1));
  cmd->add_option("--nvme-path", f.nvme_path, "Directory for both offloads' swap files");
  cmd->add_option("--init", f.init, "Initial weights (HF safetensors file or folder) instead of HF's init");
  cmd->add_option("--save-dir", f.save_dir,
                  "Write checkpoints into DIR/step-N (after every --save-every steps, the last step "
                  "and Ctrl-C); crash-consistent, by parameter (docs/checkpoints.md)");
  cmd->add_option("--save-every", f.save_every, "Steps between checkpoints (0: only at the end)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--keep", f.keep, "Checkpoints to keep, newest first (default 3; 0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--resume", f.resume,
                  "Continue from a checkpoint (DIR/step-N) or the latest in DIR; any rank count, "
                  "stage or offload (a reshard)");
  cmd->add_option("--save-weights", f.save_weights,
                  "Write the final weights as HF safetensors: GPT-2 a file (+ config.json beside it), the "
                  "Llama family a folder transformers loads");
  cmd->add_option("--lora", f.lora,
                  "Train LoRA adapters on a frozen base: r=R[,alpha=A][,targets=q_proj,v_proj,...|"
                  "all-linear][,dropout=P] (docs/lora.md)");
  cmd->add_option("--adapter", f.adapter,
                  "Train (or continue) the PEFT LoRA adapter in DIR on a frozen base; "
                  "--save-weights then writes a PEFT folder (docs/lora.md)");
  cmd->add_option("--merge-into", f.merge_into,
                  "With adapters: write the base with them merged (W + alpha/r B A) as a Hugging "
                  "Face folder");
  cmd->add_option("--metrics", f.metrics, "One JSON object per step to this file (JSONL)");
  cmd->add_option("--trace-out", f.trace_out, "Chrome trace of the run (open in Perfetto)");
  CLI::Option* seed_opt = cmd->add_option("--seed", seed,
                                          "Seed of the init, the shuffle and synthetic data "
                                          "(default: tierzero.seed)");
  cmd->add_flag("--shuffle", f.shuffle, "Permute sequence offsets each epoch (seeded)");
  cmd->add_flag("--json", f.json, "Print the final summary as one JSON object");
  cmd->add_flag("--no-bandwidth-probe", f.no_bandwidth_probe,
                "Skip measuring the disk under the swap paths and memcpy at startup (about 1 s); "
                "the step's bound then leaves out the NVMe and copy terms");
  return seed_opt;
}

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  auto f = std::make_shared<TrainFlags>();
  auto seed = std::make_shared<std::uint64_t>(0);
  CLI::App* cmd = tree.root->add_subcommand("train",
                                            "Train a model (GPT-2 or the Llama family) with ZeRO and "
                                            "tiered offload as a DeepSpeed config says (docs/train.md)");
  CLI::Option* seed_opt = add_train_flags(cmd, *f, *seed);
  cmd->callback([f, seed, seed_opt] {
    if (seed_opt->count() > 0) f->seed = *seed;
    exit_code() = run(*f);
  });
});

}  // namespace
}  // namespace tz::cli
