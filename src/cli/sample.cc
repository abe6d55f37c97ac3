// `tierzero sample [--weights FILE.safetensors] [--model NAME|DIR] [--tokenizer DIR|FILE]
// --prompt TEXT --tokens N [--temperature T] [--top-k K] [--seed S] [--json]`: a continuation of
// the prompt by a model (model/factory.h) loaded from HF-style weights (a file, or a Hugging Face
// folder). With a tokenizer.json (--tokenizer, or the one in the model's folder) the prompt is
// text and the continuation is printed as text while it is generated; without one, as text for
// byte-level (vocab 256) models and as token ids otherwise. The model runs on one HostDevice rank
// of the engine (stage 0, fp32); models with a key/value cache decode one token per forward.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/config.h"
#include "model/factory.h"
#include "model/sampling.h"
#include "model/tokenizer.h"
#include "zero/engine.h"

namespace tz::cli {
namespace {

struct SampleOptions {
  std::string weights;
  std::string model;
  std::string tokenizer;
  std::string prompt;
  std::string adapter;  // a PEFT LoRA adapter folder applied to the model (docs/lora.md)
  int tokens = 64;
  double temperature = 1.0;
  int top_k = 0;
  std::uint64_t seed = 1234;
  bool json = false;
  bool no_kv_cache = false;
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

// The tokenizer of the run: --tokenizer, else a tokenizer.json in `folder` (the model's folder or
// the weights' one), else none. Its ids must fit the model's vocabulary.
Result<std::optional<model::Tokenizer>> find_tokenizer(const SampleOptions& o,
                                                       const std::string& folder, int vocab) {
  std::string path = o.tokenizer;
  if (path.empty() && !folder.empty()) {
    const std::filesystem::path candidate = std::filesystem::path(folder) / "tokenizer.json";
    std::error_code ec;
    if (std::filesystem::is_regular_file(candidate, ec)) path = candidate.string();
  }
  if (path.empty()) return std::optional<model::Tokenizer>();
  TZ_ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::load(path));
  if (tokenizer.vocab_size() > static_cast<std::uint32_t>(vocab)) {
    return Status::invalid_argument(tokenizer.file() + " has " +
                                    std::to_string(tokenizer.vocab_size()) +
                                    " token ids, more than the model's vocabulary of " +
                                    std::to_string(vocab));
  }
  return std::optional<model::Tokenizer>(std::move(tokenizer));
}

Result<std::vector<std::int32_t>> encode_prompt(const model::Tokenizer& tokenizer,
                                                const std::string& prompt) {
  TZ_ASSIGN_OR_RETURN(const std::vector<std::uint32_t> ids,
                      tokenizer.encode(prompt, /*continuation=*/false, nullptr, "--prompt"));
  return std::vector<std::int32_t>(ids.begin(), ids.end());
}

Result<std::string> decode_ids(const model::Tokenizer& tokenizer,
                               std::span<const std::int32_t> ids) {
  const std::vector<std::uint32_t> u(ids.begin(), ids.end());
  return tokenizer.decode(u);
}

// The model the flags name: --model (a name or a folder), else the config.json beside --weights.
Result<model::ModelDesc> resolve_sample_model(const SampleOptions& o) {
  if (!o.model.empty()) return model::resolve_model(o.model);
  if (o.weights.empty()) {
    return Status::invalid_argument("give --model (a name or a Hugging Face folder) or --weights");
  }
  std::error_code ec;
  // The weights are the input the user named: a missing file is reported as itself, not as
  // the config.json that would sit beside it.
  if (!std::filesystem::exists(o.weights, ec)) {
    return Status::not_found("--weights " + o.weights + ": no such file");
  }
  const std::filesystem::path dir = std::filesystem::path(o.weights).parent_path();
  const std::string config = (dir / "config.json").string();
  if (!std::filesystem::exists(config, ec)) {
    return Status::invalid_argument("--model not given and no " + config +
                                    " beside the weights; pass --model NAME");
  }
  return model::resolve_model(dir.empty() ? std::string(".") : dir.string());
}

// What generation produced, and how long it took.
struct Generated {
  std::vector<std::int32_t> ids;
  double generate_s = 0;
  bool kv_cache = false;
};

// Loads `weights` into `shape` on one HostDevice rank of the engine and continues `prompt`.
Result<Generated> generate_on_engine(const model::ModelDesc& shape, const std::string& weights,
                                     const std::vector<std::int32_t>& prompt, int tokens,
                                     const model::SamplingOptions& sampling,
                                     const model::TokenCallback& on_token) {
  // One rank, stage 0, fp32, plain SGD (no optimizer state: the engine is only a weight holder).
  Config config;
  config.optimizer.type = "SGD";
  model::ModelOptions options;
  options.micro_batch = 1;
  options.checkpointing = 1;  // forward only: one block's activations suffice
  // The positions the run needs (the whole context, up to the model's).
  options.seq = static_cast<int>(std::min<std::uint64_t>(
      static_cast<std::uint64_t>(shape.seq), prompt.size() + static_cast<std::uint64_t>(tokens)));
  zero::EngineOptions eo;
  eo.config = config;
  eo.activation_bytes = model::activation_bytes(shape, options, DType::kF32);
  // fp32 masters, parameters and gradients on the HostDevice, the activations, a key/value cache
  // (smaller than twice the activations) and slack.
  const std::uint64_t budget = 16 * shape.param_count() + 3 * eo.activation_bytes + (1ull << 30);
  Generated out;
  const Status ranks = zero::run_local_ranks(
      1, budget, [&](int, gpu::Device& dev, comm::Comm& comm) -> Status {
        TZ_ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine,
                            zero::Engine::create(eo, dev, comm));
        TZ_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> net,
                            model::create_model(shape, options, *engine));
        TZ_RETURN_IF_ERROR(engine->finalize());
        TZ_RETURN_IF_ERROR(net->load_weights(weights));
        const auto t0 = std::chrono::steady_clock::now();
        TZ_ASSIGN_OR_RETURN(out.ids, model::generate(*net, prompt, tokens, sampling, on_token));
        out.generate_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        out.kv_cache = net->has_kv_cache() && sampling.kv_cache;
        return Status::ok();
      });
  TZ_RETURN_IF_ERROR(ranks);
  return out;
}

// The continuation as text (decoded, bytes, or ids), printed plainly or as one JSON object.
Status print_generated(const SampleOptions& o, const model::ModelDesc& shape,
                       const std::optional<model::Tokenizer>& tokenizer,
                       const std::vector<std::int32_t>& prompt, const Generated& g) {
  std::string text;
  if (tokenizer) {
    TZ_ASSIGN_OR_RETURN(text, decode_ids(*tokenizer, g.ids));
  } else if (shape.vocab == 256) {
    text = model::ids_to_bytes(g.ids);
  } else {
    for (std::size_t i = 0; i < g.ids.size(); ++i) {
      text += (i > 0 ? " " : "") + std::to_string(g.ids[i]);
    }
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["prompt_ids"] = prompt;
    j["ids"] = g.ids;
    j["text"] = text;
    j["kv_cache"] = g.kv_cache;
    j["generate_s"] = g.generate_s;
    j["tokens_per_s"] = g.generate_s > 0 ? static_cast<double>(g.ids.size()) / g.generate_s : 0.0;
    // Bytes that are not UTF-8 print as U+FFFD instead of failing the dump.
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n", text.c_str());
  }
  return Status::ok();
}

Status run(const SampleOptions& o) {
  model::SamplingOptions sampling{o.temperature, o.top_k, o.seed, !o.no_kv_cache};
  TZ_RETURN_IF_ERROR(model::check_sampling_options(sampling));
  if (o.tokens < 0) return Status::invalid_argument("--tokens must be >= 0");
  TZ_ASSIGN_OR_RETURN(model::ModelDesc shape, resolve_sample_model(o));
  if (!o.adapter.empty()) {
    Result<model::LoraSpec> lora = model::read_adapter(shape, o.adapter);
    if (!lora.is_ok()) return std::move(lora).take_status().with_context("--adapter");
    shape.lora = std::move(lora).value();  // load_weights then loads the adapter's tensors
  }
  const std::string weights = !o.weights.empty() ? o.weights : shape.folder;
  if (weights.empty()) {
    return Status::invalid_argument("--model " + o.model +
                                    " is not a folder; give the weights with --weights");
  }
  const std::string folder = !shape.folder.empty()
                                 ? shape.folder
                                 : std::filesystem::path(o.weights).parent_path().string();
  TZ_ASSIGN_OR_RETURN(const std::optional<model::Tokenizer> tokenizer,
                      find_tokenizer(o, folder, shape.vocab));
  TZ_ASSIGN_OR_RETURN(const std::vector<std::int32_t> prompt,
                      tokenizer ? encode_prompt(*tokenizer, o.prompt)
                                : prompt_ids(o.prompt, shape.vocab));
  if (prompt.empty()) return Status::invalid_argument("--prompt is empty; give at least one token");
  // With a tokenizer and without --json, the text is printed as the tokens come.
  std::optional<model::TextStream> stream;
  model::TokenCallback on_token;
  if (tokenizer && !o.json) {
    stream.emplace([&](std::span<const std::int32_t> ids) { return decode_ids(*tokenizer, ids); });
    on_token = [&](std::int32_t id) -> Status {
      TZ_ASSIGN_OR_RETURN(const std::string piece, stream->push(id));
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return Status::ok();
    };
  }
  TZ_ASSIGN_OR_RETURN(const Generated g,
                      generate_on_engine(shape, weights, prompt, o.tokens, sampling,
                                         on_token));
  if (stream) {
    TZ_ASSIGN_OR_RETURN(const std::string rest, stream->finish());
    std::printf("%s\n", rest.c_str());
    return Status::ok();
  }
  return print_generated(o, shape, tokenizer, prompt, g);
}

}  // namespace

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* cmd = tree.root->add_subcommand(
      "sample", "Continue a prompt with a model from safetensors weights or a Hugging Face folder");
  auto opts = std::make_shared<SampleOptions>();
  cmd->add_option("--weights", opts->weights,
                  "Weights (HF names), e.g. dir/model.safetensors (default: the --model folder's)");
  cmd->add_option("--model", opts->model,
                  "A Hugging Face folder, a preset or a custom spec (gpt2:..., llama:...) "
                  "(default: config.json beside the weights)");
  cmd->add_option("--adapter", opts->adapter,
                  "A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) "
                  "applied to the model (docs/lora.md)");
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "A tokenizer.json or a folder holding one (default: the model folder's, if any); "
                  "the prompt and the continuation are then text");
  cmd->add_option("--prompt", opts->prompt,
                  "Text (with a tokenizer, or a byte-level vocab-256 model) or token ids "
                  "(\"464 3290\") otherwise")
      ->required();
  cmd->add_option("--tokens", opts->tokens, "Tokens to generate")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--temperature", opts->temperature, "Softmax temperature; 0 = greedy (arg-max)")
      ->capture_default_str();
  cmd->add_option("--top-k", opts->top_k, "Sample among the k most likely tokens; 0 = all")
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Seed of the sampling")->capture_default_str();
  cmd->add_flag("--json", opts->json,
                "Print one JSON object {prompt_ids, ids, text, kv_cache, generate_s, tokens_per_s}");
  cmd->add_flag("--no-kv-cache", opts->no_kv_cache,
                "Recompute the context for every token even when the model keeps a key/value "
                "cache (to compare the two)");
  cmd->callback([opts] {
    const Status s = run(*opts);
    if (!s.is_ok()) exit_code() = report_failure("sample", s);
  });
});

}  // namespace tz::cli
