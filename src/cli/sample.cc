// `tierzero sample --weights FILE.safetensors [--model NAME] --prompt TEXT --tokens N
// [--temperature T] [--top-k K] [--seed S] [--json]`: a continuation of the prompt by a GPT-2
// model loaded from HF-style weights, as text for byte-level (vocab 256) models and as token ids
// otherwise. The model runs on one HostDevice rank of the engine (stage 0, fp32).
#include <charconv>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/config.h"
#include "model/gpt2.h"
#include "model/hf.h"
#include "model/sampling.h"
#include "zero/engine.h"

namespace tz::cli {
namespace {

struct SampleOptions {
  std::string weights;
  std::string model;
  std::string prompt;
  int tokens = 64;
  double temperature = 1.0;
  int top_k = 0;
  std::uint64_t seed = 1234;
  bool json = false;
};

// A byte model reads the prompt as bytes; any other reads token ids separated by spaces or commas.
Result<std::vector<std::int32_t>> prompt_ids(const std::string& prompt, int vocab) {
  if (vocab == 256) return model::bytes_to_ids(prompt);
  std::string text = prompt;
  for (char& c : text) {
    if (c == ',') c = ' ';
  }
  std::istringstream in(text);
  std::vector<std::int32_t> ids;
  std::string word;
  while (in >> word) {
    long long id = -1;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc{} || end != word.data() + word.size() || id < 0 || id >= vocab) {
      return Status::invalid_argument("--prompt: '" + word + "' is not a token id in [0, " +
                                      std::to_string(vocab) +
                                      "); models with a vocabulary other than 256 bytes take "
                                      "the prompt as token ids (\"464 3290 318\")");
    }
    ids.push_back(static_cast<std::int32_t>(id));
  }
  return ids;
}

Status run(const SampleOptions& o) {
  model::SamplingOptions sampling{o.temperature, o.top_k, o.seed};
  TZ_RETURN_IF_ERROR(model::check_sampling_options(sampling));
  if (o.tokens < 0) return Status::invalid_argument("--tokens must be >= 0");
  Result<model::Gpt2Shape> shape = Status::invalid_argument("no model");
  if (!o.model.empty()) {
    shape = model::parse_model(o.model);
  } else {
    const std::string config = model::hf_config_path(o.weights);
    shape = model::read_hf_config(config);
    if (!shape.is_ok() && shape.status().code() == ErrorCode::kNotFound) {
      return Status::invalid_argument("--model not given and no " + config +
                                      " beside the weights; pass --model NAME");
    }
  }
  if (!shape.is_ok()) return shape.status();
  TZ_ASSIGN_OR_RETURN(const std::vector<std::int32_t> prompt, prompt_ids(o.prompt, shape->vocab));
  if (prompt.empty()) return Status::invalid_argument("--prompt is empty; give at least one token");

  // One rank, stage 0, fp32, plain SGD (no optimizer state: the engine is only a weight holder).
  Config config;
  config.optimizer.type = "SGD";
  model::Gpt2Options options;
  options.micro_batch = 1;
  options.checkpointing = 1;  // forward only: one block's activations suffice
  zero::EngineOptions eo;
  eo.config = config;
  eo.activation_bytes = model::Gpt2::activation_bytes(*shape, options, DType::kF32);
  // fp32 masters, parameters and gradients on the HostDevice, plus the activations and slack.
  const std::uint64_t budget = 16 * shape->param_count() + eo.activation_bytes + (1ull << 30);
  std::vector<std::int32_t> continuation;
  const Status ranks = zero::run_local_ranks(1, budget, [&](int, gpu::Device& dev,
                                                            comm::Comm& comm) -> Status {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine, zero::Engine::create(eo, dev, comm));
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<model::Gpt2> gpt,
                        model::Gpt2::create(*shape, options, *engine));
    TZ_RETURN_IF_ERROR(engine->finalize());
    TZ_RETURN_IF_ERROR(gpt->load_safetensors(o.weights));
    TZ_ASSIGN_OR_RETURN(continuation, model::generate(*gpt, prompt, o.tokens, sampling));
    return Status::ok();
  });
  TZ_RETURN_IF_ERROR(ranks);

  std::string text;
  if (shape->vocab == 256) {
    text = model::ids_to_bytes(continuation);
  } else {
    for (std::size_t i = 0; i < continuation.size(); ++i) {
      text += (i > 0 ? " " : "") + std::to_string(continuation[i]);
    }
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["prompt_ids"] = prompt;
    j["ids"] = continuation;
    j["text"] = text;
    // Bytes that are not UTF-8 print as U+FFFD instead of failing the dump.
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n", text.c_str());
  }
  return Status::ok();
}

}  // namespace

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* cmd = tree.root->add_subcommand(
      "sample", "Continue a prompt with a GPT-2 model from safetensors weights");
  auto opts = std::make_shared<SampleOptions>();
  cmd->add_option("--weights", opts->weights, "Weights (HF GPT-2 names), e.g. dir/model.safetensors")
      ->required();
  cmd->add_option("--model", opts->model,
                  "gpt2-124m|350m|774m|1.5b or gpt2:layers=L,heads=H,embd=C,vocab=V,seq=T "
                  "(default: config.json beside the weights)");
  cmd->add_option("--prompt", opts->prompt,
                  "Text (byte-level vocab-256 models) or token ids (\"464 3290\") otherwise")
      ->required();
  cmd->add_option("--tokens", opts->tokens, "Tokens to generate")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--temperature", opts->temperature, "Softmax temperature; 0 = greedy (arg-max)")
      ->capture_default_str();
  cmd->add_option("--top-k", opts->top_k, "Sample among the k most likely tokens; 0 = all")
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Seed of the sampling")->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print one JSON object {prompt_ids, ids, text}");
  cmd->callback([opts] {
    const Status s = run(*opts);
    if (!s.is_ok()) {
      std::fprintf(stderr, "tierzero sample: %s\n", s.to_string().c_str());
      exit_code() = 1;
    }
  });
});

}  // namespace tz::cli
