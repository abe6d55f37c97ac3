// GPT-2 shapes: the presets (HF's gpt2, gpt2-medium, gpt2-large, gpt2-xl), the parser of custom
// shapes, the parameter count and the unit layout the model registers with the engine.
#include <array>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/gpt2.h"

namespace tz::model {
namespace {

struct Preset {
  std::string_view name;
  int layers, heads, embd;
};
// HF's configs: n_layer, n_head, n_embd; all have vocab 50257 and n_positions 1024.
constexpr std::array<Preset, 4> kPresets = {{
    {"gpt2-124m", 12, 12, 768},
    {"gpt2-350m", 24, 16, 1024},
    {"gpt2-774m", 36, 20, 1280},
    {"gpt2-1.5b", 48, 25, 1600},
}};
constexpr int kPresetVocab = 50257;
constexpr int kPresetSeq = 1024;
constexpr std::string_view kCustomPrefix = "gpt2:";

Status shape_error(std::string_view spec, const std::string& what) {
  return Status::invalid_argument("model '" + std::string(spec) + "': " + what);
}

}  // namespace

std::uint64_t Gpt2Shape::param_count() const {
  const auto c = static_cast<std::uint64_t>(embd);
  const auto per_block = 12 * c * c + 13 * c;  // c_attn 3c^2+3c, c_proj c^2+c, fc/proj 8c^2+5c, 2 LN 4c
  return static_cast<std::uint64_t>(vocab) * c + static_cast<std::uint64_t>(seq) * c +
         static_cast<std::uint64_t>(layers) * per_block + 2 * c;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

Result<Gpt2Shape> parse_model(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      return Gpt2Shape{std::string(name), p.layers, p.heads, p.embd, kPresetVocab, kPresetSeq};
    }
  }
  if (!name.starts_with(kCustomPrefix)) {
    std::string known;
    for (const Preset& p : kPresets) known += std::string(p.name) + ", ";
    return shape_error(name, "unknown model; use one of " + known +
                                 "or gpt2:layers=L,heads=H,embd=C,vocab=V,seq=T");
  }
  struct Field {
    std::string_view key;
    int Gpt2Shape::*member;
    bool seen = false;
  };
  std::array<Field, 5> fields = {{{"layers", &Gpt2Shape::layers},
                                  {"heads", &Gpt2Shape::heads},
                                  {"embd", &Gpt2Shape::embd},
                                  {"vocab", &Gpt2Shape::vocab},
                                  {"seq", &Gpt2Shape::seq}}};
  Gpt2Shape shape;
  shape.name = std::string(name);
  std::string_view rest = name.substr(kCustomPrefix.size());
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return shape_error(name, "'" + std::string(item) + "' is not key=value");
    }
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    Field* field = nullptr;
    for (Field& f : fields) {
      if (f.key == key) field = &f;
    }
    if (field == nullptr) {
      return shape_error(name, "unknown field '" + std::string(key) +
                                   "' (fields: layers, heads, embd, vocab, seq)");
    }
    if (field->seen) return shape_error(name, "field '" + std::string(key) + "' given twice");
    field->seen = true;
    long long parsed = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
    if (ec != std::errc{} || end != value.data() + value.size() || value.empty()) {
      return shape_error(name, "field '" + std::string(key) + "' must be a whole number, not '" +
                                   std::string(value) + "'");
    }
    if (parsed <= 0 || parsed > (1 << 30)) {
      return shape_error(name, "field '" + std::string(key) + "' must be in [1, 2^30], not " +
                                   std::string(value));
    }
    shape.*(field->member) = static_cast<int>(parsed);
  }
  for (const Field& f : fields) {
    if (!f.seen) return shape_error(name, "field '" + std::string(f.key) + "' is missing");
  }
  if (shape.embd % shape.heads != 0) {
    return shape_error(name, "field 'embd' (" + std::to_string(shape.embd) +
                                 ") must be divisible by field 'heads' (" +
                                 std::to_string(shape.heads) + ")");
  }
  return shape;
}

std::vector<zero::UnitSpec> unit_specs(const Gpt2Shape& shape) {
  const std::int64_t c = shape.embd;
  std::vector<zero::UnitSpec> units;
  units.push_back({"wte", {{"wte.weight", {shape.vocab, c}}, {"wpe.weight", {shape.seq, c}}}});
  for (int i = 0; i < shape.layers; ++i) {
    units.push_back({"h." + std::to_string(i),
                     {{"ln_1.weight", {c}},
                      {"ln_1.bias", {c}},
                      {"attn.c_attn.weight", {c, 3 * c}},
                      {"attn.c_attn.bias", {3 * c}},
                      {"attn.c_proj.weight", {c, c}},
                      {"attn.c_proj.bias", {c}},
                      {"ln_2.weight", {c}},
                      {"ln_2.bias", {c}},
                      {"mlp.c_fc.weight", {c, 4 * c}},
                      {"mlp.c_fc.bias", {4 * c}},
                      {"mlp.c_proj.weight", {4 * c, c}},
                      {"mlp.c_proj.bias", {c}}}});
  }
  units.push_back({"ln_f", {{"ln_f.weight", {c}}, {"ln_f.bias", {c}}}});
  return units;
}

bool checkpointing_enabled(const Gpt2Shape& shape, const Gpt2Options& options) {
  return checkpointing_enabled(options, shape.param_count());
}

}  // namespace tz::model
