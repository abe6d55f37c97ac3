// Training configuration: a JSON file in DeepSpeed's vocabulary (the keys users already write)
// plus a `tierzero` section for our own keys. Every key is declared once in a schema
// (config.cc) with its type, accepted range, default and documentation; loading validates each
// value against it, fills every default (so the resolved config is fully visible), reports
// unknown keys as warnings with the nearest known key, and checks rules across keys.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace tz {

struct OffloadOptimizerConfig {
  std::string device = "none";  // none | cpu | nvme
  std::string nvme_path;
  bool pin_memory = false;
  std::int64_t buffer_count = 4;
  bool pipeline_read = false;
  bool pipeline_write = false;
  double ratio = 1.0;
};

struct OffloadParamConfig {
  std::string device = "none";  // none | cpu | nvme
  std::string nvme_path;
  bool pin_memory = false;
  std::int64_t buffer_count = 5;
  std::uint64_t buffer_size = 100000000;
  std::uint64_t max_in_cpu = 1000000000;
};

struct ZeroConfig {
  int stage = 0;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  bool overlap_comm = false;
  bool contiguous_gradients = true;
  std::uint64_t reduce_bucket_size = 500000000;
  std::uint64_t allgather_bucket_size = 500000000;
  std::uint64_t sub_group_size = 1000000000;
  std::uint64_t stage3_prefetch_bucket_size = 50000000;
  std::uint64_t stage3_max_live_parameters = 1000000000;
  std::uint64_t stage3_max_reuse_distance = 1000000000;
  std::uint64_t stage3_param_persistence_threshold = 100000;
};

struct AioConfig {
  std::uint64_t block_size = 1048576;
  std::int64_t queue_depth = 32;
  std::int64_t intra_op_parallelism = 1;
  std::int64_t thread_count = 1;
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0;  // 0 = dynamic
  std::int64_t initial_scale_power = 16;
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  double min_loss_scale = 1;
};

struct OptimizerConfig {
  std::string type = "AdamW";  // Adam | AdamW | SGD | Lion | Adagrad
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool adam_w_mode = true;
  double momentum = 0.0;
  bool nesterov = false;
};

// The DeepSpeed `scheduler` section (deepspeed/runtime/lr_schedules.py): the type and the
// parameters of that type, each with DeepSpeed's default (other types' fields keep theirs). The
// formulas are zero/schedule.h's.
struct SchedulerConfig {
  std::string type;  // "" (constant optimizer.params.lr) | WarmupLR | WarmupDecayLR |
                     // WarmupCosineLR | OneCycle
  // WarmupLR, WarmupDecayLR
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  // WarmupLR, WarmupDecayLR, WarmupCosineLR
  std::int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // log | linear
  std::int64_t total_num_steps = 0;  // WarmupDecayLR, WarmupCosineLR (required)
  // WarmupCosineLR
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
  // OneCycle (learning-rate part; the momentum keys are accepted and not applied)
  double cycle_min_lr = 0.0;  // required
  double cycle_max_lr = 0.0;  // required
  double decay_lr_rate = 0.0;
  double cycle_first_step_size = 2000;
  double cycle_second_step_size = -1;  // -1 (DeepSpeed's None): the first step size
  std::int64_t cycle_first_stair_count = 0;
  std::int64_t cycle_second_stair_count = -1;
  double decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
  // Every type: the schedule position at start (-1 = from the beginning).
  std::int64_t last_batch_iteration = -1;
};

struct TierzeroConfig {
  std::string io_engine = "auto";  // auto | io_uring | libaio | psync
  std::uint64_t device_budget = 0;  // 0 = what the device has
  std::uint64_t host_budget = 0;    // 0 = what the run needs
  std::uint64_t nvme_budget = 0;    // 0 = free space on the swap paths
  std::string overlap = "exact";    // exact | eager | delayed
  bool stream_update = true;        // exact: the update streamed into the next forward
  std::string trace_path;
  std::int64_t optimizer_threads = 0;  // 0 = one per core
  std::string state_dtype = "fp32";    // fp32 | bf16
  bool sqpoll = false;
  bool keep_swap_files = false;
  bool nvme_checksums = true;  // the store hashes NVMe pieces and checks them on read
  std::int64_t seed = 1234;
};

struct Config {
  std::uint64_t train_batch_size = 0;  // 0 = micro batch x accumulation x ranks
  std::uint64_t train_micro_batch_size_per_gpu = 1;
  std::uint64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;  // 0 = off
  std::uint64_t steps_per_print = 10;
  bool bf16 = false;
  Fp16Config fp16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroConfig zero;
  AioConfig aio;
  TierzeroConfig tierzero;
};

struct ConfigDiagnostic {
  enum class Severity { kError, kWarning };
  Severity severity;
  std::string key;      // dotted path, empty for file-level problems
  std::string message;  // one line, starting with the key
};

struct ConfigLoad {
  Config config;
  nlohmann::json resolved;  // every known key with its value or default
  std::vector<ConfigDiagnostic> diagnostics;
  bool ok() const;
  // All errors joined into one Status (OK when there are none).
  Status status() const;
};

// Changes the user's JSON after parsing and before validation (the CLI writes --nvme-path into
// the offload sections with it). Empty = no change.
using ConfigAdjust = std::function<void(nlohmann::json&)>;

// Parses and validates JSON text. Malformed JSON, a number out of a double's range and a key
// given twice in one object are errors naming the place (line and column, or the dotted key).
ConfigLoad load_config_text(std::string_view text, const ConfigAdjust& adjust = {});
// Reads and validates a file; an unreadable file is one error diagnostic.
ConfigLoad load_config_file(const std::string& path, const ConfigAdjust& adjust = {});

// One row per key of the schema, for `tierzero config keys` and docs/config.md.
struct ConfigKeyDoc {
  std::string key;
  std::string type;      // bool, int, size, count, float, enum, string, pair
  std::string accepted;  // range or choices
  std::string default_value;
  std::string doc;
};
std::vector<ConfigKeyDoc> config_key_docs();

}  // namespace tz
