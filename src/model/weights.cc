// HF GPT-2 weights in and out of the engine (model/hf.h): the name mapping and the checks of a
// file against the model on top of core/safetensors.h, streamed one tensor at a time through
// set_tensor / get_tensor so the whole model never sits in host memory.
#include <cerrno>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/output_file.h"
#include "core/safetensors.h"
#include "model/hf.h"
#include "model/hf_folder.h"

namespace tz::model {

Status check_finite_weights(std::span<const float> values, const std::string& path,
                            std::string_view name, std::uint64_t first_elem) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(values[i])) continue;
    const char* what = std::isnan(values[i]) ? "NaN" : (values[i] > 0 ? "inf" : "-inf");
    return Status::invalid_argument(tensor_context(path, name) + ": element " +
                                    std::to_string(first_elem + i) + " is " + what +
                                    "; weights must be finite");
  }
  return Status::ok();
}

Status load_hf_weights(zero::Engine& engine, const Gpt2Shape& shape,
                       const std::vector<zero::UnitSpec>& specs,
                       const std::vector<zero::UnitId>& units, const std::string& path) {
  TZ_ASSIGN_OR_RETURN(const SafetensorsReader reader, SafetensorsReader::open(path));
  struct Wanted {
    std::size_t unit, tensor;
    const SafetensorsEntry* entry = nullptr;
  };
  std::map<std::string, Wanted, std::less<>> wanted;
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
      wanted.emplace(hf_tensor_name(specs[u], specs[u].tensors[t]), Wanted{u, t});
    }
  }
  const std::vector<std::int64_t> wte_shape = {shape.vocab, shape.embd};
  for (const SafetensorsEntry& entry : reader.entries()) {
    const std::string_view name = strip_hf_prefix(entry.name);
    if (name == "lm_head.weight") {
      // The tied head is wte; a file may carry the copy, which must at least have its shape.
      if (entry.shape != wte_shape) {
        return Status::invalid_argument(tensor_context(path, entry.name) + ": shape " +
                                        shape_text(entry.shape) + ", but model " + shape.name +
                                        " ties it to wte " + shape_text(wte_shape));
      }
      continue;
    }
    if (is_hf_non_parameter(name)) continue;
    const auto it = wanted.find(name);
    if (it == wanted.end()) {
      return Status::invalid_argument(tensor_context(path, entry.name) +
                                      ": unexpected, not a parameter of model " + shape.name);
    }
    if (it->second.entry != nullptr) {
      return Status::invalid_argument(tensor_context(path, entry.name) + ": given twice (as '" +
                                      it->second.entry->name + "' too)");
    }
    const zero::TensorSpec& spec = specs[it->second.unit].tensors[it->second.tensor];
    if (entry.shape != spec.shape) {
      return Status::invalid_argument(tensor_context(path, entry.name) + ": shape " +
                                      shape_text(entry.shape) + ", but model " + shape.name +
                                      " has " + shape_text(spec.shape));
    }
    it->second.entry = &entry;
  }
  // Missing tensors are reported in model order (the first one the model needs).
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (const zero::TensorSpec& t : specs[u].tensors) {
      const std::string name = hf_tensor_name(specs[u], t);
      if (wanted.at(name).entry == nullptr) {
        return Status::invalid_argument(tensor_context(path, std::string(kHfPrefix) + name) +
                                        ": missing (model " + shape.name + " needs it)");
      }
    }
  }
  // Each rank reads only the elements it keeps (load_tensor_part).
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
      const SafetensorsEntry& entry = *wanted.at(hf_tensor_name(specs[u], specs[u].tensors[t])).entry;
      TZ_RETURN_IF_ERROR(load_tensor_part(engine, units[u], t, reader, entry));
    }
  }
  return Status::ok();
}

Status save_hf_weights(zero::Engine& engine, const Gpt2Shape& shape,
                       const std::vector<zero::UnitSpec>& specs,
                       const std::vector<zero::UnitId>& units, const std::string& path,
                       DType dtype) {
  const bool writes = engine.rank() == 0;
  std::vector<SafetensorsTensorSpec> layout;
  for (const zero::UnitSpec& unit : specs) {
    for (const zero::TensorSpec& t : unit.tensors) {
      layout.push_back({std::string(kHfPrefix) + hf_tensor_name(unit, t), dtype, t.shape});
    }
  }
  Status write_error;
  std::optional<SafetensorsWriter> writer;
  if (writes) {
    Result<SafetensorsWriter> created = SafetensorsWriter::create(path, layout, {{"format", "pt"}});
    if (created.is_ok()) {
      writer.emplace(std::move(created).value());
    } else {
      write_error = std::move(created).take_status();
    }
  }
  std::vector<float> values;
  std::size_t index = 0;
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (std::size_t t = 0; t < specs[u].tensors.size(); ++t, ++index) {
      values.resize(specs[u].tensors[t].numel());
      Status s = engine.get_tensor(units[u], t, values);
      if (!s.is_ok()) return std::move(s).with_context(tensor_context(path, layout[index].name));
      if (writer && write_error.is_ok()) write_error = writer->write_f32(layout[index].name, values);
    }
  }
  if (!writes) return Status::ok();
  TZ_RETURN_IF_ERROR(std::move(write_error));
  TZ_RETURN_IF_ERROR(writer->finish());
  return write_output_file("", hf_config_path(path), hf_config(shape, dtype).dump(2) + "\n");
}

}  // namespace tz::model
