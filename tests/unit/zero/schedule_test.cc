// Learning-rate schedules at chosen steps against DeepSpeed's formulas evaluated by hand
// (the expected numbers are written out, not computed by the code under test), and the config
// loader's errors for unknown types and parameters.
#include <gtest/gtest.h>

#include <string>

#include "core/config.h"
#include "zero/schedule.h"

namespace tz::zero {
namespace {

SchedulerConfig load_schedule(const std::string& section) {
  ConfigLoad load = load_config_text("{\"scheduler\": " + section + "}");
  EXPECT_TRUE(load.ok()) << load.status().to_string();
  return load.config.scheduler;
}

constexpr double kTol = 1e-12;

TEST(Schedule, WarmupLRLogAndLinear) {
  SchedulerConfig s = load_schedule(
      R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
          "warmup_num_steps": 10}})");
  EXPECT_EQ(s.warmup_type, "log");
  EXPECT_NEAR(scheduled_lr(s, 1.0, -1), 0.0, kTol);  // before the first step: min
  EXPECT_NEAR(scheduled_lr(s, 1.0, 0), 0.0, kTol);   // ln(1) = 0
  EXPECT_NEAR(scheduled_lr(s, 1.0, 4), 0.01 * 0.69897000433601880, 1e-12);  // ln5 / ln10
  EXPECT_NEAR(scheduled_lr(s, 1.0, 9), 0.01, kTol);                          // ln10 / ln10
  EXPECT_NEAR(scheduled_lr(s, 1.0, 500), 0.01, kTol);
  s.warmup_type = "linear";
  EXPECT_NEAR(scheduled_lr(s, 1.0, 4), 0.004, kTol);
}

TEST(Schedule, WarmupDecayLR) {
  SchedulerConfig s = load_schedule(
      R"({"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.011,
          "warmup_num_steps": 10, "warmup_type": "linear", "total_num_steps": 100}})");
  EXPECT_NEAR(scheduled_lr(s, 1.0, -1), 0.001, kTol);
  EXPECT_NEAR(scheduled_lr(s, 1.0, 5), 0.001 + 0.01 * 0.5, kTol);
  EXPECT_NEAR(scheduled_lr(s, 1.0, 10), 0.011, kTol);             // (100-10)/90 = 1
  EXPECT_NEAR(scheduled_lr(s, 1.0, 55), 0.001 + 0.01 * 0.5, kTol);  // (100-55)/90
  EXPECT_NEAR(scheduled_lr(s, 1.0, 100), 0.001, kTol);
  EXPECT_NEAR(scheduled_lr(s, 1.0, 150), 0.001, kTol);  // max(0, .)
}

TEST(Schedule, WarmupCosineLR) {
  SchedulerConfig s = load_schedule(
      R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10,
          "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}})");
  const double lr = 0.1;
  EXPECT_NEAR(scheduled_lr(s, lr, -1), 0.0, kTol);  // DeepSpeed returns 0 before the first step
  EXPECT_NEAR(scheduled_lr(s, lr, 0), 0.01, kTol);  // ratio = warmup_min_ratio
  EXPECT_NEAR(scheduled_lr(s, lr, 4), lr * (0.1 + 0.69897000433601880 * 0.9), 1e-12);
  EXPECT_NEAR(scheduled_lr(s, lr, 54), lr * (0.01 + 0.99 * 0.5), kTol);  // cos(pi/2) = 0
  EXPECT_NEAR(scheduled_lr(s, lr, 99), lr * 0.01, kTol);                 // cos(pi) = -1
}

TEST(Schedule, OneCycleLearningRate) {
  SchedulerConfig s = load_schedule(
      R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01,
          "cycle_first_step_size": 10, "decay_lr_rate": 0.5, "decay_step_size": 2,
          "cycle_momentum": false}})");
  EXPECT_NEAR(scheduled_lr(s, 1.0, -1), 0.001, kTol);
  EXPECT_NEAR(scheduled_lr(s, 1.0, 4), 0.0055, kTol);   // x = 0.25, scale 0.5
  EXPECT_NEAR(scheduled_lr(s, 1.0, 9), 0.01, kTol);     // x = 0.5, the peak
  EXPECT_NEAR(scheduled_lr(s, 1.0, 14), 0.0055, kTol);  // x = 0.75, scale 0.5
  EXPECT_NEAR(scheduled_lr(s, 1.0, 19), 0.001, kTol);   // the cycle's end
  EXPECT_NEAR(scheduled_lr(s, 1.0, 20), 0.001 / 1.25, kTol);  // decay: 1 + 0.5 * 1/2
  EXPECT_NEAR(scheduled_lr(s, 1.0, 23), 0.001 / 2.0, kTol);   // 1 + 0.5 * 4/2
  s.decay_step_size = 0;  // DeepSpeed skips the decay
  EXPECT_NEAR(scheduled_lr(s, 1.0, 23), 0.001, kTol);
}

TEST(Schedule, NoTypeIsTheConstantLearningRate) {
  SchedulerConfig s;
  EXPECT_EQ(scheduled_lr(s, 0.003, 7), 0.003);
}

std::string first_error(const std::string& json) {
  ConfigLoad load = load_config_text(json);
  for (const ConfigDiagnostic& d : load.diagnostics) {
    if (d.severity == ConfigDiagnostic::Severity::kError) return d.key + " | " + d.message;
  }
  return "";
}

TEST(Schedule, ConfigErrorsNameTheKey) {
  EXPECT_NE(first_error(R"({"scheduler": {"type": "Cosine"}})").find("scheduler.type"),
            std::string::npos);
  EXPECT_NE(first_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_maxlr": 1}}})")
                .find("scheduler.params.warmup_maxlr"),
            std::string::npos);
  // A parameter of another type.
  EXPECT_NE(first_error(R"({"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0}}})")
                .find("scheduler.params.cos_min_ratio: not a parameter of WarmupLR"),
            std::string::npos);
  EXPECT_NE(first_error(R"({"scheduler": {"type": "WarmupDecayLR"}})")
                .find("scheduler.params.total_num_steps: required"),
            std::string::npos);
  EXPECT_NE(first_error(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1}}})")
                .find("scheduler.params.cycle_max_lr"),
            std::string::npos);
  EXPECT_NE(first_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}})")
                .find("scheduler.params.warmup_type"),
            std::string::npos);
  EXPECT_EQ(first_error(R"({"scheduler": {"type": "warmuplr"}})"), "");  // case-insensitive
}

}  // namespace
}  // namespace tz::zero
