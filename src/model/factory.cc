// Model names, Hugging Face folders and the family dispatch (model/factory.h).
#include "model/factory.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/hf.h"

namespace tz::model {
namespace {

ModelDesc from_gpt2(Gpt2Shape shape) {
  ModelDesc d;
  d.name = shape.name;
  d.family = "gpt2";
  d.vocab = shape.vocab;
  d.seq = shape.seq;
  d.arch = std::move(shape);
  return d;
}

ModelDesc from_llama(LlamaConfig config) {
  ModelDesc d;
  d.name = config.name;
  d.family = "llama";
  d.vocab = config.vocab;
  d.seq = config.positions;
  d.arch = std::move(config);
  return d;
}

bool is_llama_architecture(std::string_view a) {
  return a == "LlamaForCausalLM" || a == "MistralForCausalLM" || a == "Qwen2ForCausalLM" ||
         a == "Qwen3ForCausalLM";
}

Result<ModelDesc> from_folder(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) return Status::invalid_argument(path + ": no such file (a model folder needs config.json)");
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config =
      nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return Status::invalid_argument(path + ": not a JSON object");
  }
  std::string architecture;
  if (const auto it = config.find("architectures");
      it != config.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    architecture = (*it)[0].get<std::string>();
  }
  const std::string model_type = config.value("model_type", std::string());
  ModelDesc d;
  if (architecture == "GPT2LMHeadModel" || (architecture.empty() && model_type == "gpt2")) {
    TZ_ASSIGN_OR_RETURN(Gpt2Shape shape, shape_from_hf_config(config, path));
    shape.name = dir;
    d = from_gpt2(std::move(shape));
  } else if (is_llama_architecture(architecture) || architecture.empty()) {
    TZ_ASSIGN_OR_RETURN(LlamaConfig c, llama_config_from_json(config, path));
    c.name = dir;
    d = from_llama(std::move(c));
  } else {
    return Status::invalid_argument(
        path + ": key 'architectures' is [\"" + architecture +
        "\"]; tierzero computes GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, "
        "Qwen2ForCausalLM and Qwen3ForCausalLM");
  }
  d.folder = dir;
  return d;
}

}  // namespace

std::uint64_t ModelDesc::param_count() const {
  if (const auto* g = std::get_if<Gpt2Shape>(&arch)) return g->param_count();
  return std::get<LlamaConfig>(arch).param_count();
}

Result<ModelDesc> resolve_model(std::string_view name) {
  std::error_code ec;
  if (!name.empty() && std::filesystem::is_directory(std::string(name), ec)) {
    return from_folder(std::string(name));
  }
  Result<LlamaConfig> llama = parse_llama_model(name);
  if (llama.is_ok()) return from_llama(std::move(llama).value());
  if (llama.status().code() != ErrorCode::kNotFound) return llama.status();
  Result<Gpt2Shape> gpt2 = parse_model(name);
  if (!gpt2.is_ok()) {
    if (name.starts_with("gpt2")) return gpt2.status();
    std::string known;
    for (const std::string& n : all_preset_names()) known += n + ", ";
    return Status::invalid_argument("model '" + std::string(name) + "': unknown; use one of " +
                                    known +
                                    "gpt2:layers=L,heads=H,embd=C,vocab=V,seq=T, "
                                    "llama:layers=L,heads=H,kv_heads=K,embd=C,ffn=F,vocab=V,seq=T "
                                    "or a Hugging Face folder with config.json");
  }
  return from_gpt2(std::move(gpt2).value());
}

std::vector<std::string> all_preset_names() {
  std::vector<std::string> names = preset_names();
  for (std::string& n : llama_preset_names()) names.push_back(std::move(n));
  return names;
}

std::vector<zero::UnitSpec> unit_specs(const ModelDesc& desc) {
  if (const auto* g = std::get_if<Gpt2Shape>(&desc.arch)) return unit_specs(*g);
  return unit_specs(std::get<LlamaConfig>(desc.arch));
}

bool checkpointing_enabled(const ModelDesc& desc, const ModelOptions& options) {
  if (const auto* g = std::get_if<Gpt2Shape>(&desc.arch)) return checkpointing_enabled(*g, options);
  return checkpointing_enabled(std::get<LlamaConfig>(desc.arch), options);
}

std::uint64_t activation_bytes(const ModelDesc& desc, const ModelOptions& options, DType compute) {
  if (const auto* g = std::get_if<Gpt2Shape>(&desc.arch)) {
    return Gpt2::activation_bytes(*g, options, compute);
  }
  return Llama::activation_bytes(std::get<LlamaConfig>(desc.arch), options, compute);
}

Result<std::unique_ptr<Model>> create_model(const ModelDesc& desc, const ModelOptions& options,
                                            zero::Engine& engine) {
  if (const auto* g = std::get_if<Gpt2Shape>(&desc.arch)) {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<Gpt2> m, Gpt2::create(*g, options, engine));
    return std::unique_ptr<Model>(std::move(m));
  }
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<Llama> m,
                      Llama::create(std::get<LlamaConfig>(desc.arch), options, engine));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace tz::model
