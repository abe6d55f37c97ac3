// The config's schema (core/config.cc's table of every key: kind, range, choices, DeepSpeed's
// default, documentation and where it lands in Config) and the scheduler's parameter table, kept
// apart from the loader that checks a file against them. Internal to core/config.cc.
#pragma once

#include <nlohmann/json.hpp>
#include <limits>
#include <string>
#include <vector>

#include "core/config.h"

namespace tz::config_schema {

using nlohmann::json;

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kU64 = 18446744073709551615.0;  // 2^64 - 1 as a double: no bound

enum class Kind { kBool, kInt, kSize, kCount, kFloat, kEnum, kString, kPair, kAny };

struct KeySpec {
  const char* path;
  Kind kind;
  double min;
  double max;
  std::vector<std::string> choices;
  json default_value;
  const char* doc;
  void (*apply)(Config&, const json&);  // null for keys accepted for compatibility only
};

// The scheduler types and the parameters each takes (DeepSpeed's names and defaults).
inline constexpr unsigned kWarmupLR = 1, kWarmupDecayLR = 2, kWarmupCosineLR = 4, kOneCycle = 8;
inline constexpr unsigned kAllSchedules = kWarmupLR | kWarmupDecayLR | kWarmupCosineLR | kOneCycle;
struct ScheduleType {
  const char* name;
  unsigned bit;
};
inline constexpr ScheduleType kScheduleTypes[] = {{"WarmupLR", kWarmupLR},
                                                  {"WarmupDecayLR", kWarmupDecayLR},
                                                  {"WarmupCosineLR", kWarmupCosineLR},
                                                  {"OneCycle", kOneCycle}};

struct ScheduleParam {
  KeySpec spec;       // path = "scheduler.params.<name>"
  unsigned types;     // the schedule types that take it
  unsigned required;  // the types for which it has no default
};

// Every top-level and nested key the loader accepts, in documentation order.
const std::vector<KeySpec>& schema();
// scheduler.params.*: which schedule types take each and which require it.
const std::vector<ScheduleParam>& schedule_params();

}  // namespace tz::config_schema
