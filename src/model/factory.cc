// Model names, Hugging Face folders and the family dispatch (model/factory.h).
#include "model/factory.h"

#include <algorithm>
#include <cstdio>
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

namespace {

Status no_lora(const ModelDesc& desc) {
  return Status::invalid_argument("model " + desc.name +
                                  ": LoRA adapters are implemented for the Llama family "
                                  "(Llama, Mistral, Qwen2/3), not GPT-2");
}

}  // namespace

Result<LoraSpec> parse_lora(const ModelDesc& desc, std::string_view text, std::string_view flag) {
  if (desc.family != "llama") return no_lora(desc);
  return parse_lora_spec(text, llama_lora_modules(), desc.name, flag);
}

Result<LoraSpec> read_adapter(const ModelDesc& desc, const std::string& dir) {
  if (desc.family != "llama") return no_lora(desc);
  return read_adapter_config(dir, llama_lora_modules(), desc.name);
}

namespace {

void fnv1a(std::uint64_t& h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
}

}  // namespace

std::string base_identity(const ModelDesc& desc, const std::string& init, std::uint64_t seed) {
  if (!desc.lora) return "";
  const std::string source = !init.empty() ? init : desc.folder;
  if (source.empty()) return "random " + desc.name + " seed " + std::to_string(seed);
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(source, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(source, ec)) {
      const std::string n = e.path().filename().string();
      if (e.is_regular_file(ec) && (n == "config.json" || n.ends_with(".safetensors") ||
                                    n.ends_with(".safetensors.index.json"))) {
        files.push_back(e.path());
      }
    }
  } else {
    files.emplace_back(source);
  }
  std::sort(files.begin(), files.end());
  std::uint64_t h = 0xcbf29ce484222325ULL;
  std::vector<char> head(1u << 20);
  for (const fs::path& p : files) {
    const std::string name = p.filename().string();
    fnv1a(h, name.data(), name.size());
    const std::uint64_t size = fs::file_size(p, ec);
    fnv1a(h, &size, sizeof(size));
    std::ifstream in(p, std::ios::binary);
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    fnv1a(h, head.data(), static_cast<std::size_t>(in.gcount()));
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return source + " fnv1a64:" + hex;
}

std::vector<std::string> all_preset_names() {
  std::vector<std::string> names = preset_names();
  for (std::string& n : llama_preset_names()) names.push_back(std::move(n));
  return names;
}

std::vector<zero::UnitSpec> unit_specs(const ModelDesc& desc) {
  if (const auto* g = std::get_if<Gpt2Shape>(&desc.arch)) return unit_specs(*g);
  return unit_specs(std::get<LlamaConfig>(desc.arch), desc.lora ? &*desc.lora : nullptr);
}

bool checkpointing_enabled(const ModelDesc& desc, const ModelOptions& options) {
  if (const auto* g = std::get_if<Gpt2Shape>(&desc.arch)) return checkpointing_enabled(*g, options);
  return checkpointing_enabled(std::get<LlamaConfig>(desc.arch), options);
}

std::uint64_t activation_bytes(const ModelDesc& desc, const ModelOptions& options, DType compute) {
  if (const auto* g = std::get_if<Gpt2Shape>(&desc.arch)) {
    return Gpt2::activation_bytes(*g, options, compute);
  }
  return Llama::activation_bytes(std::get<LlamaConfig>(desc.arch), options, compute,
                                 desc.lora ? &*desc.lora : nullptr);
}

Result<std::unique_ptr<Model>> create_model(const ModelDesc& desc, const ModelOptions& options,
                                            zero::Engine& engine) {
  if (const auto* g = std::get_if<Gpt2Shape>(&desc.arch)) {
    if (desc.lora) return no_lora(desc);
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<Gpt2> m, Gpt2::create(*g, options, engine));
    return std::unique_ptr<Model>(std::move(m));
  }
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<Llama> m,
                      Llama::create(std::get<LlamaConfig>(desc.arch), options, engine,
                                    desc.lora ? &*desc.lora : nullptr));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace tz::model
