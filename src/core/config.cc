// The configuration schema and its validator (core/config.h). Each key is declared once below;
// the loader walks the user's JSON against it, the resolved JSON and the typed Config are both
// produced from the same walk, and `config_key_docs` renders the same table as documentation.
#include "core/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/config_schema.h"
#include "core/units.h"

namespace tz {
namespace {

using nlohmann::json;
using namespace config_schema;  // NOLINT(google-build-using-namespace): the tables' own names

std::string schedule_types_text(unsigned types) {
  std::string out;
  for (const ScheduleType& t : kScheduleTypes) {
    if (types & t.bit) out += (out.empty() ? "" : ", ") + std::string(t.name);
  }
  return out;
}


std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string format_number(double v) {
  std::ostringstream os;
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    os << static_cast<long long>(v);
  } else {
    os << v;
  }
  return os.str();
}

std::string accepted_text(const KeySpec& s) {
  switch (s.kind) {
    case Kind::kBool: return "true or false";
    case Kind::kEnum: {
      std::string out;
      for (const auto& c : s.choices) out += (out.empty() ? "" : ", ") + c;
      return out;
    }
    case Kind::kString: return "a string";
    case Kind::kAny: return "any JSON value";
    case Kind::kPair:
      return "two numbers in [" + format_number(s.min) + ", " + format_number(s.max) + ")";
    case Kind::kSize:
    case Kind::kCount:
    case Kind::kInt:
    case Kind::kFloat: {
      std::string unit = s.kind == Kind::kSize ? " bytes" : "";
      std::string hi = (s.kind != Kind::kFloat && s.max >= kU64) ? "2^64-1" : format_number(s.max);
      return format_number(s.min) + " to " + hi + unit;
    }
  }
  return "";
}

std::string kind_name(Kind k) {
  switch (k) {
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kSize: return "size";
    case Kind::kCount: return "count";
    case Kind::kFloat: return "float";
    case Kind::kEnum: return "enum";
    case Kind::kString: return "string";
    case Kind::kPair: return "pair";
    case Kind::kAny: return "any";
  }
  return "?";
}

std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

class Validator {
 public:
  explicit Validator(ConfigLoad& out) : out_(out) {}

  void error(const std::string& key, const std::string& msg) {
    out_.diagnostics.push_back({ConfigDiagnostic::Severity::kError, key, msg});
  }
  void warning(const std::string& key, const std::string& msg) {
    out_.diagnostics.push_back({ConfigDiagnostic::Severity::kWarning, key, msg});
  }

  // Converts `v` to the canonical JSON value of `spec`, or reports why it cannot.
  std::optional<json> convert(const KeySpec& s, const json& v) {
    const std::string key = s.path;
    auto bad = [&](const std::string& what) -> std::optional<json> {
      error(key, key + ": " + show(v) + " " + what + " (accepted: " + accepted_text(s) + ")");
      return std::nullopt;
    };
    if (v.is_string() && v.get<std::string>() == "auto" && s.kind != Kind::kString &&
        s.kind != Kind::kEnum && s.kind != Kind::kAny) {
      return s.default_value;  // HF-style "auto": the default
    }
    switch (s.kind) {
      case Kind::kAny: return v;
      case Kind::kBool:
        if (!v.is_boolean()) return bad("is not a boolean");
        return v;
      case Kind::kString:
        if (!v.is_string()) return bad("is not a string");
        return v;
      case Kind::kEnum: {
        if (!v.is_string()) return bad("is not a string");
        for (const auto& c : s.choices) {
          if (lower(c) == lower(v.get<std::string>())) return json(c);
        }
        error(key, key + ": " + show(v) + " is not one of " + accepted_text(s));
        return std::nullopt;
      }
      case Kind::kPair: {
        if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) {
          return bad("is not a pair of numbers");
        }
        for (const auto& x : v) {
          const double d = x.get<double>();
          if (!(d >= s.min && d < s.max)) return bad("is out of range");
        }
        return v;
      }
      case Kind::kFloat: {
        if (!v.is_number()) return bad("is not a number");
        const double d = v.get<double>();
        if (!std::isfinite(d) || d < s.min || d > s.max) return bad("is out of range");
        return json(d);
      }
      case Kind::kInt:
      case Kind::kSize:
      case Kind::kCount: {
        std::uint64_t n = 0;
        if (v.is_number_unsigned()) {
          n = v.get<std::uint64_t>();
        } else if (v.is_number_integer()) {
          if (v.get<std::int64_t>() < 0) return bad("is negative");
          n = v.get<std::uint64_t>();
        } else if (v.is_number_float()) {
          const double d = v.get<double>();
          if (!std::isfinite(d) || d < 0 || d != std::floor(d) || d >= kU64) {
            return bad("is not a whole non-negative number");
          }
          n = static_cast<std::uint64_t>(d);
        } else if (v.is_string() && s.kind != Kind::kInt) {
          auto parsed = s.kind == Kind::kSize ? parse_size(v.get<std::string>())
                                              : parse_count(v.get<std::string>());
          if (!parsed) {
            error(key, key + ": " + parsed.status().message());
            return std::nullopt;
          }
          n = *parsed;
        } else {
          return bad(s.kind == Kind::kInt ? "is not an integer" : "is not a number or size");
        }
        if (static_cast<double>(n) < s.min || static_cast<double>(n) > s.max) {
          return bad("is out of range");
        }
        if (s.kind == Kind::kInt) return json(static_cast<std::int64_t>(n));
        return json(n);
      }
    }
    return std::nullopt;
  }

  // Reports keys of `node` (at `prefix`) that the schema does not know.
  void check_unknown(const json& node, const std::string& prefix,
                     const std::set<std::string>& known_paths,
                     const std::set<std::string>& known_objects) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
      if (known_paths.count(path)) continue;
      if (known_objects.count(path)) {
        if (!it.value().is_object()) {
          error(path, path + ": " + show(it.value()) + " is not an object");
        } else {
          check_unknown(it.value(), path, known_paths, known_objects);
        }
        continue;
      }
      // The nearest known key or section. A misspelled section is an error, not a warning:
      // every key in it would be ignored, so a "stage 3 with NVMe" run would silently train at
      // stage 0.
      std::string nearest;
      std::size_t best = std::numeric_limits<std::size_t>::max();
      bool nearest_is_section = false;
      for (const auto* names : {&known_paths, &known_objects}) {
        for (const auto& k : *names) {
          const std::size_t d = edit_distance(lower(path), lower(k));
          if (d < best) {
            best = d;
            nearest = k;
            nearest_is_section = names == &known_objects;
          }
        }
      }
      const bool close = !nearest.empty() && best <= std::max<std::size_t>(3, path.size() / 3);
      if (close && nearest_is_section && it.value().is_object()) {
        error(path, path + ": unknown section (did you mean " + nearest +
                        "?); none of its keys would be applied");
        continue;
      }
      std::string msg = path + ": unknown key, ignored";
      if (close) msg += " (did you mean " + nearest + "?)";
      warning(path, msg);
    }
  }

 private:
  ConfigLoad& out_;
};

const json* find_path(const json& root, std::string_view path) {
  const json* node = &root;
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t dot = path.find('.', start);
    const std::string part(path.substr(start, dot == std::string_view::npos ? path.npos
                                                                             : dot - start));
    if (!node->is_object()) return nullptr;
    auto it = node->find(part);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return node;
}

void set_path(json& root, std::string_view path, json value) {
  json* node = &root;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    if (dot == std::string_view::npos) {
      (*node)[std::string(path.substr(start))] = std::move(value);
      return;
    }
    node = &(*node)[std::string(path.substr(start, dot - start))];
    start = dot + 1;
  }
}

void check_rules(const Config& c, Validator& v) {
  if (c.bf16 && c.fp16.enabled) {
    v.error("fp16.enabled", "fp16.enabled: cannot be true together with bf16.enabled");
  }
  struct Offload {
    const char* name;
    const std::string& device;
    const std::string& nvme_path;
  };
  const Offload offloads[] = {
      {"zero_optimization.offload_optimizer", c.zero.offload_optimizer.device,
       c.zero.offload_optimizer.nvme_path},
      {"zero_optimization.offload_param", c.zero.offload_param.device,
       c.zero.offload_param.nvme_path},
  };
  for (const Offload& o : offloads) {
    if (o.device == "nvme" && o.nvme_path.empty()) {
      const std::string key = std::string(o.name) + ".nvme_path";
      v.error(key, key + ": required when " + o.name + ".device is nvme");
    }
  }
  if (c.zero.offload_param.device != "none" && c.zero.stage != 3) {
    v.error("zero_optimization.offload_param.device",
            "zero_optimization.offload_param.device: \"" + c.zero.offload_param.device +
                "\" needs zero_optimization.stage 3 (stage is " + std::to_string(c.zero.stage) +
                ")");
  }
  if (c.zero.offload_optimizer.device != "none" && c.zero.stage == 0) {
    v.error("zero_optimization.offload_optimizer.device",
            "zero_optimization.offload_optimizer.device: \"" +
                c.zero.offload_optimizer.device + "\" needs zero_optimization.stage 1, 2 or 3");
  }
  if (c.aio.block_size % 4096 != 0) {
    v.error("aio.block_size", "aio.block_size: " + std::to_string(c.aio.block_size) +
                                  " is not a multiple of 4096 (O_DIRECT needs aligned requests)");
  }
  if (c.aio.use_gds) {
    v.error("aio.use_gds", "aio.use_gds: GPUDirect Storage is not supported; set it to false");
  }
  const std::uint64_t per_rank = c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps;
  if (c.train_batch_size != 0 && c.train_batch_size % per_rank != 0) {
    v.error("train_batch_size",
            "train_batch_size: " + std::to_string(c.train_batch_size) +
                " is not a multiple of train_micro_batch_size_per_gpu x "
                "gradient_accumulation_steps (" + std::to_string(per_rank) + ")");
  }
}

// The scheduler section: the type must be one we implement and every parameter must belong to
// it (an error naming the key otherwise); the resolved section lists the type's parameters.
void check_scheduler(const json& user, ConfigLoad& out, Validator& v) {
  const std::string& type = out.config.scheduler.type;
  const json* given = find_path(user, "scheduler.params");
  if (given != nullptr && !given->is_object()) {
    v.error("scheduler.params", "scheduler.params: " + show(*given) + " is not an object");
    return;
  }
  if (type.empty()) {
    if (given != nullptr && !given->empty()) {
      v.error("scheduler.params", "scheduler.params: given without scheduler.type (one of " +
                                      schedule_types_text(kAllSchedules) + ")");
    }
    return;
  }
  unsigned bit = 0;
  for (const ScheduleType& t : kScheduleTypes) {
    if (lower(t.name) == lower(type)) {
      bit = t.bit;
      out.config.scheduler.type = t.name;
      out.resolved["scheduler"]["type"] = t.name;
    }
  }
  if (bit == 0) {
    v.error("scheduler.type", "scheduler.type: \"" + type + "\" is not one of " +
                                  schedule_types_text(kAllSchedules) +
                                  " (LRRangeTest is not supported)");
    return;
  }
  const std::string& name = out.config.scheduler.type;
  if (given != nullptr) {
    for (auto it = given->begin(); it != given->end(); ++it) {
      const std::string key = "scheduler.params." + it.key();
      bool found = false;
      for (const ScheduleParam& p : schedule_params()) found = found || (key == p.spec.path && (p.types & bit));
      if (!found) {
        std::string accepted;
        for (const ScheduleParam& p : schedule_params()) {
          if (p.types & bit) {
            accepted += (accepted.empty() ? "" : ", ") +
                        std::string(p.spec.path).substr(std::string("scheduler.params.").size());
          }
        }
        v.error(key, key + ": not a parameter of " + name + " (accepted: " + accepted + ")");
      }
    }
  }
  json resolved = json::object();
  for (const ScheduleParam& p : schedule_params()) {
    if (!(p.types & bit)) continue;
    const std::string short_name =
        std::string(p.spec.path).substr(std::string("scheduler.params.").size());
    json value = p.spec.default_value;
    if (given != nullptr && given->contains(short_name)) {
      // None (null) means the default, as in DeepSpeed's keyword arguments.
      if (!(*given)[short_name].is_null()) {
        auto converted = v.convert(p.spec, (*given)[short_name]);
        if (!converted) continue;
        value = std::move(*converted);
      }
    } else if (p.required & bit) {
      v.error(p.spec.path, std::string(p.spec.path) + ": required by scheduler.type " + name);
      continue;
    }
    if (!value.is_null()) p.spec.apply(out.config, value);
    resolved[short_name] = value;
  }
  out.resolved["scheduler"]["params"] = std::move(resolved);
  const SchedulerConfig& sc = out.config.scheduler;
  if (bit == kOneCycle) {
    if (sc.cycle_max_lr < sc.cycle_min_lr) {
      v.error("scheduler.params.cycle_max_lr", "scheduler.params.cycle_max_lr: below cycle_min_lr");
    }
    if (sc.cycle_momentum) {
      v.warning("scheduler.params.cycle_momentum",
                "scheduler.params.cycle_momentum: momentum cycling is not applied; OneCycle "
                "schedules the learning rate only");
    }
  }
  if ((bit & (kWarmupDecayLR | kWarmupCosineLR)) && sc.total_num_steps > 0 &&
      sc.total_num_steps < std::max<std::int64_t>(2, sc.warmup_num_steps)) {
    v.warning("scheduler.params.total_num_steps",
              "scheduler.params.total_num_steps: less than warmup_num_steps");
  }
}

}  // namespace

bool ConfigLoad::ok() const {
  return std::none_of(diagnostics.begin(), diagnostics.end(), [](const ConfigDiagnostic& d) {
    return d.severity == ConfigDiagnostic::Severity::kError;
  });
}

Status ConfigLoad::status() const {
  std::string msg;
  for (const auto& d : diagnostics) {
    if (d.severity != ConfigDiagnostic::Severity::kError) continue;
    msg += (msg.empty() ? "" : "; ") + d.message;
  }
  if (msg.empty()) return Status::ok();
  return Status::invalid_argument("invalid configuration: " + msg);
}

namespace {

// The line and column (both 1-based) of byte `offset` of `text`.
std::string line_column(std::string_view text, std::size_t offset) {
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

// Follows the parser's events to know the dotted key path being parsed (for errors the JSON
// library raises without one, such as a number too large for a double) and to find keys given
// twice in one object (the library keeps the last silently; DeepSpeed refuses them, and so do we).
class KeyTracker {
 public:
  explicit KeyTracker(Validator& v) : v_(v) {}

  bool on_event(json::parse_event_t event, const json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        frames_.push_back({true, {}, {}});
        break;
      case json::parse_event_t::array_start:
        frames_.push_back({false, {}, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case json::parse_event_t::key: {
        if (frames_.empty() || !frames_.back().is_object) break;
        Frame& f = frames_.back();
        f.key = parsed.get<std::string>();
        if (!f.seen.insert(f.key).second) {
          const std::string p = path();
          v_.error(p, p + ": given twice in one object (remove one; the values would be "
                          "ambiguous)");
        }
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  }

  // The key being parsed, dotted ("optimizer.params.lr"); empty at the top level.
  std::string path() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (!f.is_object || f.key.empty()) continue;
      p += (p.empty() ? "" : ".") + f.key;
    }
    return p;
  }

 private:
  struct Frame {
    bool is_object;
    std::string key;
    std::set<std::string> seen;
  };
  Validator& v_;
  std::vector<Frame> frames_;
};

}  // namespace

ConfigLoad load_config_text(std::string_view text, const ConfigAdjust& adjust) {
  ConfigLoad out;
  Validator v(out);
  json user;
  KeyTracker keys(v);
  try {
    user = json::parse(text.begin(), text.end(),
                       [&keys](int /*depth*/, json::parse_event_t event, json& parsed) {
                         return keys.on_event(event, parsed);
                       });
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    const std::size_t pos = what.find("syntax error");
    if (pos != std::string::npos) what = what.substr(pos);
    v.error("", "malformed JSON at " + line_column(text, e.byte == 0 ? 0 : e.byte - 1) + ": " +
                    what);
    return out;
  } catch (const json::exception& e) {
    // A number the library cannot hold (1e400 overflows a double): no byte offset comes with
    // it, but the key being parsed names it.
    const std::string key = keys.path();
    std::string what = e.what();
    const std::size_t pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    v.error(key, (key.empty() ? std::string("the configuration") : key) + ": " + what +
                     " (out of range)");
    return out;
  }
  if (!out.ok()) return out;
  if (adjust) adjust(user);
  if (!user.is_object()) {
    v.error("", "the configuration must be a JSON object, not " + std::string(user.type_name()));
    return out;
  }

  std::set<std::string> known_paths, known_objects;
  for (const KeySpec& s : schema()) {
    const std::string p = s.path;
    known_paths.insert(p);
    for (std::size_t dot = p.find('.'); dot != std::string::npos; dot = p.find('.', dot + 1)) {
      known_objects.insert(p.substr(0, dot));
    }
  }
  v.check_unknown(user, "", known_paths, known_objects);

  out.resolved = json::object();
  for (const KeySpec& s : schema()) {
    json value = s.default_value;
    if (const json* given = find_path(user, s.path)) {
      auto converted = v.convert(s, *given);
      if (!converted) continue;
      value = std::move(*converted);
    }
    if (s.apply) s.apply(out.config, value);
    set_path(out.resolved, s.path, std::move(value));
  }
  // Legacy DeepSpeed switch: "cpu_offload": true means offload_optimizer.device = cpu.
  if (const json* legacy = find_path(user, "zero_optimization.cpu_offload");
      legacy && legacy->is_boolean() && legacy->get<bool>()) {
    out.config.zero.offload_optimizer.device = "cpu";
    out.resolved["zero_optimization"]["offload_optimizer"]["device"] = "cpu";
  }
  check_scheduler(user, out, v);
  if (out.ok()) check_rules(out.config, v);
  return out;
}

ConfigLoad load_config_file(const std::string& path, const ConfigAdjust& adjust) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    ConfigLoad out;
    out.diagnostics.push_back({ConfigDiagnostic::Severity::kError, "",
                               "cannot read " + path + ": is a directory, not a JSON file"});
    return out;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ConfigLoad out;
    out.diagnostics.push_back({ConfigDiagnostic::Severity::kError, "",
                               Status::from_errno(errno, "cannot read", path).message()});
    return out;
  }
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) {
    ConfigLoad out;
    out.diagnostics.push_back({ConfigDiagnostic::Severity::kError, "",
                               Status::from_errno(errno, "cannot read", path).message()});
    return out;
  }
  return load_config_text(buf.str(), adjust);
}

std::vector<ConfigKeyDoc> config_key_docs() {
  std::vector<ConfigKeyDoc> docs;
  for (const KeySpec& s : schema()) {
    docs.push_back({s.path, kind_name(s.kind), accepted_text(s), s.default_value.dump(), s.doc});
  }
  for (const ScheduleParam& p : schedule_params()) {
    const KeySpec& s = p.spec;
    docs.push_back({s.path, kind_name(s.kind),
                    accepted_text(s) + " (" + schedule_types_text(p.types) + ")",
                    s.default_value.is_null() ? std::string("required or derived")
                                              : s.default_value.dump(),
                    s.doc});
  }
  return docs;
}

}  // namespace tz
