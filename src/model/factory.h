// Which model a run means, before any engine exists, and the one place that builds it: a GPT-2
// preset or shape (model/gpt2.h), a Llama-family preset or shape (model/llama.h), or a Hugging Face
// folder whose config.json names GPT2LMHeadModel or one of the Llama family's architectures. The
// trainer, sampling, checkpoints and `estimate` use only this and model/model.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/gpt2.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/model.h"
#include "zero/engine.h"

namespace tz::model {

struct ModelDesc {
  std::string name;    // the preset, the custom spec, or the folder
  std::string family;  // "gpt2" | "llama"
  int vocab = 0;
  int seq = 0;         // the model's positions
  std::string folder;  // the Hugging Face folder it was read from (empty otherwise)
  std::variant<Gpt2Shape, LlamaConfig> arch;
  // LoRA adapters on a frozen base (model/lora.h), or none: full training.
  std::optional<LoraSpec> lora;

  std::uint64_t param_count() const;  // the base's (adapters not counted)
};

// A preset name, a custom spec ("gpt2:..." or "llama:...") or a folder holding config.json.
// Errors: kInvalidArgument naming the name, the field or the config key (one line); for a folder
// without config.json, one line naming the file.
Result<ModelDesc> resolve_model(std::string_view name);

// The LoRA spec of `--lora TEXT` (`flag` names it in errors) or of the PEFT adapter folder `dir`
// for `desc`'s family, checked against its modules (model/lora.h). GPT-2 has no adapters yet:
// kInvalidArgument naming the model.
Result<LoraSpec> parse_lora(const ModelDesc& desc, std::string_view text,
                            std::string_view flag = "--lora");
Result<LoraSpec> read_adapter(const ModelDesc& desc, const std::string& dir);

// Which frozen base a LoRA run trains on, for its checkpoints (zero::CheckpointExtra::base):
// "random <model> seed <seed>" for a base from the family's initialisation, else the weights'
// source (`init`, or the model's folder) and an FNV-1a 64 hash of its config.json and safetensors
// files' names, sizes and first MiB (their headers: every tensor's name, dtype, shape and offset;
// hashing every byte of a 16 GB base would cost a minute). Empty without adapters.
std::string base_identity(const ModelDesc& desc, const std::string& init, std::uint64_t seed);

// Every preset name of every family, for help texts.
std::vector<std::string> all_preset_names();

// What the family's units (with desc.lora: the base frozen, the adapters after each layer),
// checkpointing default and activation bytes are for `desc`.
std::vector<zero::UnitSpec> unit_specs(const ModelDesc& desc);
bool checkpointing_enabled(const ModelDesc& desc, const ModelOptions& options);
std::uint64_t activation_bytes(const ModelDesc& desc, const ModelOptions& options, DType compute);

// The family's model registered with `engine` (before engine.finalize()).
Result<std::unique_ptr<Model>> create_model(const ModelDesc& desc, const ModelOptions& options,
                                            zero::Engine& engine);

}  // namespace tz::model
