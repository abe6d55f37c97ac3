// The options a `tierzero train` run derives from its config, model and flags (train_setup.h),
// shared with `tierzero estimate`.
#include "cli/train_setup.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tz::cli {

ConfigLoad load_config_with_nvme_path(const std::string& config_path, const std::string& nvme_path) {
  ConfigLoad plain = load_config_file(config_path);
  if (nvme_path.empty()) return plain;
  std::ifstream in(config_path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return plain;  // its own errors say what is wrong
  auto zero = j.find("zero_optimization");
  if (zero == j.end() || !zero->is_object()) return plain;
  for (const char* section : {"offload_param", "offload_optimizer"}) {
    auto sec = zero->find(section);
    if (sec == zero->end() || !sec->is_object()) continue;
    auto device = sec->find("device");
    if (device != sec->end() && device->is_string() && *device == "nvme") {
      (*sec)["nvme_path"] = nvme_path;
    }
  }
  return load_config_text(j.dump());
}

Result<Config> load_run_config(const std::string& config_path, const std::string& nvme_path) {
  const ConfigLoad load = load_config_with_nvme_path(config_path, nvme_path);
  if (!load.ok()) {
    for (const ConfigDiagnostic& d : load.diagnostics) {
      if (d.severity == ConfigDiagnostic::Severity::kError) {
        return Status::invalid_argument(config_path + ": " + d.message);
      }
    }
  }
  return load.config;
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
