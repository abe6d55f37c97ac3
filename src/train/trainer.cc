// The training loop (train/trainer.h): each rank builds its engine and model, loads or
// initialises the weights, resumes, then takes its steps; the ranks agree on the loss and on
// stopping through one small gather per step.
#include "train/trainer.h"

#include <array>
#include <optional>
#include <utility>

#include "core/assert.h"
#include "train/report.h"
#include "zero/checkpoint.h"

namespace tz::train {
namespace {

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

// What a rank whose own part of the weights loaded returns when another rank's did not; the
// caller reports the failing rank's error instead (Trainer::run_local_ranks does).
constexpr const char* kPeerLoadFailed = "the weights failed to load on another rank";

model::LoaderOptions loader_options(const TrainSpec& spec, int rank) {
  return {.micro_batch = spec.model_options.micro_batch,
          .seq = spec.model_options.seq,
          .rank = rank,
          .world_size = spec.world,
          .shuffle = spec.shuffle,
          .seed = spec.seed};
}

// One rank's run: what it holds from setup to the end, and the loop's pieces. Every rank makes
// the same calls in the same order (the engine's collectives pair up); only rank 0 prints and
// fills the result.
class RankRun {
 public:
  RankRun(const TrainSpec& spec, const Trainer& trainer, int rank, comm::Comm& comm,
          const TrainIo& io, TrainResult* result)
      : spec_(spec), trainer_(trainer), rank_(rank), comm_(comm), io_(io), result_(result) {}

  Status setup(gpu::Device& device, std::shared_ptr<const model::TokenData> train_data,
               std::shared_ptr<const model::TokenData> val_data);
  // --resume: the checkpoint's weights, optimizer states, engine scalars and loader position.
  // Returns the first step to take (1 without a checkpoint).
  Result<int> resume();
  Status train(int first_step);
  Status finish();

 private:
  // Whether --resume's checkpoint sets every weight (no frozen units), so none load before it.
  bool weights_from_checkpoint() const;
  Status load_weights();
  Result<double> evaluate();
  Status save(int step);
  void record(int step, const zero::StepReport& rep, double loss, std::optional<double> val_loss);

  const TrainSpec& spec_;
  const Trainer& trainer_;
  int rank_;
  comm::Comm& comm_;
  const TrainIo& io_;
  TrainResult* result_;
  std::unique_ptr<zero::Engine> engine_;
  std::unique_ptr<model::Model> net_;
  std::optional<model::DataLoader> loader_;
  std::optional<model::ValidationSet> val_;
  std::optional<RankScalars> scalars_;
  std::optional<Reporter> reporter_;
};

bool RankRun::weights_from_checkpoint() const {
  return !spec_.resume.empty() && engine_->param_count() == engine_->trainable_param_count();
}

Status RankRun::load_weights() {
  if (!spec_.init.empty()) return net_->load_weights(spec_.init);
  if (!spec_.model.folder.empty()) return net_->load_weights(spec_.model.folder);
  return net_->init_weights(spec_.seed);
}

Status RankRun::setup(gpu::Device& device, std::shared_ptr<const model::TokenData> train_data,
                      std::shared_ptr<const model::TokenData> val_data) {
  TZ_ASSIGN_OR_RETURN(engine_, zero::Engine::create(spec_.engine, device, comm_));
  TZ_ASSIGN_OR_RETURN(net_, model::create_model(spec_.model, spec_.model_options, *engine_));
  TZ_RETURN_IF_ERROR(engine_->finalize());
  if (io_.bound_bandwidths) {
    // After the plan's check, before the weights load (the disk probe's writes come first).
    zero::EngineOptions measured = engine_->options();
    TZ_RETURN_IF_ERROR(io_.bound_bandwidths(device.host_accessible(), measured));
    engine_->set_bound_bandwidths(measured.nvme_read_bytes_per_s, measured.nvme_write_bytes_per_s,
                                  measured.copy_bytes_per_s);
  }
  TZ_ASSIGN_OR_RETURN(RankScalars scalars, RankScalars::create(device, comm_));
  scalars_.emplace(std::move(scalars));
  // Each rank reads only its part of the weights (model/hf_folder.h), so a bad value fails only
  // the ranks that read it: the ranks agree before any of them goes on to a collective. A resumed
  // run's checkpoint sets every trainable unit, so only a frozen base (LoRA) still loads here: the
  // initialisation it would overwrite took a third of a gpt2-774m resume.
  Status loaded = weights_from_checkpoint() ? Status::ok() : load_weights();
  TZ_ASSIGN_OR_RETURN(auto failed, scalars_->sum({0, loaded.is_ok() ? 0.0 : 1.0, 0, 0},
                                                 engine_->compute_stream()));
  TZ_RETURN_IF_ERROR(std::move(loaded));
  if (failed[1] > 0) return Status::unavailable(kPeerLoadFailed);
  const model::LoaderOptions lo = loader_options(spec_, rank_);
  TZ_ASSIGN_OR_RETURN(model::DataLoader loader, model::DataLoader::create(std::move(train_data), lo));
  loader_.emplace(std::move(loader));
  if (val_data) {
    TZ_ASSIGN_OR_RETURN(model::ValidationSet v,
                        model::make_validation_set(std::move(val_data), lo, spec_.val_batches));
    val_.emplace(std::move(v));
  }
  if (result_ != nullptr) result_->bandwidths = bandwidth_json(engine_->options());
  if (rank_ == 0) {
    reporter_.emplace(spec_.steps, spec_.engine.config.steps_per_print, trainer_.tokens_per_step(),
                      bandwidth_json(engine_->options()), io_.metrics, io_.print);
  }
  // Step 0's validation loss is the starting weights'; a resumed run starts from the checkpoint's
  // step, whose loss that run printed.
  if (val_ && spec_.eval_every > 0 && spec_.resume.empty()) {
    TZ_ASSIGN_OR_RETURN(double v0, evaluate());
    if (reporter_) reporter_->line("step 0 | val loss " + std::to_string(v0));
  }
  return Status::ok();
}

// The mean validation loss over the fixed set (every rank its share; collective).
Result<double> RankRun::evaluate() {
  const auto bt = static_cast<std::size_t>(val_->loader.tokens_per_micro_batch());
  std::vector<std::int32_t> tok(bt), tgt(bt);
  double sum = 0;
  for (int i = 0; i < val_->batches_per_rank; ++i) {
    val_->loader.batch(i, tok, tgt);
    TZ_ASSIGN_OR_RETURN(double l, net_->eval_loss(tok, tgt));
    sum += l;
  }
  TZ_ASSIGN_OR_RETURN(auto total, scalars_->sum({0, 0, sum, static_cast<double>(
                                                                   val_->batches_per_rank)},
                                                engine_->compute_stream()));
  return total[2] / total[3];
}

Result<int> RankRun::resume() {
  if (spec_.resume.empty()) return 1;
  TZ_ASSIGN_OR_RETURN(std::string dir, zero::resolve_checkpoint(spec_.resume));
  TZ_ASSIGN_OR_RETURN(zero::CheckpointExtra extra,
                      zero::load_checkpoint(*engine_, dir, spec_.base));
  if (extra.model.value("name", "") != spec_.model.name) {
    return Status::invalid_argument("--resume " + dir + ": checkpoint of model '" +
                                    extra.model.value("name", "") + "', not '" +
                                    spec_.model.name + "'");
  }
  TZ_RETURN_IF_ERROR(loader_->restore(extra.trainer["loader"]));
  // The steps count from the start of training, so the run continues at the step after it.
  const int first_step = extra.trainer.value("next_step", 1);
  if (first_step > spec_.steps) {
    return Status::invalid_argument(
        "--resume " + dir + ": the checkpoint already holds step " +
        std::to_string(first_step - 1) + ", at or past --steps " + std::to_string(spec_.steps) +
        "; nothing to train (--steps counts from the start of training: raise it)");
  }
  if (reporter_) reporter_->line("resumed from " + dir + " at step " + std::to_string(first_step));
  return first_step;
}

Status RankRun::save(int step) {
  zero::CheckpointExtra extra;
  extra.model = {{"name", spec_.model.name}};
  extra.trainer = {{"next_step", step + 1}, {"loader", loader_->state()}};
  extra.base = spec_.base;
  TZ_ASSIGN_OR_RETURN(std::string dir, zero::save_checkpoint(*engine_, comm_, spec_.save_dir,
                                                             step, extra, spec_.keep));
  if (reporter_) reporter_->line("saved " + dir);
  if (result_ != nullptr) result_->checkpoints.push_back(dir);
  return Status::ok();
}

void RankRun::record(int step, const zero::StepReport& rep, double loss, std::optional<double> val_loss) {
  if (result_ == nullptr) return;
  result_->steps = step;
  result_->final_loss = loss;
  result_->losses.push_back(loss);
  if (val_loss) result_->val_loss = val_loss;
  result_->step_s.push_back(rep.step_s);
  result_->bound_s.push_back(rep.bound_s);
  result_->bound_term_names.push_back(rep.bound_term);
  result_->bound_terms.push_back(rep.bound_terms);
  result_->nvme_ceiling_scale = rep.nvme_ceiling_scale;
  const double p = static_cast<double>(engine_->param_count());
  result_->nvme_read_per_param.push_back(static_cast<double>(rep.nvme_read_bytes) / p);
  result_->nvme_write_per_param.push_back(static_cast<double>(rep.nvme_write_bytes) / p);
  result_->peak_bytes = rep.peak_bytes;
  result_->comm_bytes = rep.comm_bytes;
  result_->comm_formula_bytes = rep.comm_formula_bytes;
}

Status RankRun::train(int first_step) {
  const int k = engine_->gradient_accumulation_steps();
  const auto bt = static_cast<std::size_t>(loader_->tokens_per_micro_batch());
  std::vector<std::int32_t> tok(bt), tgt(bt);
  for (int step = first_step; step <= spec_.steps; ++step) {
    double loss_sum = 0;
    for (int m = 0; m < k; ++m) {
      loader_->next(tok, tgt);
      TZ_ASSIGN_OR_RETURN(double l, net_->train_micro_batch(tok, tgt));
      loss_sum += l;
    }
    TZ_ASSIGN_OR_RETURN(zero::StepReport rep, engine_->step());
    const bool stop_here = io_.stop && io_.stop(step);
    TZ_ASSIGN_OR_RETURN(auto total, scalars_->sum({loss_sum, stop_here ? 1.0 : 0.0, 0, 0},
                                                  engine_->compute_stream()));
    const double loss = total[0] / (static_cast<double>(spec_.world) * k);
    const bool stop = total[1] > 0;
    std::optional<double> val_loss;
    if (val_ && !stop &&
        ((spec_.eval_every > 0 && step % spec_.eval_every == 0) || step == spec_.steps)) {
      TZ_ASSIGN_OR_RETURN(double v, evaluate());
      val_loss = v;
    }
    record(step, rep, loss, val_loss);
    if (reporter_) reporter_->step(rep, loss, val_loss);
    if (!spec_.save_dir.empty() &&
        (stop || (spec_.save_every > 0 && step % spec_.save_every == 0) || step == spec_.steps)) {
      TZ_RETURN_IF_ERROR(save(step));
    }
    if (stop) {
      if (result_ != nullptr) result_->interrupted = true;
      if (reporter_) reporter_->line("interrupted: stopped after step " + std::to_string(step));
      break;
    }
  }
  return Status::ok();
}

Status RankRun::finish() {
  if (reporter_) reporter_->finish();
  if (!spec_.save_weights.empty()) TZ_RETURN_IF_ERROR(net_->save_weights(spec_.save_weights));
  if (!spec_.merge_into.empty()) {
    TZ_RETURN_IF_ERROR(net_->save_merged(spec_.merge_into, engine_->compute_dtype()));
  }
  TZ_ASSIGN_OR_RETURN(std::uint64_t xxh3, engine_->params_xxh3());
  if (result_ != nullptr) {
    result_->params = engine_->param_count();
    result_->params_xxh3 = xxh3;
    result_->plan_bytes = engine_->plan_bytes();
    result_->peak_bytes = engine_->peak_bytes();
  }
  return Status::ok();
}

}  // namespace

Result<Trainer> Trainer::create(TrainSpec spec) {
  if (spec.steps < 1) return Status::invalid_argument("steps must be at least 1");
  if (spec.world < 1) return Status::invalid_argument("world must be at least 1 rank");
  const model::ModelOptions& mo = spec.model_options;
  if (mo.micro_batch < 1) return Status::invalid_argument("micro_batch must be at least 1");
  if (mo.seq < 1 || mo.seq > spec.model.seq) {
    return Status::invalid_argument("seq " + std::to_string(mo.seq) + " outside 1.." +
                                    std::to_string(spec.model.seq) + " (" + spec.model.name +
                                    "'s positions)");
  }
  if (spec.eval_every < 0) return Status::invalid_argument("eval_every must be >= 0");
  if (spec.eval_every > 0 && spec.val_data.empty()) {
    return Status::invalid_argument("eval_every needs a validation corpus (val_data)");
  }
  Trainer t;
  const std::uint64_t k = spec.engine.config.gradient_accumulation_steps;
  t.tokens_per_step_ = static_cast<std::uint64_t>(mo.micro_batch) *
                       static_cast<std::uint64_t>(mo.seq) * k *
                       static_cast<std::uint64_t>(spec.world);
  if (!spec.data.empty()) {
    TZ_ASSIGN_OR_RETURN(model::TokenData d, model::load_tokens(spec.data, spec.model.vocab));
    t.train_data_ = std::make_shared<const model::TokenData>(std::move(d));
  } else {
    // No corpus: uniform random tokens (seeded), enough for two steps' worth of distinct
    // batches, for measuring step time on a shape without a tokenized corpus.
    t.train_data_ = std::make_shared<const model::TokenData>(
        model::synthetic_tokens(2 * t.tokens_per_step_ + 1, spec.model.vocab, spec.seed));
  }
  if (!spec.val_data.empty()) {
    TZ_ASSIGN_OR_RETURN(model::TokenData d, model::load_tokens(spec.val_data, spec.model.vocab));
    t.val_data_ = std::make_shared<const model::TokenData>(std::move(d));
  }
  // The loaders' size checks are the same on every rank: run them here so a short file stops the
  // run before any rank starts.
  const model::LoaderOptions lo = loader_options(spec, 0);
  TZ_RETURN_IF_ERROR(model::DataLoader::create(t.train_data_, lo).take_status());
  if (t.val_data_) {
    TZ_RETURN_IF_ERROR(
        model::make_validation_set(t.val_data_, lo, spec.val_batches).take_status());
  }
  t.spec_ = std::move(spec);
  return t;
}

Status Trainer::run_rank(int rank, gpu::Device& device, comm::Comm& comm, const TrainIo& io,
                         TrainResult* result) const {
  TZ_ASSERT(comm.world_size() == spec_.world);
  TrainResult* mine = rank == 0 ? result : nullptr;
  RankRun run(spec_, *this, rank, comm, io, mine);
  TZ_RETURN_IF_ERROR(run.setup(device, train_data_, val_data_));
  TZ_ASSIGN_OR_RETURN(int first_step, run.resume());
  TZ_RETURN_IF_ERROR(run.train(first_step));
  return run.finish();
}

Status Trainer::run_local_ranks(std::uint64_t device_budget_bytes, const TrainIo& io,
                                TrainResult* result) const {
  // Each rank's own outcome: a rank stopped only because another failed to load reports that
  // rank's error, not its own "another rank" line.
  std::vector<Status> outcome(static_cast<std::size_t>(spec_.world));
  Status first = zero::run_local_ranks(
      spec_.world, device_budget_bytes, [&](int rank, gpu::Device& device, comm::Comm& comm) {
        Status s = run_rank(rank, device, comm, io, result);
        outcome[static_cast<std::size_t>(rank)] = s;
        return s;
      });
  for (std::size_t r = 0; r < outcome.size(); ++r) {
    if (!outcome[r].is_ok() && outcome[r].message() != kPeerLoadFailed) {
      return std::move(outcome[r]).with_context("rank " + std::to_string(r));
    }
  }
  return first;
}

}  // namespace tz::train
