// The training loop over any model (DESIGN.md, "train/"): data, micro-batches, validation,
// checkpoints and resume, per-step metrics and progress lines, stopping when asked. It sees the
// model only through model/model.h and model/factory.h, and the engine through its model API
// (zero/engine.h, zero/checkpoint.h); the caller (`tierzero train`, the trainer's tests) parses
// flags, picks each rank's device and communicator, installs signal handlers and prints the
// summary.
//
//   Result<Trainer> t = Trainer::create(spec);           // data loaded and checked, no rank yet
//   TrainResult r;
//   Status st = t->run_local_ranks(device_budget, io, &r);  // N ranks as threads, or per process:
//   Status st = t->run_rank(rank, device, comm, io, &r);    // one rank (rank 0 fills r)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/output_file.h"
#include "core/status.h"
#include "model/data.h"
#include "model/factory.h"
#include "zero/engine.h"

namespace tz::train {

// What one run trains, on what data, for how long, and what it writes. Plain values: the caller
// resolves them (from flags and a config) before Trainer::create checks them.
struct TrainSpec {
  // The engine's options for every rank (the config inside is the run's: stage, offload,
  // precision, optimizer, micro-batch, accumulation, steps_per_print).
  zero::EngineOptions engine;
  model::ModelDesc model;
  model::ModelOptions model_options;  // micro_batch is the config's; seq <= the model's positions
  int world = 1;                      // data-parallel ranks
  std::uint64_t seed = 1234;          // init, shuffle and synthetic tokens
  int steps = 50;                     // optimizer steps, counted from the start of training

  std::string data;      // token file or plain text (model::load_tokens); empty: seeded random
                         // tokens, enough for two steps of distinct batches
  std::string val_data;  // validation corpus; empty: no validation
  int eval_every = 0;    // validation every K steps and before the first; 0 = at the end only
  int val_batches = 20;  // the validation set's micro-batches over all ranks
  bool shuffle = false;  // permute sequence offsets each epoch (seeded)

  std::string init;          // weights file or folder to start from; empty: the model's folder's
                             // weights when it has one, else the family's initialisation
  std::string save_dir;      // checkpoints into save_dir/step-N; empty: none
  int save_every = 0;        // steps between checkpoints (0: only the last step and a stop)
  int keep = 3;              // checkpoints kept, newest first (0: all)
  std::string resume;        // a checkpoint (or a folder of them) to continue from; empty: none
  std::string save_weights;  // the final weights (model::Model::save_weights); empty: none
  // LoRA (model.lora): the base with the adapters merged, written in the compute dtype
  // (model::Model::save_merged); empty: none. `base` names the frozen base for checkpoints
  // (zero::CheckpointExtra::base, model::base_identity); a resume refuses another base.
  std::string merge_into;
  std::string base;
};

// What rank 0 reports of a run.
struct TrainResult {
  std::int64_t steps = 0;  // the last step taken
  bool interrupted = false;
  double final_loss = 0;
  std::optional<double> val_loss;  // the last validation loss
  std::vector<double> losses;      // per step taken (mean over ranks and micro-batches)
  std::vector<double> step_s;
  std::vector<double> bound_s;
  std::vector<std::string> bound_term_names;  // per step: the term that set bound_s (StepReport)
  std::vector<zero::BoundTerms> bound_terms;   // per step: the terms bound_s is the max of
  nlohmann::ordered_json bandwidths;  // the bound's bandwidths (bandwidth_json), rank 0's engine
  double nvme_ceiling_scale = 1;      // the last step's (StepReport::nvme_ceiling_scale)
  std::vector<double> nvme_read_per_param;
  std::vector<double> nvme_write_per_param;
  std::uint64_t params = 0;
  std::uint64_t params_xxh3 = 0;
  zero::TierBytes peak_bytes;
  zero::TierBytes plan_bytes;
  nlohmann::ordered_json comm_bytes;
  nlohmann::ordered_json comm_formula_bytes;
  std::vector<std::string> checkpoints;  // the checkpoint folders saved, in order
};

// How a run talks to its caller while it goes.
struct TrainIo {
  // Asked by every rank after each step (the step just taken); when any rank says true, every
  // rank stops after that same step (the ranks agree through a gather), saves a checkpoint when
  // save_dir is set and returns with TrainResult::interrupted. Called on the rank's thread: it
  // must be thread-safe for ranks as threads (reading an atomic or a sig_atomic_t flag is).
  std::function<bool(std::int64_t step)> stop;
  // Rank 0 writes one JSON object per step here (docs/train.md, "--metrics"); null: none.
  OutputFile* metrics = nullptr;
  // Rank 0 prints the step lines (and a progress bar on a terminal) on stderr.
  bool print = true;
  // Measures the step bound's bandwidths into `options` (a copy of the rank's engine options: its
  // config and nvme_path say which disks; the callee sets nvme_read_bytes_per_s,
  // nvme_write_bytes_per_s and copy_bytes_per_s) for a device that is or is not host memory.
  // Every rank calls it once its engine has checked the memory plan (finalize), so a run the plan
  // refuses spends no time on the probe, and before its weights load and its first step. With
  // ranks as threads it is called from each rank's thread: it must be thread-safe and should
  // measure once for all of them. An error stops the rank. Empty: the bandwidths of
  // TrainSpec::engine stand.
  std::function<Status(bool device_is_host_memory, zero::EngineOptions& options)> bound_bandwidths;
};

class Trainer {
 public:
  // Checks `spec` against itself and loads the data: the corpus (or the synthetic tokens) and the
  // validation set, with every size check the ranks' loaders will make, so a short file stops the
  // run before any rank starts. Errors: kInvalidArgument naming the value (steps, world, seq,
  // eval_every without val_data); model::load_tokens' errors naming the file.
  static Result<Trainer> create(TrainSpec spec);

  // One rank's whole run on `device` and `comm` (comm's world size must be spec.world): builds the
  // engine and the model, loads or initialises the weights, resumes, trains, validates, saves.
  // Every rank calls it; rank 0 fills `result` (may be null) and prints. Errors name the step,
  // file or tensor.
  Status run_rank(int rank, gpu::Device& device, comm::Comm& comm, const TrainIo& io,
                  TrainResult* result) const;
  // spec.world ranks as threads of this process (zero::run_local_ranks), each with a HostDevice of
  // `device_budget_bytes` (0: the default). The first rank's error, naming the rank.
  Status run_local_ranks(std::uint64_t device_budget_bytes, const TrainIo& io,
                         TrainResult* result) const;

  const TrainSpec& spec() const { return spec_; }
  std::uint64_t tokens_per_step() const { return tokens_per_step_; }  // B * T * k * world

 private:
  Trainer() = default;
  TrainSpec spec_;
  std::shared_ptr<const model::TokenData> train_data_;
  std::shared_ptr<const model::TokenData> val_data_;  // null without val_data
  std::uint64_t tokens_per_step_ = 0;
};

}  // namespace tz::train
