// `tierzero train`: trains a model (model/factory.h) end to end on the ZeRO engine (zero/engine.h) with the
// DeepSpeed config's stage, offload, precision and optimizer, on N rank threads of one process
// (--ranks) or one rank per process under mpirun/srun. Everything a run can get wrong up front
// (model, data, flags against the config, NVMe space) is checked before the first step; every
// step is reported as a progress bar, a plain line and a --metrics JSON line.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "cli/train_setup.h"
#include "comm/launch_env.h"
#include "comm/select.h"
#include "core/config.h"
#include "core/output_file.h"
#include "core/progress.h"
#include "core/trace.h"
#include "core/units.h"
#include "gpu/select.h"
#include "model/data.h"
#include "model/factory.h"
#include "zero/checkpoint.h"
#include "zero/engine.h"

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
  std::string save_dir;  // checkpoints (docs/checkpoints.md)
  int save_every = 0;
  int keep = 3;  // a run saving every step would otherwise keep every checkpoint
  std::string resume;
  std::string metrics;
  std::string trace_out;
  std::optional<std::uint64_t> seed;
  bool shuffle = false;
  bool json = false;
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
  model::ModelOptions model_options;
  DType compute = DType::kF32;
  std::uint64_t seed = 1234;
  int world = 1;
  bool launched = false;  // one rank per process under a launcher
  comm::LaunchEnv launch;
  std::shared_ptr<const model::TokenData> train_data;  // the corpus, or synthetic tokens
  std::shared_ptr<const model::TokenData> val_data;    // null without --val-data
  std::uint64_t tokens_per_step = 0;                   // B * T * k * N
};

// What rank 0 hands back for the summary.
struct RunSummary {
  std::int64_t steps = 0;
  bool interrupted = false;
  double final_loss = 0;
  std::optional<double> val_loss;
  std::vector<double> step_s;
  std::vector<double> bound_s;
  std::vector<double> nvme_read_per_param;
  std::vector<double> nvme_write_per_param;
  std::uint64_t params = 0;
  std::uint64_t params_xxh3 = 0;
  zero::TierBytes peak_bytes;
  zero::TierBytes plan_bytes;
  nlohmann::ordered_json comm_bytes;
  nlohmann::ordered_json comm_formula_bytes;
};

// Bytes the optimizer keeps per parameter besides the fp32 master (its state arrays).
std::uint64_t optimizer_state_bytes_per_param(const Config& c) {
  const std::uint64_t state = c.tierzero.state_dtype == "bf16" ? 2 : 4;
  const std::string& t = c.optimizer.type;
  if (t == "Adam" || t == "AdamW") return 2 * state;
  if (t == "SGD") return c.optimizer.momentum > 0 ? state : 0;
  return state;  // Lion's m, Adagrad's sum
}

// The checks that need no rank: config, model, flags against the config, data, NVMe space.
Result<RunSetup> prepare(const TrainFlags& f) {
  RunSetup s;
  s.flags = f;
  TZ_ASSIGN_OR_RETURN(s.config, load_run_config("train", f.config_path, f.nvme_path));
  TZ_ASSIGN_OR_RETURN(s.shape, model::resolve_model(f.model));
  const int seq = f.seq > 0 ? f.seq : s.shape.seq;
  if (f.seq < 0) return Status::invalid_argument("--seq must be positive");
  if (seq > s.shape.seq) {
    return Status::invalid_argument("--seq " + std::to_string(seq) + " is longer than " +
                                    s.shape.name + "'s " + std::to_string(s.shape.seq) +
                                    " positions");
  }
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
  const bool param_nvme = c.zero.offload_param.device == "nvme";
  const bool opt_nvme = c.zero.offload_optimizer.device == "nvme";
  TZ_RETURN_IF_ERROR(check_nvme_path_used(c, f.config_path, f.nvme_path));
  s.compute = compute_dtype_of(c);
  s.seed = f.seed.value_or(static_cast<std::uint64_t>(c.tierzero.seed));
  // Rank threads share the cores: each gets its share unless --cpu-threads says otherwise (one
  // process per rank under a launcher takes every core it may run on).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  s.model_options = model_options_for(
      c, seq, f.checkpointing,
      f.cpu_threads > 0 ? f.cpu_threads : (s.launched ? 0 : std::max(1, cores / s.world)));

  // NVMe: every path an offload names must take a file and hold its share of the state (the
  // engine reports the exact plan; this is the early, approximate check).
  const std::uint64_t params = s.shape.param_count();
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
  if (param_nvme) add_need(c.zero.offload_param.nvme_path, params * dtype_size(s.compute));
  if (opt_nvme) {
    add_need(c.zero.offload_optimizer.nvme_path, params * (4 + optimizer_state_bytes_per_param(c)));
  }
  for (const auto& [dir, bytes] : needs) {
    if (dir.empty()) {
      return Status::invalid_argument(f.config_path +
                                      ": an offload device is nvme but no nvme_path is set "
                                      "(give --nvme-path DIR)");
    }
    TZ_RETURN_IF_ERROR(check_swap_path(dir, bytes));
  }

  // Every output the run will write, checked now rather than after the work: the folder can be
  // written (made when missing), the file is none of the inputs, and a checkpoint (fp32 master
  // plus the optimizer's state, as the save writes them) fits in the free space.
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
  const std::string trace = !f.trace_out.empty() ? f.trace_out : c.tierzero.trace_path;
  if (!trace.empty()) TZ_RETURN_IF_ERROR(check_output("--trace-out", trace, inputs));
  if (!f.metrics.empty()) TZ_RETURN_IF_ERROR(check_output("--metrics", f.metrics, inputs));
  if (!f.save_dir.empty()) {
    TZ_RETURN_IF_ERROR(
        check_folder("--save-dir", f.save_dir, params * (4 + optimizer_state_bytes_per_param(c))));
  }

  const std::int64_t per_micro = static_cast<std::int64_t>(b) * seq;
  s.tokens_per_step =
      static_cast<std::uint64_t>(per_micro) * k * static_cast<std::uint64_t>(s.world);
  if (!f.data.empty()) {
    TZ_ASSIGN_OR_RETURN(model::TokenData d, model::load_tokens(f.data, s.shape.vocab));
    s.train_data = std::make_shared<const model::TokenData>(std::move(d));
  } else {
    // No corpus: uniform random tokens (seeded), enough for two steps' worth of distinct
    // batches, for measuring step time on a shape without a tokenized corpus.
    s.train_data = std::make_shared<const model::TokenData>(
        model::synthetic_tokens(2 * s.tokens_per_step + 1, s.shape.vocab, s.seed));
  }
  if (!f.val_data.empty()) {
    TZ_ASSIGN_OR_RETURN(model::TokenData d, model::load_tokens(f.val_data, s.shape.vocab));
    s.val_data = std::make_shared<const model::TokenData>(std::move(d));
  }
  // The loaders' size checks are the same on every rank: run them here so a short file stops the
  // run before any rank starts.
  model::LoaderOptions lo{.micro_batch = static_cast<int>(b),
                          .seq = seq,
                          .rank = 0,
                          .world_size = s.world,
                          .shuffle = f.shuffle,
                          .seed = s.seed};
  TZ_RETURN_IF_ERROR(model::DataLoader::create(s.train_data, lo).take_status());
  if (s.val_data) {
    TZ_RETURN_IF_ERROR(model::make_validation_set(s.val_data, lo, f.val_batches).take_status());
  }
  return s;
}

// Every rank's few scalars gathered to every rank (rank order), bit-exact: the values travel as
// raw bytes through an all-gather, and each rank sums them in the same order, so the loss printed
// and the decision to stop are identical on every rank and for threads or processes.
class RankScalars {
 public:
  static constexpr std::size_t kCount = 4;  // loss sum, stop flag, val loss sum, val batches

  static Result<RankScalars> create(gpu::Device& device, comm::Comm& comm) {
    RankScalars r(device, comm);
    const std::size_t bytes = kCount * sizeof(double);
    TZ_ASSIGN_OR_RETURN(r.send_, device.allocate(bytes));
    TZ_ASSIGN_OR_RETURN(r.recv_,
                        device.allocate(bytes * static_cast<std::size_t>(comm.world_size())));
    return r;
  }

  // Returns the element-wise sum over ranks (in rank order) of every rank's `values`.
  Result<std::array<double, kCount>> sum(const std::array<double, kCount>& values,
                                         gpu::Stream& stream) {
    const std::size_t bytes = kCount * sizeof(double);
    const auto world = static_cast<std::size_t>(comm_->world_size());
    // Nothing of the engine's may still be in flight on another stream when the gather pairs up
    // across ranks.
    TZ_RETURN_IF_ERROR(device_->synchronize());
    TZ_RETURN_IF_ERROR(device_->copy_async(send_.data(), values.data(), bytes,
                                           gpu::CopyKind::kHostToDevice, stream));
    TZ_RETURN_IF_ERROR(
        comm_->all_gather(send_.data(), recv_.data(), bytes / sizeof(float), DType::kF32, stream));
    std::vector<double> all(kCount * world);
    TZ_RETURN_IF_ERROR(device_->copy_async(all.data(), recv_.data(), bytes * world,
                                           gpu::CopyKind::kDeviceToHost, stream));
    TZ_RETURN_IF_ERROR(stream.synchronize());
    TZ_RETURN_IF_ERROR(comm_->async_error());
    std::array<double, kCount> out{};
    for (std::size_t r = 0; r < world; ++r) {
      for (std::size_t i = 0; i < kCount; ++i) out[i] += all[r * kCount + i];
    }
    return out;
  }

 private:
  RankScalars(gpu::Device& device, comm::Comm& comm) : device_(&device), comm_(&comm) {}
  gpu::Device* device_;
  comm::Comm* comm_;
  gpu::DeviceBuffer send_;
  gpu::DeviceBuffer recv_;
};

std::string tier_text(const zero::TierBytes& b) {
  return "device " + format_bytes(static_cast<double>(b.device)) + " host " +
         format_bytes(static_cast<double>(b.host)) + " nvme " +
         format_bytes(static_cast<double>(b.nvme));
}

// The mean validation loss over the fixed set (every rank its share; collective).
Result<double> evaluate(model::Model& net, const model::ValidationSet& val, RankScalars& scalars,
                        gpu::Stream& stream) {
  const auto bt = static_cast<std::size_t>(val.loader.tokens_per_micro_batch());
  std::vector<std::int32_t> tok(bt), tgt(bt);
  double sum = 0;
  for (int i = 0; i < val.batches_per_rank; ++i) {
    val.loader.batch(i, tok, tgt);
    TZ_ASSIGN_OR_RETURN(double l, net.eval_loss(tok, tgt));
    sum += l;
  }
  TZ_ASSIGN_OR_RETURN(auto total,
                      scalars.sum({0, 0, sum, static_cast<double>(val.batches_per_rank)}, stream));
  return total[2] / total[3];
}

// Rank 0's output: the progress bar, the plain lines and the metrics file.
class Reporter {
 public:
  Reporter(const RunSetup& s, OutputFile* metrics) : s_(s), metrics_(metrics) {
    // As core/progress.h decides: a bar on a terminal outside CI, plain lines otherwise.
    interactive_ = isatty(fileno(stderr)) == 1 && std::getenv("CI") == nullptr;
    if (interactive_) {
      bar_ =
          std::make_unique<Progress>("train", static_cast<std::uint64_t>(s.flags.steps), "steps");
    }
  }

  void line(const std::string& text) {
    if (interactive_) std::fprintf(stderr, "\r\033[K");
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
  }

  void step(const zero::StepReport& r, double loss, std::optional<double> val_loss) {
    const double tokens_per_s =
        r.step_s > 0 ? static_cast<double>(s_.tokens_per_step) / r.step_s : 0;
    const double stall = r.step_s > 0 ? r.stall_s / r.step_s : 0;
    // What the rank's thread waited on, as shares of the step (docs/train.md, "Output"): gathering
    // parameters from host/NVMe, reducing and copying gradients (without a GPU this includes the
    // kernels' own compute, which the thread waits for there), the CPU optimizer step.
    const auto share = [&](double s) { return r.step_s > 0 ? s / r.step_s : 0.0; };
    const double wait_params = share(r.stall_gather_s);
    const double wait_grads = share(r.stall_reduce_s);
    const double wait_optimizer = share(r.stall_optimizer_s);
    if (metrics_ != nullptr) {
      nlohmann::ordered_json j;
      j["step"] = r.step;
      j["loss"] = loss;
      j["lr"] = r.lr;
      j["grad_norm"] = r.grad_norm;
      j["loss_scale"] = r.loss_scale;
      j["step_s"] = r.step_s;
      j["tokens_per_s"] = tokens_per_s;
      j["bound_s"] = r.bound_s;
      j["stall_fraction"] = stall;
      j["wait_params_fraction"] = wait_params;
      j["wait_grads_fraction"] = wait_grads;
      j["wait_optimizer_fraction"] = wait_optimizer;
      j["bytes_in_use"] = r.bytes_in_use.to_json();
      j["skipped"] = r.skipped;
      j["nvme_read_bytes"] = r.nvme_read_bytes;
      j["nvme_write_bytes"] = r.nvme_write_bytes;
      if (val_loss) j["val_loss"] = *val_loss;
      // One write per line: the file holds whole records only. A failed write (a full disk)
      // drops the file, says so once and lets the run go on.
      if (Status ws = metrics_->write(j.dump() + "\n"); !ws.is_ok()) {
        line("warning: --metrics: " + ws.message() + "; no metrics file will be written");
        metrics_ = nullptr;
      }
    }
    const auto every = std::max<std::uint64_t>(1, s_.config.steps_per_print);
    const bool last = r.step == s_.flags.steps;
    if (static_cast<std::uint64_t>(r.step) % every == 0 || last || val_loss) {
      char buf[512];
      std::snprintf(buf, sizeof(buf),
                    "step %lld/%d | loss %.4f | lr %.3e | grad norm %.4f | loss scale %g | "
                    "%.3f s | %.0f tok/s | bound %.3f s | waits: params %.0f%% grads %.0f%% "
                    "optimizer %.0f%% | %s%s%s",
                    static_cast<long long>(r.step), s_.flags.steps, loss, r.lr, r.grad_norm,
                    r.loss_scale, r.step_s, tokens_per_s, r.bound_s, 100 * wait_params,
                    100 * wait_grads, 100 * wait_optimizer,
                    tier_text(r.bytes_in_use).c_str(), r.skipped ? " | skipped (overflow)" : "",
                    val_loss ? (" | val loss " + std::to_string(*val_loss)).c_str() : "");
      line(buf);
    }
    if (bar_) bar_->set(static_cast<std::uint64_t>(r.step));
  }

  void finish() {
    if (bar_) bar_->finish();
  }

 private:
  const RunSetup& s_;
  OutputFile* metrics_;
  bool interactive_ = false;
  std::unique_ptr<Progress> bar_;
};

// One rank's whole run. Every rank makes the same calls in the same order (the engine's
// collectives pair up); only rank 0 prints and fills `summary`.
Status run_rank(const RunSetup& s, int rank, gpu::Device& device, comm::Comm& comm,
                OutputFile* metrics, RunSummary* summary) {
  const TrainFlags& f = s.flags;
  const zero::EngineOptions eo =
      engine_options_for(s.config, s.shape, s.model_options, f.nvme_path, s.seed);
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine, zero::Engine::create(eo, device, comm));
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> net,
                      model::create_model(s.shape, s.model_options, *engine));
  TZ_RETURN_IF_ERROR(engine->finalize());
  if (!f.init.empty()) {
    TZ_RETURN_IF_ERROR(net->load_weights(f.init));
  } else if (!s.shape.folder.empty()) {
    TZ_RETURN_IF_ERROR(net->load_weights(s.shape.folder));
  } else {
    TZ_RETURN_IF_ERROR(net->init_weights(s.seed));
  }
  const int seq = net->options().seq;
  model::LoaderOptions lo{.micro_batch = s.model_options.micro_batch,
                          .seq = seq,
                          .rank = rank,
                          .world_size = s.world,
                          .shuffle = f.shuffle,
                          .seed = s.seed};
  TZ_ASSIGN_OR_RETURN(model::DataLoader loader, model::DataLoader::create(s.train_data, lo));
  std::optional<model::ValidationSet> val;
  if (s.val_data) {
    TZ_ASSIGN_OR_RETURN(model::ValidationSet v,
                        model::make_validation_set(s.val_data, lo, f.val_batches));
    val.emplace(std::move(v));
  }
  TZ_ASSIGN_OR_RETURN(RankScalars scalars, RankScalars::create(device, comm));
  gpu::Stream& stream = engine->compute_stream();
  std::optional<Reporter> reporter;
  if (rank == 0) reporter.emplace(s, metrics);

  if (val && f.eval_every > 0) {
    TZ_ASSIGN_OR_RETURN(double v0, evaluate(*net, *val, scalars, stream));
    if (reporter) reporter->line("step 0 | val loss " + std::to_string(v0));
  }

  // --resume: the checkpoint's weights, optimizer states, engine scalars and loader position;
  // --steps counts from the start of training, so the run continues at the step after it.
  int first_step = 1;
  if (!f.resume.empty()) {
    TZ_ASSIGN_OR_RETURN(std::string dir, zero::resolve_checkpoint(f.resume));
    TZ_ASSIGN_OR_RETURN(zero::CheckpointExtra extra, zero::load_checkpoint(*engine, dir));
    if (extra.model.value("name", "") != s.shape.name) {
      return Status::invalid_argument("--resume " + dir + ": checkpoint of model '" +
                                      extra.model.value("name", "") + "', not '" + s.shape.name +
                                      "'");
    }
    TZ_RETURN_IF_ERROR(loader.restore(extra.trainer["loader"]));
    first_step = extra.trainer.value("next_step", 1);
    if (first_step > f.steps) {
      return Status::invalid_argument(
          "--resume " + dir + ": the checkpoint already holds step " +
          std::to_string(first_step - 1) + ", at or past --steps " + std::to_string(f.steps) +
          "; nothing to train (--steps counts from the start of training: raise it)");
    }
    if (reporter) reporter->line("resumed from " + dir + " at step " + std::to_string(first_step));
  }
  const auto save = [&](int step) -> Status {
    zero::CheckpointExtra extra;
    extra.model = {{"name", s.shape.name}};
    extra.trainer = {{"next_step", step + 1}, {"loader", loader.state()}};
    TZ_ASSIGN_OR_RETURN(std::string dir,
                        zero::save_checkpoint(*engine, comm, f.save_dir, step, extra, f.keep));
    if (reporter) reporter->line("saved " + dir);
    return Status::ok();
  };

  const int k = engine->gradient_accumulation_steps();
  const auto bt = static_cast<std::size_t>(loader.tokens_per_micro_batch());
  std::vector<std::int32_t> tok(bt), tgt(bt);
  for (int step = first_step; step <= f.steps; ++step) {
    double loss_sum = 0;
    for (int m = 0; m < k; ++m) {
      loader.next(tok, tgt);
      TZ_ASSIGN_OR_RETURN(double l, net->train_micro_batch(tok, tgt));
      loss_sum += l;
    }
    TZ_ASSIGN_OR_RETURN(zero::StepReport rep, engine->step());
    TZ_ASSIGN_OR_RETURN(auto total,
                        scalars.sum({loss_sum, g_interrupted ? 1.0 : 0.0, 0, 0}, stream));
    const double loss = total[0] / (static_cast<double>(s.world) * k);
    const bool stop = total[1] > 0;
    std::optional<double> val_loss;
    const bool eval_now =
        val && !stop && ((f.eval_every > 0 && step % f.eval_every == 0) || step == f.steps);
    if (eval_now) {
      TZ_ASSIGN_OR_RETURN(double v, evaluate(*net, *val, scalars, stream));
      val_loss = v;
    }
    if (summary != nullptr) {
      summary->steps = step;
      summary->final_loss = loss;
      if (val_loss) summary->val_loss = val_loss;
      summary->step_s.push_back(rep.step_s);
      summary->bound_s.push_back(rep.bound_s);
      const double p = static_cast<double>(engine->param_count());
      summary->nvme_read_per_param.push_back(static_cast<double>(rep.nvme_read_bytes) / p);
      summary->nvme_write_per_param.push_back(static_cast<double>(rep.nvme_write_bytes) / p);
      summary->peak_bytes = rep.peak_bytes;
      summary->comm_bytes = rep.comm_bytes;
      summary->comm_formula_bytes = rep.comm_formula_bytes;
    }
    if (reporter) reporter->step(rep, loss, val_loss);
    if (!f.save_dir.empty() && (stop || (f.save_every > 0 && step % f.save_every == 0) ||
                                step == f.steps)) {
      TZ_RETURN_IF_ERROR(save(step));
    }
    if (stop) {
      if (summary != nullptr) summary->interrupted = true;
      if (reporter) reporter->line("interrupted: stopped after step " + std::to_string(step));
      break;
    }
  }
  if (reporter) reporter->finish();
  if (!f.save_weights.empty()) TZ_RETURN_IF_ERROR(net->save_weights(f.save_weights));
  TZ_ASSIGN_OR_RETURN(std::uint64_t xxh3, engine->params_xxh3());
  if (summary != nullptr) {
    summary->params = engine->param_count();
    summary->params_xxh3 = xxh3;
    summary->plan_bytes = engine->plan_bytes();
    summary->peak_bytes = engine->peak_bytes();
  }
  return Status::ok();
}

// Median over the steps after the first (the first records the access trace and fills caches);
// over all of them when there is only one.
double steady_median(const std::vector<double>& v) {
  if (v.size() <= 1) return median(v);
  return median(std::vector<double>(v.begin() + 1, v.end()));
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void print_summary(const RunSetup& s, const RunSummary& r) {
  const double step_med = steady_median(r.step_s);
  const double tokens_per_s = step_med > 0 ? static_cast<double>(s.tokens_per_step) / step_med : 0;
  if (s.flags.json) {
    nlohmann::ordered_json j;
    j["command"] = "train";
    j["model"] = s.shape.name;
    j["ranks"] = s.world;
    j["steps"] = r.steps;
    j["interrupted"] = r.interrupted;
    j["final_loss"] = r.final_loss;
    j["val_loss"] = r.val_loss ? nlohmann::ordered_json(*r.val_loss) : nlohmann::ordered_json();
    j["tokens_per_step"] = s.tokens_per_step;
    j["tokens_per_s"] = tokens_per_s;
    j["step_s_median"] = step_med;
    j["bound_s"] = steady_median(r.bound_s);
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
  std::printf("\n  %.0f tokens/s, median step %.3f s (bound %.3f s), %llu params, xxh3 %s\n",
              tokens_per_s, step_med, steady_median(r.bound_s),
              static_cast<unsigned long long>(r.params), hex64(r.params_xxh3).c_str());
  std::printf("  peak %s\n  plan %s\n  nvme per param per step: %.2f B read, %.2f B written\n",
              tier_text(r.peak_bytes).c_str(), tier_text(r.plan_bytes).c_str(),
              steady_median(r.nvme_read_per_param), steady_median(r.nvme_write_per_param));
}

int run(const TrainFlags& flags) {
  auto setup = prepare(flags);
  if (!setup.is_ok()) {
    return report_failure("train", setup.status().message());
  }
  const RunSetup& s = *setup;
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
  OutputFile* metrics = metrics_file ? &*metrics_file : nullptr;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  RunSummary summary;
  Status st;
  const std::uint64_t budget = s.config.tierzero.device_budget;
  if (s.launched || s.world == 1) {
    // One rank in this process: the device the machine has (CUDA or HostDevice) and the
    // launcher's communicator (NCCL on GPUs, MPI on CPUs; a single-rank LocalComm alone).
    auto device = gpu::open_device({.budget_bytes = budget});
    if (!device.is_ok()) {
      st = device.status();
    } else {
      auto comm = comm::open_comm(**device, comm::CommBackend::kAuto);
      if (!comm.is_ok()) {
        st = comm.status();
      } else {
        const int rank = (*comm)->rank();
        st = run_rank(s, rank, **device, **comm, metrics, rank == 0 ? &summary : nullptr);
      }
    }
  } else {
    st = zero::run_local_ranks(
        s.world, budget, [&](int rank, gpu::Device& device, comm::Comm& comm) {
          return run_rank(s, rank, device, comm, metrics, rank == 0 ? &summary : nullptr);
        });
  }
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

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  auto f = std::make_shared<TrainFlags>();
  auto seed = std::make_shared<std::uint64_t>(0);
  CLI::App* cmd = tree.root->add_subcommand("train",
                                            "Train a model (GPT-2 or the Llama family) with ZeRO and "
                                            "tiered offload as a DeepSpeed config says (docs/train.md)");
  cmd->add_option("--config", f->config_path, "DeepSpeed-style JSON config")->required();
  cmd->add_option("--model", f->model,
                  "A preset (gpt2-124m|350m|774m|1.5b, llama-3.2-1b|3b, llama-3.1-8b, "
                  "qwen3-0.6b|4b, mistral-7b), gpt2:layers=L,heads=H,embd=E,vocab=V,seq=S, "
                  "llama:layers=L,heads=H,kv_heads=K,embd=E,ffn=F,vocab=V,seq=S, or a Hugging "
                  "Face folder (config.json + safetensors; its weights are the start)")
      ->required();
  cmd->add_option("--data", f->data,
                  "llm.c token file (.bin) or plain text read as bytes (vocab 256); default: "
                  "seeded random tokens");
  cmd->add_option("--val-data", f->val_data, "Validation corpus (same formats)");
  cmd->add_option("--eval-every", f->eval_every,
                  "Validation loss every K steps (and before the first); 0 = at the end only");
  cmd->add_option("--val-batches", f->val_batches,
                  "Validation micro-batches in the fixed set, over all ranks (default 20)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--steps", f->steps, "Optimizer steps (default 50)");
  cmd->add_option("--seq", f->seq, "Tokens per sequence (default: the model's positions)")
      ->check(at_least_one());
  cmd->add_option("--ranks", f->ranks, "Ranks as threads of this process (default 1)");
  cmd->add_option("--cpu-threads", f->cpu_threads,
                  "Threads of each rank's CPU kernels (default: the cores divided among --ranks)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--checkpointing", f->checkpointing,
                  "Activation checkpointing: 1 on, 0 off (default: on for presets above gpt2-124m)")
      ->check(CLI::Range(0, 1));
  cmd->add_option("--nvme-path", f->nvme_path, "Directory for both offloads' swap files");
  cmd->add_option("--init", f->init, "Initial weights (HF safetensors file or folder) instead of HF's init");
  cmd->add_option("--save-dir", f->save_dir,
                  "Write checkpoints into DIR/step-N (after every --save-every steps, the last step "
                  "and Ctrl-C); crash-consistent, by parameter (docs/checkpoints.md)");
  cmd->add_option("--save-every", f->save_every, "Steps between checkpoints (0: only at the end)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--keep", f->keep, "Checkpoints to keep, newest first (default 3; 0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--resume", f->resume,
                  "Continue from a checkpoint (DIR/step-N) or the latest in DIR; any rank count, "
                  "stage or offload (a reshard)");
  cmd->add_option("--save-weights", f->save_weights,
                  "Write the final weights as HF safetensors: GPT-2 a file (+ config.json beside it), the "
                  "Llama family a folder transformers loads");
  cmd->add_option("--metrics", f->metrics, "One JSON object per step to this file (JSONL)");
  cmd->add_option("--trace-out", f->trace_out, "Chrome trace of the run (open in Perfetto)");
  CLI::Option* seed_opt = cmd->add_option("--seed", *seed,
                                          "Seed of the init, the shuffle and synthetic data "
                                          "(default: tierzero.seed)");
  cmd->add_flag("--shuffle", f->shuffle, "Permute sequence offsets each epoch (seeded)");
  cmd->add_flag("--json", f->json, "Print the final summary as one JSON object");
  cmd->callback([f, seed, seed_opt] {
    if (seed_opt->count() > 0) f->seed = *seed;
    exit_code() = run(*f);
  });
});

}  // namespace
}  // namespace tz::cli
