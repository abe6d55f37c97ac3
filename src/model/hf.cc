// Hugging Face GPT-2 names and config.json (model/hf.h). The config is built and read with
// nlohmann-json (exceptions are not used across this module's boundary: parsing is
// non-throwing and every access is checked).
#include "model/hf.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace tz::model {
namespace {

bool is_block_buffer(std::string_view name) {
  // "h.{i}.attn.bias" / "h.{i}.attn.masked_bias": the causal mask HF kept as a buffer.
  if (!name.starts_with("h.")) return false;
  const std::string_view rest = name.substr(2);
  const std::size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string_view::npos) return false;
  if (!std::all_of(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(dot),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  const std::string_view tail = rest.substr(dot + 1);
  return tail == "attn.bias" || tail == "attn.masked_bias";
}

Status config_error(std::string_view origin, const std::string& what) {
  return Status::invalid_argument(std::string(origin) + ": " + what);
}

}  // namespace

std::string hf_tensor_name(const zero::UnitSpec& unit, const zero::TensorSpec& tensor) {
  // Blocks are "h.{i}" and their tensors are relative to it; wte, wpe and ln_f are top-level.
  if (unit.name.starts_with("h.")) return unit.name + "." + tensor.name;
  return tensor.name;
}

std::string_view strip_hf_prefix(std::string_view name) {
  return name.starts_with(kHfPrefix) ? name.substr(kHfPrefix.size()) : name;
}

bool is_hf_non_parameter(std::string_view name) {
  return name == "lm_head.weight" || is_block_buffer(name);
}

nlohmann::ordered_json hf_config(const Gpt2Shape& shape, DType dtype) {
  nlohmann::ordered_json c;
  c["architectures"] = {"GPT2LMHeadModel"};
  c["model_type"] = "gpt2";
  c["vocab_size"] = shape.vocab;
  c["n_positions"] = shape.seq;
  c["n_ctx"] = shape.seq;
  c["n_embd"] = shape.embd;
  c["n_layer"] = shape.layers;
  c["n_head"] = shape.heads;
  c["n_inner"] = nullptr;
  c["activation_function"] = "gelu_new";
  c["resid_pdrop"] = 0.0;
  c["embd_pdrop"] = 0.0;
  c["attn_pdrop"] = 0.0;
  c["layer_norm_epsilon"] = 1e-5;
  c["initializer_range"] = 0.02;
  c["scale_attn_weights"] = true;
  c["scale_attn_by_inverse_layer_idx"] = false;
  c["reorder_and_upcast_attn"] = false;
  c["tie_word_embeddings"] = true;
  c["use_cache"] = true;
  // GPT-2's <|endoftext|> is 50256; smaller vocabularies end at their last id.
  const int eos = std::min(50256, shape.vocab - 1);
  c["bos_token_id"] = eos;
  c["eos_token_id"] = eos;
  c["torch_dtype"] = dtype == DType::kF32 ? "float32" : dtype == DType::kBF16 ? "bfloat16" : "float16";
  c["tierzero_model"] = shape.name;
  return c;
}

Result<Gpt2Shape> shape_from_hf_config(const nlohmann::json& config, std::string_view origin) {
  if (!config.is_object()) return config_error(origin, "not a JSON object");
  const auto positive_int = [&](const char* key) -> Result<int> {
    const auto it = config.find(key);
    if (it == config.end()) return config_error(origin, std::string("key '") + key + "' is missing");
    if (!it->is_number_integer() || it->get<std::int64_t>() <= 0 ||
        it->get<std::int64_t>() > (1 << 30)) {
      return config_error(origin, std::string("key '") + key + "' must be a positive integer");
    }
    return static_cast<int>(it->get<std::int64_t>());
  };
  TZ_ASSIGN_OR_RETURN(const int layers, positive_int("n_layer"));
  TZ_ASSIGN_OR_RETURN(const int heads, positive_int("n_head"));
  TZ_ASSIGN_OR_RETURN(const int embd, positive_int("n_embd"));
  TZ_ASSIGN_OR_RETURN(const int vocab, positive_int("vocab_size"));
  TZ_ASSIGN_OR_RETURN(const int seq, positive_int("n_positions"));
  if (const auto it = config.find("model_type"); it != config.end() && *it != "gpt2") {
    return config_error(origin, "key 'model_type' is " + it->dump() + ", not \"gpt2\"");
  }
  if (const auto it = config.find("activation_function");
      it != config.end() && *it != "gelu_new") {
    return config_error(origin, "key 'activation_function' is " + it->dump() +
                                    "; tierzero computes GPT-2 with \"gelu_new\" only");
  }
  if (const auto it = config.find("n_inner");
      it != config.end() && !it->is_null() && *it != 4 * embd) {
    return config_error(origin, "key 'n_inner' is " + it->dump() +
                                    "; tierzero's MLP is 4 * n_embd (null)");
  }
  if (const auto it = config.find("layer_norm_epsilon");
      it != config.end() && (!it->is_number() || std::abs(it->get<double>() - 1e-5) > 1e-12)) {
    return config_error(origin, "key 'layer_norm_epsilon' is " + it->dump() + "; tierzero uses 1e-5");
  }
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}) {
    if (const auto it = config.find(key); it != config.end() && *it != false) {
      return config_error(origin, std::string("key '") + key + "' must be false");
    }
  }
  for (const char* key : {"tie_word_embeddings", "scale_attn_weights"}) {
    if (const auto it = config.find(key); it != config.end() && *it != true) {
      return config_error(origin, std::string("key '") + key + "' must be true");
    }
  }
  const std::string spec = "gpt2:layers=" + std::to_string(layers) + ",heads=" +
                           std::to_string(heads) + ",embd=" + std::to_string(embd) +
                           ",vocab=" + std::to_string(vocab) + ",seq=" + std::to_string(seq);
  Result<Gpt2Shape> shape = parse_model(spec);
  if (!shape.is_ok()) return std::move(shape).take_status().with_context(origin);
  return shape;
}

std::string hf_config_path(const std::string& weights_path) {
  const std::filesystem::path dir = std::filesystem::path(weights_path).parent_path();
  return (dir / "config.json").string();
}

Result<Gpt2Shape> read_hf_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return Status::not_found(path + ": no such file");
    return Status::from_errno(errno, "open", path);
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return config_error(path, "not valid JSON");
  return shape_from_hf_config(config, path);
}

}  // namespace tz::model
