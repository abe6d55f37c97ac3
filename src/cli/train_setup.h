// How `tierzero train` turns a config file, a model shape and its flags into the model's and the
// engine's options. `tierzero estimate` calls the same functions, so the plan it prints is the
// plan the engine makes for the same run.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/dtype.h"
#include "model/factory.h"
#include "zero/engine.h"

namespace tz::cli {

// The config file, with `nvme_path` (when non-empty) written into every offload section whose
// device is nvme before validation (the schema requires a path there, and --nvme-path is how one
// gives it). The loader's diagnostics as load_config_file reports them.
ConfigLoad load_config_with_nvme_path(const std::string& config_path, const std::string& nvme_path);

// The same, as a run takes it: the config, or kInvalidArgument with the first error's line
// (naming the file). Warnings (unknown keys) are printed on stderr as
// "tierzero <command>: warning: <file>: <message>" before the run starts.
Result<Config> load_run_config(const std::string& command, const std::string& config_path,
                               const std::string& nvme_path);

// kInvalidArgument when --nvme-path `nvme_path` is given but `config` offloads nothing to nvme
// (`tierzero train` and `estimate` refuse it alike); OK otherwise.
Status check_nvme_path_used(const Config& config, const std::string& config_path,
                            const std::string& nvme_path);

// A folder the swap files go to (`tierzero train` and `estimate` check it alike): it must exist,
// be a folder, accept a new file and have `needed_bytes` free (the shortfall named).
Status check_swap_path(const std::string& dir, std::uint64_t needed_bytes);

// The shape of `--model name`, with the adapters of `--lora lora` or `--adapter adapter` (at most
// one of them; both empty: full training). Errors: the model's, the spec's, or kInvalidArgument
// when both are given.
Result<model::ModelDesc> resolve_run_model(const std::string& name, const std::string& lora,
                                           const std::string& adapter);

// bf16, fp16 or fp32, as the config's precision sections say.
DType compute_dtype_of(const Config& config);

// The model's options for a run: the config's micro-batch, `seq` tokens per sequence (0 = the
// shape's positions), `checkpointing` (-1 = the model's default) and `cpu_threads` per rank.
model::ModelOptions model_options_for(const Config& config, int seq, int checkpointing,
                                     int cpu_threads);

// The engine's options for one rank of that run: the config, --nvme-path, the model's device
// activations (model::activation_bytes, so the plan's device term counts them) and the seed.
zero::EngineOptions engine_options_for(const Config& config, const model::ModelDesc& shape,
                                       const model::ModelOptions& model_options,
                                       const std::string& nvme_path, std::uint64_t seed);

}  // namespace tz::cli
