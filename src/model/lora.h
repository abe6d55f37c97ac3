// LoRA adapters as PEFT defines them (LoraConfig with peft_type "LORA", nothing else): the
// `--lora r=R,alpha=A,targets=q_proj,v_proj[,dropout=P]` spec, PEFT's adapter folder
// (adapter_config.json and adapter_model.safetensors) read and written, and PEFT's tensor names. A
// linear module W with an adapter computes W x + (alpha / r) B A dropout(x), A (r, in) and B
// (out, r) as nn.Linear weights; the family (model/llama.h) trains A and B on a frozen base.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace tz::model {

inline constexpr std::string_view kAdapterConfigFile = "adapter_config.json";
inline constexpr std::string_view kAdapterWeightsFile = "adapter_model.safetensors";

struct LoraSpec {
  int r = 0;                         // rank, >= 1
  double alpha = 0;                  // lora_alpha; the adapter's output is scaled by alpha / r
  std::vector<std::string> targets;  // module names ("q_proj"), in the family's layer order
  double dropout = 0;                // lora_dropout on the adapter's input, in [0, 1)
  // The PEFT folder the spec was read from (read_adapter_config): the model starts its adapters
  // from its adapter_model.safetensors (when present) instead of PEFT's initialisation. Empty for
  // --lora.
  std::string adapter;
  double scale() const { return alpha / static_cast<double>(r); }
};

// The linear modules of a Llama-family layer that take adapters, in layer order.
std::span<const std::string_view> llama_lora_modules();

// "r=R[,alpha=A][,targets=M1,M2,...][,dropout=P]" (keys in any order; a bare name after
// targets= continues the list; targets=all-linear is every module of `modules`). Defaults: alpha
// = r (scale 1), targets q_proj,v_proj (PEFT's for the Llama family), dropout 0. One-line
// kInvalidArgument naming `flag` and the key: r missing or <= 0, alpha <= 0 or not a
// number, dropout outside [0, 1), an unknown key, a target module not in `modules` (naming
// `model`), a key given twice.
Result<LoraSpec> parse_lora_spec(std::string_view text, std::span<const std::string_view> modules,
                                 std::string_view model, std::string_view flag = "--lora");

// The spec's numbers: r >= 1, alpha > 0, dropout in [0, 1). kInvalidArgument "WHERE: KEY is V;
// ..." for the first that is not (parse_lora_spec and read_adapter_config check them; a model
// checks a spec built in code).
Status check_lora_values(const LoraSpec& spec, const std::string& where);

// Reads DIR/adapter_config.json as a LoRA spec for a model whose layers hold `modules`. Refused,
// one line naming the file and the key: not a LoRA adapter (peft_type other than LORA: "ADALORA",
// "IA3", "LOHA", ... named as unsupported), bias other than "none", modules_to_save, DoRA
// (use_dora), rsLoRA (use_rslora), per-module ranks or alphas (rank_pattern, alpha_pattern),
// layers_to_transform / layers_pattern / layer_replication, fan_in_fan_out, LoRA on embeddings
// or biases (lora_bias), r <= 0, a target module the model does not have, a regex target.
Result<LoraSpec> read_adapter_config(const std::string& dir,
                                     std::span<const std::string_view> modules,
                                     std::string_view model);

// PEFT's adapter_config.json for `spec` on the base `base_model` (a folder or a preset name).
nlohmann::ordered_json adapter_config_json(const LoraSpec& spec, const std::string& base_model);

// PEFT's saved name of a Llama-family adapter tensor:
// "base_model.model.model.layers.{layer}.{self_attn|mlp}.{module}.lora_{A|B}.weight".
std::string llama_lora_tensor_name(int layer, std::string_view module, bool b);

// PEFT's initialisation of lora_A (r, in): nn.init.kaiming_uniform_(a=sqrt(5)), i.e. uniform
// in [-1/sqrt(in), 1/sqrt(in)], from the stream of (seed, unit, tensor) (model/init.h).
void fill_lora_a(std::span<float> out, std::int64_t in_features, std::uint64_t seed,
                 std::uint64_t unit, std::uint64_t tensor);

}  // namespace tz::model
