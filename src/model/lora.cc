// LoRA specs and PEFT adapter folders (model/lora.h): the --lora parser, adapter_config.json's
// checks, its writer's JSON, PEFT's tensor names and lora_A's initialisation.
#include "model/lora.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "model/init.h"

namespace tz::model {
namespace {

constexpr std::array<std::string_view, 7> kLlamaModules = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

std::string joined(std::span<const std::string_view> names) {
  std::string s;
  for (const std::string_view n : names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

bool has_module(std::span<const std::string_view> modules, std::string_view name) {
  return std::find(modules.begin(), modules.end(), name) != modules.end();
}

// `names` checked against `modules` and put in the modules' order.
Result<std::vector<std::string>> ordered_targets(const std::vector<std::string>& names,
                                                 std::span<const std::string_view> modules,
                                                 std::string_view model,
                                                 const std::string& where) {
  if (names.empty()) return Status::invalid_argument(where + ": no target module given");
  std::set<std::string, std::less<>> seen;
  for (const std::string& n : names) {
    if (!has_module(modules, n)) {
      return Status::invalid_argument(where + ": target module '" + n + "': model " +
                                      std::string(model) + " has no such module (its linear "
                                      "modules: " + joined(modules) + ")");
    }
    if (!seen.insert(n).second) {
      return Status::invalid_argument(where + ": target module '" + n + "' given twice");
    }
  }
  std::vector<std::string> out;
  for (const std::string_view m : modules) {
    if (seen.contains(m)) out.emplace_back(m);
  }
  return out;
}

Result<double> parse_number(std::string_view value, const std::string& where) {
  double v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(v)) {
    return Status::invalid_argument(where + " is '" + std::string(value) + "', not a number");
  }
  return v;
}

}  // namespace

std::span<const std::string_view> llama_lora_modules() { return kLlamaModules; }

Status check_lora_values(const LoraSpec& s, const std::string& where) {
  if (s.r <= 0) {
    return Status::invalid_argument(where + ": r is " + std::to_string(s.r) +
                                    "; the rank must be at least 1");
  }
  if (!(s.alpha > 0)) {
    return Status::invalid_argument(where + ": alpha is " + std::to_string(s.alpha) +
                                    "; it must be > 0");
  }
  if (!(s.dropout >= 0 && s.dropout < 1)) {
    return Status::invalid_argument(where + ": dropout is " + std::to_string(s.dropout) +
                                    "; it must be in [0, 1)");
  }
  return Status::ok();
}

Result<LoraSpec> parse_lora_spec(std::string_view text, std::span<const std::string_view> modules,
                                 std::string_view model, std::string_view flag) {
  const std::string f(flag);
  LoraSpec spec;
  bool have_r = false, have_alpha = false, have_targets = false, have_dropout = false;
  std::vector<std::string> targets;
  std::string key;  // the key a bare name continues (only targets takes a list)
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, comma - at);
    at = comma + 1;
    if (item.empty()) {
      return Status::invalid_argument(f + ": empty item in '" + std::string(text) +
                                      "' (use r=R,alpha=A,targets=q_proj,v_proj,dropout=P)");
    }
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      if (key != "targets") {
        return Status::invalid_argument(f + ": '" + std::string(item) +
                                        "' is not key=value (keys: r, alpha, targets, dropout)");
      }
      targets.emplace_back(item);
      continue;
    }
    key = std::string(item.substr(0, eq));
    const std::string_view value = item.substr(eq + 1);
    const std::string where = f + ": " + key;
    bool* seen = key == "r"         ? &have_r
                 : key == "alpha"   ? &have_alpha
                 : key == "targets" ? &have_targets
                 : key == "dropout" ? &have_dropout
                                    : nullptr;
    if (seen == nullptr) {
      return Status::invalid_argument(f + ": unknown key '" + key +
                                      "' (keys: r, alpha, targets, dropout)");
    }
    if (*seen) return Status::invalid_argument(f + ": key '" + key + "' given twice");
    *seen = true;
    if (key == "r") {
      int r = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), r);
      if (ec != std::errc() || end != value.data() + value.size()) {
        return Status::invalid_argument(where + " is '" + std::string(value) + "', not an integer");
      }
      spec.r = r;
    } else if (key == "alpha") {
      TZ_ASSIGN_OR_RETURN(spec.alpha, parse_number(value, where));
    } else if (key == "dropout") {
      TZ_ASSIGN_OR_RETURN(spec.dropout, parse_number(value, where));
    } else if (value == "all-linear") {
      for (const std::string_view m : modules) targets.emplace_back(m);
    } else {
      targets.emplace_back(value);
    }
  }
  if (!have_r) return Status::invalid_argument(f + ": key 'r' is missing (r=R, the rank)");
  if (!have_alpha) spec.alpha = spec.r;
  if (!have_targets) targets = {"q_proj", "v_proj"};
  TZ_RETURN_IF_ERROR(check_lora_values(spec, f));
  TZ_ASSIGN_OR_RETURN(spec.targets, ordered_targets(targets, modules, model, f));
  return spec;
}

Result<LoraSpec> read_adapter_config(const std::string& dir,
                                     std::span<const std::string_view> modules,
                                     std::string_view model) {
  const std::string path = (std::filesystem::path(dir) / kAdapterConfigFile).string();
  std::ifstream in(path);
  if (!in) {
    return Status::invalid_argument(path + ": no such file (an adapter folder holds " +
                                    std::string(kAdapterConfigFile) + ")");
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::invalid_argument(path + ": not a JSON object");
  const auto bad = [&](const std::string& key, const nlohmann::json& v, const std::string& why) {
    return Status::invalid_argument(path + ": key '" + key + "' is " + v.dump() + "; " + why);
  };
  const std::string peft_type = j.value("peft_type", std::string("LORA"));
  if (peft_type != "LORA") {
    return bad("peft_type", j["peft_type"],
               "PEFT method " + peft_type + " is not supported (tierzero trains LoRA only)");
  }
  // PEFT's LoRA variants and options that change what is computed, each refused by name.
  struct Unsupported {
    const char* key;
    const char* what;
  };
  constexpr Unsupported kUnsupported[] = {
      {"use_dora", "DoRA is not supported"},
      {"use_rslora", "rsLoRA (scale alpha / sqrt(r)) is not supported"},
      {"modules_to_save", "modules_to_save (fully trained extra modules) is not supported"},
      {"rank_pattern", "per-module ranks are not supported"},
      {"alpha_pattern", "per-module alphas are not supported"},
      {"layers_to_transform", "adapters on a subset of layers are not supported"},
      {"layers_pattern", "adapters on a subset of layers are not supported"},
      {"layer_replication", "layer replication is not supported"},
      {"fan_in_fan_out", "fan_in_fan_out (Conv1D weights) is not supported for this family"},
      {"lora_bias", "LoRA biases are not supported"},
      {"use_qalora", "QA-LoRA is not supported"},
      {"target_parameters", "LoRA on parameters (not modules) is not supported"},
      {"trainable_token_indices", "trainable tokens are not supported"},
      {"exclude_modules", "exclude_modules is not supported"},
      {"alora_invocation_tokens", "activated LoRA (aLoRA) is not supported"},
      {"use_bdlora", "BD-LoRA is not supported"},
      {"velora_config", "VeLoRA is not supported"},
      {"kasa_config", "KaSA is not supported"},
      {"monteclora_config", "MonteCLoRA is not supported"},
      {"arrow_config", "Arrow routing is not supported"},
      {"megatron_config", "Megatron-parallel LoRA is not supported"},
  };
  for (const Unsupported& u : kUnsupported) {
    const auto it = j.find(u.key);
    if (it == j.end() || it->is_null()) continue;
    const bool off = (it->is_boolean() && !it->get<bool>()) ||
                     ((it->is_object() || it->is_array()) && it->empty());
    if (!off) return bad(u.key, *it, u.what);
  }
  if (const auto it = j.find("bias"); it != j.end() && *it != "none") {
    return bad("bias", *it, "only \"none\" is supported (no trained biases)");
  }
  if (const auto it = j.find("init_lora_weights");
      it != j.end() && !it->is_boolean() && *it != "gaussian") {
    // Only the initialisation differs (PiSSA, OLoRA, LoftQ change the base weights too).
    return bad("init_lora_weights", *it, "initialisations that change the base are not supported");
  }
  LoraSpec spec;
  const auto r = j.find("r");
  if (r == j.end() || !r->is_number_integer()) {
    return Status::invalid_argument(path + ": key 'r' is missing or not an integer");
  }
  spec.r = r->get<int>();
  const auto alpha = j.find("lora_alpha");
  spec.alpha = alpha != j.end() && alpha->is_number() ? alpha->get<double>() : 8.0;  // PEFT's
  const auto dropout = j.find("lora_dropout");
  spec.dropout = dropout != j.end() && dropout->is_number() ? dropout->get<double>() : 0.0;
  TZ_RETURN_IF_ERROR(check_lora_values(spec, path));
  const auto tm = j.find("target_modules");
  std::vector<std::string> targets;
  if (tm == j.end() || tm->is_null()) {
    return Status::invalid_argument(path + ": key 'target_modules' is missing");
  } else if (tm->is_string()) {
    if (*tm != "all-linear") {
      return bad("target_modules", *tm, "a regular expression of modules is not supported; list "
                 "the module names");
    }
    for (const std::string_view m : modules) targets.emplace_back(m);
  } else if (tm->is_array()) {
    for (const nlohmann::json& m : *tm) {
      if (!m.is_string()) return bad("target_modules", *tm, "module names must be strings");
      targets.push_back(m.get<std::string>());
    }
  } else {
    return bad("target_modules", *tm, "not a list of module names");
  }
  TZ_ASSIGN_OR_RETURN(spec.targets, ordered_targets(targets, modules, model, path));
  spec.adapter = dir;
  return spec;
}

nlohmann::ordered_json adapter_config_json(const LoraSpec& spec, const std::string& base_model) {
  nlohmann::ordered_json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = base_model;
  j["r"] = spec.r;
  j["lora_alpha"] = spec.alpha;
  j["lora_dropout"] = spec.dropout;
  j["target_modules"] = spec.targets;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["modules_to_save"] = nullptr;
  j["use_dora"] = false;
  j["use_rslora"] = false;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["rank_pattern"] = nlohmann::ordered_json::object();
  j["alpha_pattern"] = nlohmann::ordered_json::object();
  j["revision"] = nullptr;
  return j;
}

std::string llama_lora_tensor_name(int layer, std::string_view module, bool b) {
  const bool attention = module == "q_proj" || module == "k_proj" || module == "v_proj" ||
                         module == "o_proj";
  return "base_model.model.model.layers." + std::to_string(layer) +
         (attention ? ".self_attn." : ".mlp.") + std::string(module) +
         (b ? ".lora_B.weight" : ".lora_A.weight");
}

void fill_lora_a(std::span<float> out, std::int64_t in_features, std::uint64_t seed,
                 std::uint64_t unit, std::uint64_t tensor) {
  // kaiming_uniform_ with a = sqrt(5): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in).
  fill_uniform(out, 1.0 / std::sqrt(static_cast<double>(in_features)), seed, unit, tensor);
}

}  // namespace tz::model
