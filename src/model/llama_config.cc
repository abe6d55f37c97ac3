// The Llama family's config.json (model/llama.h): parsing with the refusals, the presets (the
// published config.json of each, parsed by the same code), custom shapes, the rotary frequencies,
// the parameter count and the unit layout.
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "model/gpt2.h"
#include "model/llama.h"

namespace tz::model {
namespace {

Status key_error(std::string_view origin, const std::string& what) {
  return Status::invalid_argument(std::string(origin) + ": " + what);
}

// The published config.json of each preset (the keys tierzero reads; random weights).
struct Preset {
  std::string_view name;
  std::string_view json;
};
constexpr std::array<Preset, 6> kPresets = {{
    {"llama-3.2-1b",
     R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
         "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
         "rope_theta": 500000.0, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
         "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "attention_bias": false, "mlp_bias": false, "tie_word_embeddings": true,
         "initializer_range": 0.02, "bos_token_id": 128000, "eos_token_id": 128001})"},
    {"llama-3.2-3b",
     R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
         "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
         "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
         "rope_theta": 500000.0, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
         "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "attention_bias": false, "mlp_bias": false, "tie_word_embeddings": true,
         "initializer_range": 0.02, "bos_token_id": 128000, "eos_token_id": 128001})"},
    {"llama-3.1-8b",
     R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
         "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
         "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "attention_bias": false, "mlp_bias": false, "tie_word_embeddings": false,
         "initializer_range": 0.02, "bos_token_id": 128000, "eos_token_id": 128001})"},
    {"qwen3-0.6b",
     R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
         "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
         "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
         "rope_theta": 1000000, "rope_scaling": null, "attention_bias": false,
         "use_sliding_window": false, "sliding_window": null, "tie_word_embeddings": true,
         "initializer_range": 0.02, "bos_token_id": 151643, "eos_token_id": 151645})"},
    {"qwen3-4b",
     R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
         "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
         "rope_theta": 1000000, "rope_scaling": null, "attention_bias": false,
         "use_sliding_window": false, "sliding_window": null, "tie_word_embeddings": true,
         "initializer_range": 0.02, "bos_token_id": 151643, "eos_token_id": 151645})"},
    {"mistral-7b",
     R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
         "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "vocab_size": 32768, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
         "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
         "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2})"},
}};
constexpr std::string_view kCustomPrefix = "llama:";

std::string_view type_for(std::string_view architecture) {
  if (architecture == "LlamaForCausalLM") return "llama";
  if (architecture == "MistralForCausalLM") return "mistral";
  if (architecture == "Qwen2ForCausalLM") return "qwen2";
  if (architecture == "Qwen3ForCausalLM") return "qwen3";
  return {};
}
std::string_view architecture_for(std::string_view type) {
  if (type == "llama") return "LlamaForCausalLM";
  if (type == "mistral") return "MistralForCausalLM";
  if (type == "qwen2") return "Qwen2ForCausalLM";
  if (type == "qwen3") return "Qwen3ForCausalLM";
  return {};
}

// The rope section: `theta` from rope_theta (top level, or inside rope_parameters), the type and
// the llama3 factors from rope_scaling or rope_parameters.
Status parse_rope(const nlohmann::json& config, std::string_view origin, LlamaConfig& c) {
  const nlohmann::json* section = nullptr;
  std::string section_name;
  if (const auto it = config.find("rope_parameters"); it != config.end() && !it->is_null()) {
    if (!it->is_object()) return key_error(origin, "key 'rope_parameters' is " + it->dump() + ", not an object");
    section = &*it;
    section_name = "rope_parameters";
  }
  if (const auto it = config.find("rope_scaling"); it != config.end() && !it->is_null()) {
    if (!it->is_object()) return key_error(origin, "key 'rope_scaling' is " + it->dump() + ", not an object");
    if (section == nullptr) {
      section = &*it;
      section_name = "rope_scaling";
    }
  }
  const nlohmann::json* theta = nullptr;
  if (const auto it = config.find("rope_theta"); it != config.end() && !it->is_null()) theta = &*it;
  if (section != nullptr && section_name == "rope_parameters") {
    if (const auto it = section->find("rope_theta"); it != section->end() && !it->is_null()) {
      theta = &*it;
    }
  }
  if (theta != nullptr) {
    if (!theta->is_number() || theta->get<double>() <= 0) {
      return key_error(origin, "key 'rope_theta' is " + theta->dump() + ", not a positive number");
    }
    c.rope_theta = theta->get<double>();
  }
  if (section == nullptr) return Status::ok();
  std::string type = "default";
  std::string type_key = section_name + ".rope_type";
  if (const auto it = section->find("rope_type"); it != section->end() && it->is_string()) {
    type = it->get<std::string>();
  } else if (const auto t = section->find("type"); t != section->end() && t->is_string()) {
    type = t->get<std::string>();
    type_key = section_name + ".type";
  }
  if (type == "default") return Status::ok();
  if (type != "llama3") {
    return key_error(origin, "key '" + type_key + "' is \"" + type +
                                 "\"; tierzero computes the default rope and \"llama3\" only");
  }
  Llama3RopeScaling s;
  const auto number = [&](const char* key, double& out) -> Status {
    const auto it = section->find(key);
    if (it == section->end() || !it->is_number() || it->get<double>() <= 0) {
      return key_error(origin, "key '" + section_name + "." + key + "' is " +
                                   (it == section->end() ? std::string("missing") : it->dump()) +
                                   "; llama3 rope scaling needs a positive number");
    }
    out = it->get<double>();
    return Status::ok();
  };
  double original = 0;
  TZ_RETURN_IF_ERROR(number("factor", s.factor));
  TZ_RETURN_IF_ERROR(number("low_freq_factor", s.low_freq_factor));
  TZ_RETURN_IF_ERROR(number("high_freq_factor", s.high_freq_factor));
  TZ_RETURN_IF_ERROR(number("original_max_position_embeddings", original));
  if (s.high_freq_factor <= s.low_freq_factor) {
    return key_error(origin, "key '" + section_name + ".high_freq_factor' (" +
                                 std::to_string(s.high_freq_factor) +
                                 ") must be above low_freq_factor (" +
                                 std::to_string(s.low_freq_factor) + ")");
  }
  s.original_max_position_embeddings = static_cast<int>(original);
  c.rope_llama3 = s;
  return Status::ok();
}

}  // namespace

std::uint64_t LlamaConfig::layer_param_count() const {
  const auto h = static_cast<std::uint64_t>(hidden);
  const auto q = static_cast<std::uint64_t>(heads) * static_cast<std::uint64_t>(head_dim);
  const auto kv = static_cast<std::uint64_t>(kv_heads) * static_cast<std::uint64_t>(head_dim);
  const auto f = static_cast<std::uint64_t>(ffn);
  std::uint64_t block = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * f;
  if (qkv_bias) block += q + 2 * kv;
  if (o_bias) block += h;
  if (qk_norm) block += 2 * static_cast<std::uint64_t>(head_dim);
  if (mlp_bias) block += 2 * f + h;
  return block;
}

std::uint64_t LlamaConfig::param_count() const {
  const auto h = static_cast<std::uint64_t>(hidden);
  const std::uint64_t embed = static_cast<std::uint64_t>(vocab) * h;
  return embed + static_cast<std::uint64_t>(layers) * layer_param_count() + h +
         (tie_word_embeddings ? 0 : embed);
}

namespace {

// Reads config.json's keys for llama_config_from_json, each error naming the key and its value.
struct ConfigReader {
  const nlohmann::json& config;
  std::string_view origin;

  Status positive_int(const char* key, int& out, bool required) const {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) {
      if (!required) return Status::ok();
      return key_error(origin, std::string("key '") + key + "' is missing");
    }
    if (!it->is_number_integer() || it->get<std::int64_t>() <= 0 ||
        it->get<std::int64_t>() > (std::int64_t{1} << 30)) {
      return key_error(origin, std::string("key '") + key + "' is " + it->dump() +
                                   ", not a positive integer");
    }
    out = static_cast<int>(it->get<std::int64_t>());
    return Status::ok();
  }
  Result<bool> flag(const char* key, bool fallback) const {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) {
      return key_error(origin, std::string("key '") + key + "' is " + it->dump() +
                                   ", not a boolean");
    }
    return it->get<bool>();
  }
};

// 'architectures' and 'model_type': one of the four, and the two agreeing.
Status parse_architecture(const nlohmann::json& config, std::string_view origin, LlamaConfig& c) {
  std::string architecture;
  if (const auto it = config.find("architectures"); it != config.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 1 || !(*it)[0].is_string() ||
        type_for((*it)[0].get<std::string>()).empty()) {
      return key_error(origin, "key 'architectures' is " + it->dump() +
                                   "; tierzero computes LlamaForCausalLM, MistralForCausalLM, "
                                   "Qwen2ForCausalLM and Qwen3ForCausalLM");
    }
    architecture = (*it)[0].get<std::string>();
  }
  std::string type;
  if (const auto it = config.find("model_type"); it != config.end()) {
    if (!it->is_string() || architecture_for(it->get<std::string>()).empty()) {
      return key_error(origin, "key 'model_type' is " + it->dump() +
                                   "; tierzero computes llama, mistral, qwen2 and qwen3");
    }
    type = it->get<std::string>();
  }
  if (architecture.empty() && type.empty()) {
    return key_error(origin, "key 'architectures' (or 'model_type') is missing");
  }
  if (architecture.empty()) architecture = std::string(architecture_for(type));
  if (type.empty()) type = std::string(type_for(architecture));
  if (type_for(architecture) != type) {
    return key_error(origin, "key 'model_type' is \"" + type + "\" but 'architectures' is [\"" +
                                 architecture + "\"]");
  }
  c.architecture = architecture;
  c.model_type = type;

  return Status::ok();
}

// The shape: layers, heads, sizes, positions, kv heads and head_dim.
Status parse_shape(const ConfigReader& r, std::string_view origin, LlamaConfig& c) {
  TZ_RETURN_IF_ERROR(r.positive_int("num_hidden_layers", c.layers, true));
  TZ_RETURN_IF_ERROR(r.positive_int("num_attention_heads", c.heads, true));
  TZ_RETURN_IF_ERROR(r.positive_int("hidden_size", c.hidden, true));
  TZ_RETURN_IF_ERROR(r.positive_int("intermediate_size", c.ffn, true));
  TZ_RETURN_IF_ERROR(r.positive_int("vocab_size", c.vocab, true));
  TZ_RETURN_IF_ERROR(r.positive_int("max_position_embeddings", c.positions, true));
  c.kv_heads = c.heads;
  TZ_RETURN_IF_ERROR(r.positive_int("num_key_value_heads", c.kv_heads, false));
  c.head_dim = 0;
  TZ_RETURN_IF_ERROR(r.positive_int("head_dim", c.head_dim, false));
  if (c.head_dim == 0) {
    if (c.hidden % c.heads != 0) {
      return key_error(origin, "key 'hidden_size' (" + std::to_string(c.hidden) +
                                   ") is not a multiple of 'num_attention_heads' (" +
                                   std::to_string(c.heads) + ") and 'head_dim' is not given");
    }
    c.head_dim = c.hidden / c.heads;
  }
  if (c.head_dim % 2 != 0) {
    return key_error(origin, "key 'head_dim' is " + std::to_string(c.head_dim) +
                                 "; rotary embeddings need an even head_dim");
  }
  if (c.heads % c.kv_heads != 0) {
    return key_error(origin, "key 'num_key_value_heads' is " + std::to_string(c.kv_heads) +
                                 ", not a divisor of 'num_attention_heads' (" +
                                 std::to_string(c.heads) + ")");
  }
  return Status::ok();
}

// Activation, norm epsilon, rope, biases, tying, dropout, sliding window and init range.
Status parse_options(const ConfigReader& r, const nlohmann::json& config, std::string_view origin,
                     LlamaConfig& c) {
  const std::string& type = c.model_type;
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    if (const auto it = config.find(key); it != config.end() && !it->is_null() && *it != "silu") {
      return key_error(origin, std::string("key '") + key + "' is " + it->dump() +
                                   "; tierzero computes the family's MLP with \"silu\" only");
    }
  }
  if (const auto it = config.find("rms_norm_eps"); it != config.end()) {
    if (!it->is_number() || it->get<double>() <= 0) {
      return key_error(origin, "key 'rms_norm_eps' is " + it->dump() + ", not a positive number");
    }
    c.rms_norm_eps = it->get<double>();
  }
  TZ_RETURN_IF_ERROR(parse_rope(config, origin, c));
  TZ_ASSIGN_OR_RETURN(const bool attention_bias, r.flag("attention_bias", false));
  TZ_ASSIGN_OR_RETURN(const bool mlp_bias, r.flag("mlp_bias", false));
  TZ_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.flag("tie_word_embeddings", false));
  // Which projections carry biases, as each family's modeling file builds its Linear layers.
  if (type == "llama") {
    c.qkv_bias = c.o_bias = attention_bias;
    c.mlp_bias = mlp_bias;
  } else if (type == "qwen3") {
    c.qkv_bias = c.o_bias = attention_bias;
    c.qk_norm = true;
  } else if (type == "qwen2") {
    c.qkv_bias = true;
  }
  if (const auto it = config.find("pretraining_tp");
      it != config.end() && !it->is_null() && *it != 1) {
    return key_error(origin, "key 'pretraining_tp' is " + it->dump() + "; tierzero computes 1");
  }
  if (const auto it = config.find("attention_dropout");
      it != config.end() && !it->is_null() && (!it->is_number() || it->get<double>() != 0.0)) {
    return key_error(origin, "key 'attention_dropout' is " + it->dump() +
                                 "; tierzero trains without dropout (0.0)");
  }
  // Sliding-window attention: Mistral's whenever set, Qwen's only with use_sliding_window.
  bool window_applies = type == "mistral";
  if (type == "qwen2" || type == "qwen3") {
    TZ_ASSIGN_OR_RETURN(window_applies, r.flag("use_sliding_window", false));
  }
  if (window_applies) {
    int window = 0;
    TZ_RETURN_IF_ERROR(r.positive_int("sliding_window", window, false));
    if (window > 0) c.sliding_window = window;
  }
  if (const auto it = config.find("initializer_range"); it != config.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() <= 0) {
      return key_error(origin, "key 'initializer_range' is " + it->dump() + ", not a positive number");
    }
    c.initializer_range = it->get<double>();
  }
  return Status::ok();
}

}  // namespace

Result<LlamaConfig> llama_config_from_json(const nlohmann::json& config, std::string_view origin) {
  if (!config.is_object()) return key_error(origin, "not a JSON object");
  LlamaConfig c;
  c.name = std::string(origin);
  TZ_RETURN_IF_ERROR(parse_architecture(config, origin, c));
  const ConfigReader reader{config, origin};
  TZ_RETURN_IF_ERROR(parse_shape(reader, origin, c));
  TZ_RETURN_IF_ERROR(parse_options(reader, config, origin, c));
  c.source = config;
  return c;
}

nlohmann::ordered_json llama_hf_config(const LlamaConfig& c, DType dtype) {
  nlohmann::ordered_json j;
  if (c.source.is_object()) {
    // The source's keys (token ids, transformers_version, ...) with tierzero's values over them.
    j = nlohmann::ordered_json::parse(c.source.dump());
  }
  j["architectures"] = {c.architecture};
  j["model_type"] = c.model_type;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.ffn;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab;
  j["max_position_embeddings"] = c.positions;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["initializer_range"] = c.initializer_range;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.model_type == "llama" || c.model_type == "qwen3") j["attention_bias"] = c.qkv_bias;
  if (c.model_type == "llama") j["mlp_bias"] = c.mlp_bias;
  if (!j.contains("rope_parameters")) {
    j["rope_theta"] = c.rope_theta;
    if (c.rope_llama3) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_llama3->factor},
                           {"low_freq_factor", c.rope_llama3->low_freq_factor},
                           {"high_freq_factor", c.rope_llama3->high_freq_factor},
                           {"original_max_position_embeddings",
                            c.rope_llama3->original_max_position_embeddings}};
    } else {
      j["rope_scaling"] = nullptr;
    }
  }
  j["torch_dtype"] = dtype == DType::kF32 ? "float32" : dtype == DType::kBF16 ? "bfloat16" : "float16";
  if (!c.source.is_object() || !c.source.contains("tierzero_model")) j["tierzero_model"] = c.name;
  return j;
}

std::vector<std::string> llama_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

Result<LlamaConfig> parse_llama_model(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      const nlohmann::json j = nlohmann::json::parse(p.json);
      // The published file stays the source, so a saved folder keeps its token ids.
      TZ_ASSIGN_OR_RETURN(LlamaConfig c, llama_config_from_json(j, name));
      c.name = std::string(name);
      return c;
    }
  }
  if (!name.starts_with(kCustomPrefix)) {
    return Status::not_found("model '" + std::string(name) + "' is not a Llama-family preset");
  }
  const auto error = [&](const std::string& what) {
    return Status::invalid_argument("model '" + std::string(name) + "': " + what);
  };
  struct Field {
    std::string_view key;
    int value = 0;
  };
  // The last, vocab_chunks, is optional (LlamaConfig::vocab_chunks: the chunk count forced).
  std::array<Field, 8> fields = {{{"layers"}, {"heads"}, {"kv_heads"}, {"embd"}, {"ffn"},
                                  {"vocab"}, {"seq"}, {"vocab_chunks"}}};
  std::string_view rest = name.substr(kCustomPrefix.size());
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) return error("'" + std::string(item) + "' is not key=value");
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    Field* field = nullptr;
    for (Field& f : fields) {
      if (f.key == key) field = &f;
    }
    if (field == nullptr) {
      return error("unknown field '" + std::string(key) +
                   "' (fields: layers, heads, kv_heads, embd, ffn, vocab, seq, vocab_chunks)");
    }
    if (field->value != 0) return error("field '" + std::string(key) + "' given twice");
    long long parsed = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
    if (ec != std::errc{} || end != value.data() + value.size() || parsed <= 0 ||
        parsed > (1 << 30)) {
      return error("field '" + std::string(key) + "' must be a whole number in [1, 2^30], not '" +
                   std::string(value) + "'");
    }
    field->value = static_cast<int>(parsed);
  }
  for (const Field& f : fields) {
    if (f.value == 0 && f.key != "vocab_chunks") {
      return error("field '" + std::string(f.key) + "' is missing");
    }
  }
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"num_hidden_layers", fields[0].value},
                      {"num_attention_heads", fields[1].value},
                      {"num_key_value_heads", fields[2].value},
                      {"hidden_size", fields[3].value},
                      {"intermediate_size", fields[4].value},
                      {"vocab_size", fields[5].value},
                      {"max_position_embeddings", fields[6].value},
                      {"rms_norm_eps", 1e-5},
                      {"rope_theta", 500000.0},
                      {"tie_word_embeddings", false}};
  TZ_ASSIGN_OR_RETURN(LlamaConfig c, llama_config_from_json(j, "model '" + std::string(name) + "'"));
  c.name = std::string(name);
  c.source = nullptr;
  c.vocab_chunks = fields[7].value;
  return c;
}

std::vector<float> rope_inv_freq(const LlamaConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> out(static_cast<std::size_t>(half));
  constexpr double kPi = 3.14159265358979323846;
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / c.head_dim);
    if (c.rope_llama3) {
      const Llama3RopeScaling& s = *c.rope_llama3;
      const double old_len = s.original_max_position_embeddings;
      const double low_wavelen = old_len / s.low_freq_factor;
      const double high_wavelen = old_len / s.high_freq_factor;
      const double wavelen = 2 * kPi / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;  // low frequencies: scaled down by the factor
      } else if (wavelen >= high_wavelen) {
        // Medium frequencies: smoothly between scaled and unscaled.
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    out[static_cast<std::size_t>(i)] = static_cast<float>(f);
  }
  return out;
}

VocabChunks llama_vocab_chunks(const LlamaConfig& c) {
  const std::int64_t vocab = c.vocab, h = c.hidden;
  VocabChunks v{1, vocab};
  int count = c.vocab_chunks;
  if (count == 0) {
    const std::uint64_t embed = static_cast<std::uint64_t>(vocab) * static_cast<std::uint64_t>(h);
    const std::uint64_t layer = c.layer_param_count();
    if (embed <= kVocabChunkMinParams || embed <= layer || h <= 0) return v;
    const std::int64_t rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(layer) / h);
    count = static_cast<int>((vocab + rows - 1) / rows);
  }
  count = static_cast<int>(std::clamp<std::int64_t>(count, 1, vocab));
  v.rows = (vocab + count - 1) / count;
  v.count = static_cast<int>((vocab + v.rows - 1) / v.rows);  // no empty chunk
  return v;
}

std::vector<zero::UnitSpec> unit_specs(const LlamaConfig& c) {
  const std::int64_t h = c.hidden, q = static_cast<std::int64_t>(c.heads) * c.head_dim;
  const std::int64_t kv = static_cast<std::int64_t>(c.kv_heads) * c.head_dim, f = c.ffn;
  const VocabChunks chunks = llama_vocab_chunks(c);
  // The embedding (or the untied head) whole, or its chunks as units named prefix.{i}.
  const auto vocab_units = [&](const std::string& prefix, const std::string& tensor,
                               std::vector<zero::UnitSpec>& out) {
    for (int i = 0; i < chunks.count; ++i) {
      out.push_back({prefix + "." + std::to_string(i), {{tensor, {chunks.size(i, c.vocab), h}}}});
    }
  };
  std::vector<zero::UnitSpec> units;
  if (chunks.count == 1) {
    units.push_back({"embed", {{"model.embed_tokens.weight", {c.vocab, h}}}});
  } else {
    vocab_units("embed", "model.embed_tokens.weight", units);
  }
  for (int i = 0; i < c.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    zero::UnitSpec u{"layers." + std::to_string(i), {}};
    u.tensors.push_back({p + "input_layernorm.weight", {h}});
    u.tensors.push_back({p + "self_attn.q_proj.weight", {q, h}});
    if (c.qkv_bias) u.tensors.push_back({p + "self_attn.q_proj.bias", {q}});
    u.tensors.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    if (c.qkv_bias) u.tensors.push_back({p + "self_attn.k_proj.bias", {kv}});
    u.tensors.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    if (c.qkv_bias) u.tensors.push_back({p + "self_attn.v_proj.bias", {kv}});
    u.tensors.push_back({p + "self_attn.o_proj.weight", {h, q}});
    if (c.o_bias) u.tensors.push_back({p + "self_attn.o_proj.bias", {h}});
    if (c.qk_norm) {
      u.tensors.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      u.tensors.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    u.tensors.push_back({p + "post_attention_layernorm.weight", {h}});
    u.tensors.push_back({p + "mlp.gate_proj.weight", {f, h}});
    if (c.mlp_bias) u.tensors.push_back({p + "mlp.gate_proj.bias", {f}});
    u.tensors.push_back({p + "mlp.up_proj.weight", {f, h}});
    if (c.mlp_bias) u.tensors.push_back({p + "mlp.up_proj.bias", {f}});
    u.tensors.push_back({p + "mlp.down_proj.weight", {h, f}});
    if (c.mlp_bias) u.tensors.push_back({p + "mlp.down_proj.bias", {h}});
    units.push_back(std::move(u));
  }
  zero::UnitSpec norm{"norm", {{"model.norm.weight", {h}}}};
  if (!c.tie_word_embeddings && chunks.count == 1) {
    norm.tensors.push_back({"lm_head.weight", {c.vocab, h}});
  }
  units.push_back(std::move(norm));
  if (!c.tie_word_embeddings && chunks.count > 1) vocab_units("lm_head", "lm_head.weight", units);
  return units;
}

std::vector<zero::UnitSpec> unit_specs(const LlamaConfig& c, const LoraSpec* lora) {
  std::vector<zero::UnitSpec> base = unit_specs(c);
  if (lora == nullptr) return base;
  const std::span<const std::string_view> modules = llama_lora_modules();
  std::vector<zero::UnitSpec> units;
  for (zero::UnitSpec& u : base) {
    u.frozen = true;
    const bool layer = u.name.starts_with("layers.");
    const std::string name = u.name;
    units.push_back(std::move(u));
    if (!layer) continue;
    const int i = std::stoi(name.substr(7));
    zero::UnitSpec adapters{name + ".lora", {}};
    for (std::size_t k = 0; k < modules.size(); ++k) {
      const std::string_view m = modules[k];
      if (std::find(lora->targets.begin(), lora->targets.end(), m) == lora->targets.end()) continue;
      const auto [in, out] = llama_lora_dims(c, static_cast<int>(k));
      adapters.tensors.push_back({llama_lora_tensor_name(i, m, false), {lora->r, in}});
      adapters.tensors.push_back({llama_lora_tensor_name(i, m, true), {out, lora->r}});
    }
    units.push_back(std::move(adapters));
  }
  return units;
}

bool checkpointing_enabled(const LlamaConfig& config, const ModelOptions& options) {
  return checkpointing_enabled(options, config.param_count());
}

}  // namespace tz::model
