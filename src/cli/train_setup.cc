// The options a `tierzero train` run derives from its config, model and flags (train_setup.h),
// shared with `tierzero estimate`.
#include "cli/train_setup.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/output_file.h"

namespace tz::cli {

ConfigLoad load_config_with_nvme_path(const std::string& config_path, const std::string& nvme_path) {
  if (nvme_path.empty()) return load_config_file(config_path);
  return load_config_file(config_path, [&nvme_path](nlohmann::json& j) {
    if (!j.is_object()) return;  // the loader's own errors say what is wrong
    auto zero = j.find("zero_optimization");
    if (zero == j.end() || !zero->is_object()) return;
    for (const char* section : {"offload_param", "offload_optimizer"}) {
      auto sec = zero->find(section);
      if (sec == zero->end() || !sec->is_object()) continue;
      auto device = sec->find("device");
      if (device != sec->end() && device->is_string() && *device == "nvme") {
        (*sec)["nvme_path"] = nvme_path;
      }
    }
  });
}

Result<model::ModelDesc> resolve_run_model(const std::string& name, const std::string& lora,
                                           const std::string& adapter) {
  TZ_ASSIGN_OR_RETURN(model::ModelDesc shape, model::resolve_model(name));
  if (!lora.empty() && !adapter.empty()) {
    return Status::invalid_argument("--lora and --adapter both give the adapters; give one");
  }
  if (!lora.empty()) {
    TZ_ASSIGN_OR_RETURN(shape.lora, model::parse_lora(shape, lora));
  } else if (!adapter.empty()) {
    Result<model::LoraSpec> spec = model::read_adapter(shape, adapter);
    if (!spec.is_ok()) return std::move(spec).take_status().with_context("--adapter");
    shape.lora = std::move(spec).value();
  }
  return shape;
}

Result<Config> load_run_config(const std::string& command, const std::string& config_path,
                               const std::string& nvme_path) {
  const ConfigLoad load = load_config_with_nvme_path(config_path, nvme_path);
  for (const ConfigDiagnostic& d : load.diagnostics) {
    if (d.severity == ConfigDiagnostic::Severity::kError) {
      return Status::invalid_argument(config_path + ": " + d.message);
    }
  }
  // Unknown keys are ignored, so a run must say so before its first step, as `config check`
  // does: a misspelled key otherwise trains with its default without a word.
  for (const ConfigDiagnostic& d : load.diagnostics) {
    std::fprintf(stderr, "tierzero %s: warning: %s: %s\n", command.c_str(), config_path.c_str(),
                 d.message.c_str());
  }
  return load.config;
}

Status check_nvme_path_used(const Config& config, const std::string& config_path,
                            const std::string& nvme_path) {
  if (nvme_path.empty() || config.zero.offload_param.device == "nvme" ||
      config.zero.offload_optimizer.device == "nvme") {
    return Status::ok();
  }
  return Status::invalid_argument(
      "--nvme-path " + nvme_path + " but " + config_path +
      " offloads nothing to nvme (set zero_optimization.offload_param.device or "
      "offload_optimizer.device to \"nvme\")");
}

Status check_swap_path(const std::string& dir, std::uint64_t needed_bytes) {
  // Not created when missing: a mistyped mount point would otherwise fill the root file system.
  return check_folder("NVMe path", dir, needed_bytes, /*create=*/false);
}

DType compute_dtype_of(const Config& config) {
  if (config.bf16) return DType::kBF16;
  if (config.fp16.enabled) return DType::kF16;
  return DType::kF32;
}

model::ModelOptions model_options_for(const Config& config, int seq, int checkpointing,
                                      int cpu_threads) {
  model::ModelOptions o;
  o.micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  o.seq = seq;
  o.checkpointing = checkpointing;
  o.cpu_threads = cpu_threads;
  return o;
}

zero::EngineOptions engine_options_for(const Config& config, const model::ModelDesc& shape,
                                       const model::ModelOptions& model_options,
                                       const std::string& nvme_path, std::uint64_t seed) {
  zero::EngineOptions eo;
  eo.config = config;
  eo.nvme_path = nvme_path;
  eo.activation_bytes = model::activation_bytes(shape, model_options, compute_dtype_of(config));
  eo.seed = seed;
  return eo;
}

}  // namespace tz::cli
