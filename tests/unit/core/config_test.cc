// Configuration loading: published DeepSpeed configs are accepted, each file in configs/bad/
// yields exactly one error naming the expected key, and defaults stay visible.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "core/config.h"

namespace tz {
namespace {

const std::string kDir = TZ_CONFIG_DIR;

std::vector<const ConfigDiagnostic*> errors_of(const ConfigLoad& load) {
  std::vector<const ConfigDiagnostic*> out;
  for (const auto& d : load.diagnostics) {
    if (d.severity == ConfigDiagnostic::Severity::kError) out.push_back(&d);
  }
  return out;
}

TEST(Config, PublishedDeepSpeedConfigsAreAccepted) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kDir + "/good")) {
    ++files;
    const ConfigLoad load = load_config_file(entry.path().string());
    EXPECT_TRUE(load.ok()) << entry.path() << ": " << load.status().to_string();
    for (const auto& d : load.diagnostics) {
      EXPECT_NE(d.severity, ConfigDiagnostic::Severity::kWarning)
          << entry.path() << ": unexpected warning " << d.message;
    }
  }
  EXPECT_GE(files, 3);
}

TEST(Config, Zero3NvmeValues) {
  const ConfigLoad load = load_config_file(kDir + "/good/ds_zero3_nvme_offload.json");
  ASSERT_TRUE(load.ok()) << load.status().to_string();
  const Config& c = load.config;
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_param.device, "nvme");
  EXPECT_EQ(c.zero.offload_param.nvme_path, "/local_nvme");
  EXPECT_EQ(c.zero.offload_param.buffer_size, 100000000u);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 10000000u);
  EXPECT_EQ(c.aio.block_size, 262144u);
  EXPECT_EQ(c.aio.queue_depth, 32);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.optimizer.type, "Adam");
  EXPECT_DOUBLE_EQ(c.optimizer.betas[0], 0.8);
  // Keys the file does not set keep their (DeepSpeed) defaults, visible in the resolved JSON.
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(load.resolved["fp16"]["hysteresis"], 2);
  EXPECT_EQ(load.resolved["tierzero"]["io_engine"], "auto");
  EXPECT_EQ(load.resolved["aio"]["overlap_events"], true);
}

TEST(Config, SizeStringsAndAuto) {
  const ConfigLoad load = load_config_file(kDir + "/good/bf16_zero3_tierzero.json");
  ASSERT_TRUE(load.ok()) << load.status().to_string();
  EXPECT_EQ(load.config.aio.block_size, 8u << 20);
  EXPECT_EQ(load.config.tierzero.device_budget, 60ull << 30);
  EXPECT_EQ(load.config.zero.reduce_bucket_size, 500000000u);
  const ConfigLoad hf = load_config_file(kDir + "/good/hf_bf16_zero3.json");
  ASSERT_TRUE(hf.ok()) << hf.status().to_string();
  EXPECT_DOUBLE_EQ(hf.config.optimizer.lr, 1e-3);  // "auto" -> default
  EXPECT_EQ(hf.config.zero.offload_param.device, "cpu");
}

TEST(Config, EachBadFileGivesOneErrorNamingTheKey) {
  const std::map<std::string, std::string> expected_key = {
      {"stage4", "zero_optimization.stage"},
      {"scheduler_unknown_type", "scheduler.type"},
      {"scheduler_param_of_other_type", "scheduler.params.cos_min_ratio"},
      {"scheduler_missing_total_steps", "scheduler.params.total_num_steps"},
      {"offload_param_gpu", "zero_optimization.offload_param.device"},
      {"nvme_without_path", "zero_optimization.offload_optimizer.nvme_path"},
      {"negative_micro_batch", "train_micro_batch_size_per_gpu"},
      {"stage_as_word", "zero_optimization.stage"},
      {"malformed", "malformed JSON at line 4"},
      {"pin_memory_string", "zero_optimization.offload_optimizer.pin_memory"},
      {"absurd_block_size", "aio.block_size"},
      {"misaligned_block_size", "aio.block_size"},
      {"queue_depth_zero", "aio.queue_depth"},
      {"garbage_size_string", "zero_optimization.reduce_bucket_size"},
      {"fp16_and_bf16", "fp16.enabled"},
      {"unknown_optimizer", "optimizer.type"},
      {"betas_out_of_range", "optimizer.params.betas"},
      {"negative_lr", "optimizer.params.lr"},
      {"not_an_object", "must be a JSON object"},
      {"param_offload_stage2", "zero_optimization.offload_param.device"},
      {"fractional_accumulation", "gradient_accumulation_steps"},
      {"zero_section_not_object", "zero_optimization"},
      {"unknown_io_engine", "tierzero.io_engine"},
      {"batch_not_multiple", "train_batch_size"},
      {"batch_overflow", "train_batch_size"},
      {"use_gds", "aio.use_gds"},
      {"negative_clipping", "gradient_clipping"},
      {"empty", "malformed JSON at line 1"},
      {"optimizer_offload_stage0", "zero_optimization.offload_optimizer.device"},
      {"host_budget_negative", "tierzero.host_budget"},
      {"lr_overflow", "optimizer.params.lr"},
      {"duplicate_key", "zero_optimization.stage: given twice"},
      {"misspelled_section", "did you mean zero_optimization?"},
  };
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kDir + "/bad")) {
    const std::string stem = entry.path().stem().string();
    ++files;
    ASSERT_TRUE(expected_key.count(stem)) << "no expectation for " << entry.path();
    const ConfigLoad load = load_config_file(entry.path().string());
    const auto errors = errors_of(load);
    ASSERT_EQ(errors.size(), 1u) << entry.path() << ": " << load.status().to_string();
    EXPECT_NE(errors[0]->message.find(expected_key.at(stem)), std::string::npos)
        << entry.path() << ": " << errors[0]->message;
    EXPECT_EQ(errors[0]->message.find('\n'), std::string::npos) << "one line";
  }
  EXPECT_EQ(files, static_cast<int>(expected_key.size()));
}

TEST(Config, MessagesNameValueAndAcceptedValues) {
  const ConfigLoad load = load_config_text(
      R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}})");
  ASSERT_EQ(errors_of(load).size(), 1u);
  EXPECT_EQ(errors_of(load)[0]->message,
            "zero_optimization.offload_param.device: \"gpu\" is not one of none, cpu, nvme");
  const ConfigLoad stage = load_config_text(R"({"zero_optimization": {"stage": 4}})");
  EXPECT_EQ(errors_of(stage)[0]->message,
            "zero_optimization.stage: 4 is out of range (accepted: 0 to 3)");
}

TEST(Config, UnreadableFile) {
  const ConfigLoad load = load_config_file(kDir + "/does/not/exist.json");
  ASSERT_EQ(errors_of(load).size(), 1u);
  EXPECT_NE(errors_of(load)[0]->message.find("cannot read"), std::string::npos);
  EXPECT_NE(errors_of(load)[0]->message.find("exist.json"), std::string::npos);
}

TEST(Config, UnknownKeysWarnWithNearestKey) {
  const ConfigLoad load = load_config_text(
      R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_sze": 5}, "trian_batch_size": 4,
          "completely_new_thing": 1})");
  EXPECT_TRUE(load.ok());
  std::vector<std::string> warnings;
  for (const auto& d : load.diagnostics) warnings.push_back(d.message);
  ASSERT_EQ(warnings.size(), 3u);
  auto has = [&](const std::string& s) {
    for (const auto& w : warnings) {
      if (w.find(s) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("did you mean zero_optimization.stage3_prefetch_bucket_size?"));
  EXPECT_TRUE(has("trian_batch_size: unknown key, ignored (did you mean train_batch_size?)"));
  EXPECT_TRUE(has("completely_new_thing: unknown key, ignored"));
}

TEST(Config, NumbersBeyondADoubleAreErrorsNamingTheKey) {
  // The JSON library throws for 1e400; before, that exception escaped and aborted the command.
  const ConfigLoad load = load_config_text(R"({"optimizer": {"params": {"lr": 1e400}}})");
  ASSERT_EQ(errors_of(load).size(), 1u);
  EXPECT_EQ(errors_of(load)[0]->key, "optimizer.params.lr");
  EXPECT_NE(errors_of(load)[0]->message.find("1e400"), std::string::npos)
      << errors_of(load)[0]->message;
  const ConfigLoad top = load_config_text(R"({"gradient_clipping": -1e999})");
  ASSERT_EQ(errors_of(top).size(), 1u);
  EXPECT_EQ(errors_of(top)[0]->key, "gradient_clipping");
}

TEST(Config, DuplicateKeysAreErrorsAtEveryDepth) {
  const ConfigLoad load = load_config_text(
      R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
          "offload_param": {"device": "cpu", "device": "nvme"}}, "bf16": {"enabled": false}})");
  std::vector<std::string> keys;
  for (const auto* e : errors_of(load)) keys.push_back(e->key);
  EXPECT_EQ(keys, (std::vector<std::string>{"zero_optimization.offload_param.device", "bf16"}));
  // The same key in two different objects is not a duplicate.
  const ConfigLoad ok = load_config_text(
      R"({"offload": 1, "zero_optimization": {"offload_param": {"device": "cpu"},
          "offload_optimizer": {"device": "cpu"}, "stage": 3}})");
  for (const auto* e : errors_of(ok)) ADD_FAILURE() << e->message;
}

TEST(Config, MisspelledSectionsAreErrorsWithTheNearestSection) {
  for (const char* name : {"zero_optimizaton", "zero_optimisation", "optimiser"}) {
    const std::string text = std::string(R"({")") + name + R"(": {"stage": 3}})";
    const ConfigLoad load = load_config_text(text);
    ASSERT_EQ(errors_of(load).size(), 1u) << name;
    const std::string want =
        std::string(name) + ": unknown section (did you mean " +
        (std::string(name) == "optimiser" ? "optimizer" : "zero_optimization") + "?)";
    EXPECT_EQ(errors_of(load)[0]->message.rfind(want, 0), 0u) << errors_of(load)[0]->message;
  }
  // A nested one too; an unknown object with no near section stays a warning.
  const ConfigLoad nested = load_config_text(
      R"({"zero_optimization": {"stage": 3, "offload_parm": {"device": "cpu"}},
          "my_own_section": {"x": 1}})");
  ASSERT_EQ(errors_of(nested).size(), 1u);
  EXPECT_EQ(errors_of(nested)[0]->key, "zero_optimization.offload_parm");
  bool warned = false;
  for (const auto& d : nested.diagnostics) {
    warned = warned || (d.severity == ConfigDiagnostic::Severity::kWarning &&
                        d.key == "my_own_section");
  }
  EXPECT_TRUE(warned);
}

TEST(Config, ADirectoryIsNamedAsOne) {
  const ConfigLoad load = load_config_file(kDir);
  ASSERT_EQ(errors_of(load).size(), 1u);
  EXPECT_NE(errors_of(load)[0]->message.find("is a directory"), std::string::npos)
      << errors_of(load)[0]->message;
}

TEST(Config, AdjustRunsBeforeValidation) {
  const ConfigLoad load = load_config_text(
      R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})",
      [](nlohmann::json& j) { j["zero_optimization"]["offload_param"]["nvme_path"] = "/x"; });
  ASSERT_TRUE(load.ok()) << load.status().to_string();
  EXPECT_EQ(load.config.zero.offload_param.nvme_path, "/x");
}

TEST(Config, EveryKeyIsDocumented) {
  for (const auto& d : config_key_docs()) {
    EXPECT_FALSE(d.doc.empty()) << d.key;
    EXPECT_FALSE(d.accepted.empty()) << d.key;
  }
  // The default config resolves every documented key.
  const ConfigLoad load = load_config_text("{}");
  ASSERT_TRUE(load.ok());
  for (const auto& d : config_key_docs()) {
    const nlohmann::json* node = &load.resolved;
    std::size_t start = 0;
    while (true) {
      const std::size_t dot = d.key.find('.', start);
      node = &(*node)[d.key.substr(start, dot == std::string::npos ? dot : dot - start)];
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    EXPECT_FALSE(node->is_null()) << d.key;
  }
}

TEST(Config, LegacyCpuOffloadSwitch) {
  const ConfigLoad load =
      load_config_text(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})");
  ASSERT_TRUE(load.ok()) << load.status().to_string();
  EXPECT_EQ(load.config.zero.offload_optimizer.device, "cpu");
}

}  // namespace
}  // namespace tz
