// Which model a run means, before any engine exists, and the one place that builds it: a GPT-2
// preset or shape (model/gpt2.h), a Llama-family preset or shape (model/llama.h), or a Hugging Face
// folder whose config.json names GPT2LMHeadModel or one of the Llama family's architectures. The
// trainer, sampling, checkpoints and `estimate` use only this and model/model.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/gpt2.h"
#include "model/llama.h"
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

  std::uint64_t param_count() const;
};

// A preset name, a custom spec ("gpt2:..." or "llama:...") or a folder holding config.json.
// Errors: kInvalidArgument naming the name, the field or the config key (one line); for a folder
// without config.json, one line naming the file.
Result<ModelDesc> resolve_model(std::string_view name);

// Every preset name of every family, for help texts.
std::vector<std::string> all_preset_names();

// What the family's units, checkpointing default and activation bytes are for `desc`.
std::vector<zero::UnitSpec> unit_specs(const ModelDesc& desc);
bool checkpointing_enabled(const ModelDesc& desc, const ModelOptions& options);
std::uint64_t activation_bytes(const ModelDesc& desc, const ModelOptions& options, DType compute);

// The family's model registered with `engine` (before engine.finalize()).
Result<std::unique_ptr<Model>> create_model(const ModelDesc& desc, const ModelOptions& options,
                                            zero::Engine& engine);

}  // namespace tz::model
