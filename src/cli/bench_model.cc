// `tierzero bench model --model NAME|DIR [--batch 4] [--seq T] [--threads N] [--repeat 5]
// [--checkpointing 0|1] [--weights F] [--seed S] [--save-weights F] [--ids F.json --logits-out F]
// [--json]`: a model (GPT-2 or the Llama family, model/factory.h) on one HostDevice rank (stage
// 0, fp32, SGD): the median time of one micro-batch's forward + backward (train_micro_batch, the
// optimizer step timed apart), and for comparisons with transformers (bench/model_vs_hf.sh,
// bench/llama_vs_hf.sh) the loss and logits of given token ids and the weights saved.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <span>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "core/config.h"
#include "core/output_file.h"
#include "model/factory.h"
#include "ops/gemm.h"
#include "zero/engine.h"

namespace tz::cli {
namespace {

struct ModelBenchOptions {
  std::string model = "gpt2:layers=12,heads=12,embd=768,vocab=256,seq=256";
  int batch = 4;
  int seq = 0;
  int threads = 0;
  int repeat = 5;
  int checkpointing = -1;
  std::string weights;
  std::uint64_t seed = 1234;
  std::string save_weights;
  std::string ids;
  std::string logits_out;
  bool json = false;
};

// {"tokens": [[...], ...], "targets": [[...], ...]}: B rows of T ids each.
Status read_ids(const std::string& path, std::vector<std::int32_t>& tokens,
                std::vector<std::int32_t>& targets, int& batch, int& length) {
  std::ifstream in(path);
  if (!in) return Status::from_errno(errno, "open", path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  const auto rows = [&](const char* key, std::vector<std::int32_t>& out) -> Status {
    if (j.is_discarded() || !j.contains(key) || !j[key].is_array() || j[key].empty()) {
      return Status::invalid_argument(path + ": needs \"" + key + "\": [[ids...], ...]");
    }
    batch = static_cast<int>(j[key].size());
    for (const auto& row : j[key]) {
      if (!row.is_array() || row.empty()) {
        return Status::invalid_argument(path + ": \"" + key + "\" rows must be non-empty arrays");
      }
      length = static_cast<int>(row.size());
      for (const auto& id : row) {
        if (!id.is_number_integer()) return Status::invalid_argument(path + ": ids are integers");
        out.push_back(id.get<std::int32_t>());
      }
    }
    return Status::ok();
  };
  TZ_RETURN_IF_ERROR(rows("tokens", tokens));
  TZ_RETURN_IF_ERROR(rows("targets", targets));
  if (tokens.size() != targets.size() ||
      tokens.size() != static_cast<std::size_t>(batch) * static_cast<std::size_t>(length)) {
    return Status::invalid_argument(path + ": tokens and targets must both be B rows of T ids");
  }
  return Status::ok();
}

Status run(const ModelBenchOptions& o) {
  TZ_ASSIGN_OR_RETURN(const model::ModelDesc shape, model::resolve_model(o.model));
  std::vector<std::int32_t> tokens, targets;
  int batch = o.batch;
  int length = o.seq > 0 ? o.seq : shape.seq;
  if (!o.ids.empty()) TZ_RETURN_IF_ERROR(read_ids(o.ids, tokens, targets, batch, length));

  Config config;
  config.optimizer.type = "SGD";
  config.optimizer.lr = 0.0;  // the timed steps leave the weights as they are
  model::ModelOptions options;
  options.micro_batch = batch;
  options.seq = length;
  options.checkpointing = o.checkpointing;
  options.cpu_threads = o.threads;
  zero::EngineOptions eo;
  eo.config = config;
  eo.activation_bytes = model::activation_bytes(shape, options, DType::kF32);
  const std::uint64_t budget = 16 * shape.param_count() + eo.activation_bytes + (1ull << 30);
  nlohmann::ordered_json result;
  result["bench"] = "model";
  result["model"] = shape.name;
  result["params"] = shape.param_count();
  result["batch"] = batch;
  result["seq"] = length;
  result["dtype"] = "fp32";
  result["threads"] = o.threads;
  result["gemm"] = ops::gemm_report_line(ops::cpu_gemm_report(o.threads, /*measure=*/true));
  const Status ranks = zero::run_local_ranks(1, budget, [&](int, gpu::Device& dev,
                                                            comm::Comm& comm) -> Status {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine, zero::Engine::create(eo, dev, comm));
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> gpt,
                        model::create_model(shape, options, *engine));
    TZ_RETURN_IF_ERROR(engine->finalize());
    if (!o.weights.empty()) {
      TZ_RETURN_IF_ERROR(gpt->load_weights(o.weights));
    } else if (!shape.folder.empty()) {
      TZ_RETURN_IF_ERROR(gpt->load_weights(shape.folder));
    } else {
      TZ_RETURN_IF_ERROR(gpt->init_weights(o.seed));
    }
    result["checkpointing"] = gpt->options().checkpointing != 0;
    if (!o.save_weights.empty()) TZ_RETURN_IF_ERROR(gpt->save_weights(o.save_weights));
    if (!o.ids.empty()) {
      TZ_ASSIGN_OR_RETURN(const double loss, gpt->eval_loss(tokens, targets));
      result["loss"] = loss;
      if (!o.logits_out.empty()) {
        TZ_ASSIGN_OR_RETURN(const std::vector<float> logits, gpt->logits(tokens, batch, length));
        TZ_ASSIGN_OR_RETURN(OutputFile out, OutputFile::create("--logits-out", o.logits_out));
        TZ_RETURN_IF_ERROR(out.write(std::as_bytes(std::span<const float>(logits))));
        TZ_RETURN_IF_ERROR(out.commit());
        result["logits_out"] = o.logits_out;
      }
      return Status::ok();
    }
    std::mt19937_64 rng(o.seed);
    std::uniform_int_distribution<int> id(0, shape.vocab - 1);
    tokens.resize(static_cast<std::size_t>(batch) * static_cast<std::size_t>(length));
    targets.resize(tokens.size());
    for (auto& t : tokens) t = id(rng);
    for (auto& t : targets) t = id(rng);
    std::vector<double> fwd_bwd, step;
    for (int r = 0; r <= o.repeat; ++r) {  // the first is a warm-up
      const auto t0 = std::chrono::steady_clock::now();
      TZ_ASSIGN_OR_RETURN(const double loss, gpt->train_micro_batch(tokens, targets));
      const auto t1 = std::chrono::steady_clock::now();
      TZ_RETURN_IF_ERROR(engine->step().status());
      const auto t2 = std::chrono::steady_clock::now();
      result["loss"] = loss;
      if (r == 0) continue;
      fwd_bwd.push_back(std::chrono::duration<double>(t1 - t0).count());
      step.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    result["repeat"] = o.repeat;
    result["fwd_bwd_s_median"] = median(fwd_bwd);
    result["fwd_bwd_s_min"] = *std::min_element(fwd_bwd.begin(), fwd_bwd.end());
    result["fwd_bwd_s_max"] = *std::max_element(fwd_bwd.begin(), fwd_bwd.end());
    result["step_s_median"] = median(step);
    result["tokens_per_s"] = static_cast<double>(tokens.size()) / median(fwd_bwd);
    return Status::ok();
  });
  TZ_RETURN_IF_ERROR(ranks);
  BenchReport out(o.json);
  out.record(result);
  out.text(result["gemm"].get<std::string>());
  std::string line = cell("model %s  batch %d  seq %d  loss %.6f", shape.name.c_str(), batch,
                          length, result["loss"].get<double>());
  if (result.contains("fwd_bwd_s_median")) {
    line += cell("  fwd+bwd %.4f s (median of %d)  %.0f tokens/s",
                 result["fwd_bwd_s_median"].get<double>(), o.repeat,
                 result["tokens_per_s"].get<double>());
  }
  out.text(line);
  return Status::ok();
}

}  // namespace

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* bench = tree.group("bench", "Measure the offload path");
  CLI::App* cmd = bench->add_subcommand(
      "model", "GPT-2 forward+backward time on one CPU rank; loss and logits for comparisons");
  auto opts = std::make_shared<ModelBenchOptions>();
  cmd->add_option("--model", opts->model, "A preset, gpt2:..., llama:... or a Hugging Face folder (its weights are loaded)")
      ->capture_default_str();
  cmd->add_option("--batch", opts->batch, "Sequences per micro-batch")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--seq", opts->seq, "Tokens per sequence (0 = the model's positions)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--threads", opts->threads, "CPU kernel threads (0 = every core)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_option("--repeat", opts->repeat, "Timed micro-batches after one warm-up (median reported)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  cmd->add_option("--checkpointing", opts->checkpointing, "-1 by preset, 0 off, 1 on")
      ->check(CLI::Range(-1, 1))
      ->capture_default_str();
  cmd->add_option("--weights", opts->weights, "Load these safetensors weights, a file or a folder (else HF init from --seed)");
  cmd->add_option("--seed", opts->seed, "Seed of the init and of the timed tokens")->capture_default_str();
  cmd->add_option("--save-weights", opts->save_weights, "Save the weights here: GPT-2 a file (+ config.json beside), the Llama family a folder");
  cmd->add_option("--ids", opts->ids, "JSON {tokens, targets} (B rows of T ids): print their loss, no timing");
  cmd->add_option("--logits-out", opts->logits_out, "With --ids: write the logits (B, T, V) as raw fp32");
  cmd->add_flag("--json", opts->json, "One JSON object");
  cmd->callback([opts] {
    const Status s = run(*opts);
    if (!s.is_ok()) exit_code() = report_failure("bench model", s);
  });
});

}  // namespace tz::cli
