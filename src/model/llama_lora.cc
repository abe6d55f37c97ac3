// The Llama family's LoRA half (model/llama.h, model/lora.h): adapters initialised as PEFT does
// or read from a PEFT folder, the PEFT folder written back, and the base with the adapters merged
// as a Hugging Face folder. The adapters' forward and backward are Llama::Impl's (llama_impl.h).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/output_file.h"
#include "core/safetensors.h"
#include "model/hf_folder.h"
#include "model/llama_impl.h"

namespace tz::model {

std::pair<std::int64_t, std::int64_t> llama_lora_dims(const LlamaConfig& c, int k) {
  const std::int64_t h = c.hidden, q = static_cast<std::int64_t>(c.heads) * c.head_dim;
  const std::int64_t kv = static_cast<std::int64_t>(c.kv_heads) * c.head_dim, f = c.ffn;
  switch (k) {
    case kModQ: return {h, q};
    case kModK: case kModV: return {h, kv};
    case kModO: return {q, h};
    case kModGate: case kModUp: return {h, f};
    default: return {f, h};
  }
}

Status Llama::Impl::init_adapters(std::uint64_t seed) {
  if (lora && !lora->adapter.empty()) {
    // --adapter DIR: its weights (a folder without them starts as PEFT, below).
    TZ_ASSIGN_OR_RETURN(const bool loaded, load_adapter(lora->adapter));
    if (loaded) return Status::ok();
  }
  std::vector<float> values;
  for (std::size_t l = 0; l < lora_specs.size(); ++l) {
    const zero::UnitSpec& spec = lora_specs[l];
    for (std::size_t t = 0; t < spec.tensors.size(); ++t) {
      const zero::TensorSpec& tensor = spec.tensors[t];
      values.assign(tensor.numel(), 0.0f);  // lora_B: zero
      if (tensor.name.ends_with("lora_A.weight")) {
        // The stream of the unit's id without vocabulary chunks (ids count registrations), so the
        // adapters start the same whatever the chunking.
        const zero::UnitId id = lora_units[l] - static_cast<zero::UnitId>(chunks.count - 1);
        fill_lora_a(values, tensor.shape[1], seed, id, t);
      }
      Status s = engine.set_tensor(lora_units[l], t, values);
      if (!s.is_ok()) return std::move(s).with_context("init of " + tensor.name);
    }
  }
  return Status::ok();
}

Result<bool> Llama::Impl::load_adapter(const std::string& dir) {
  if (!lora) return Status::invalid_argument("model " + config.name + " has no adapters (--lora)");
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string file = (fs::path(dir) / kAdapterWeightsFile).string();
  if (!fs::exists(file, ec)) {
    if (fs::exists(fs::path(dir) / "adapter_model.bin", ec)) {
      return Status::invalid_argument(dir + ": holds adapter_model.bin (a pickle), which tierzero "
                                      "does not read; save the adapter with safe_serialization "
                                      "(adapter_model.safetensors)");
    }
    return false;  // a config-only adapter starts as PEFT initialises it
  }
  Status s = load_hf_weights_folder(engine, lora_specs, lora_units, file, {});
  if (!s.is_ok()) {
    return std::move(s).with_context("adapter " + dir + " does not fit model " + config.name +
                                     " (an adapter made for another base shape?)");
  }
  return true;
}

Status Llama::load_adapter(const std::string& dir) { return impl_->load_adapter(dir).status(); }

Status Llama::save_adapter(const std::string& dir, DType dtype) {
  Impl& m = *impl_;
  if (!m.lora) return Status::invalid_argument("model " + m.config.name + " has no adapters (--lora)");
  const bool writes = m.engine.rank() == 0;
  std::vector<SafetensorsTensorSpec> layout;
  for (const zero::UnitSpec& u : m.lora_specs) {
    for (const zero::TensorSpec& t : u.tensors) layout.push_back({t.name, dtype, t.shape});
  }
  Status write_error;
  std::optional<SafetensorsWriter> writer;
  const std::string file = (std::filesystem::path(dir) / kAdapterWeightsFile).string();
  if (writes) {
    write_error = make_folders(dir);
    if (write_error.is_ok()) {
      Result<SafetensorsWriter> w = SafetensorsWriter::create(file, layout, {{"format", "pt"}});
      if (w.is_ok()) {
        writer.emplace(std::move(w).value());
      } else {
        write_error = std::move(w).take_status();
      }
    }
  }
  // Every rank gathers every tensor (collective) even after a write error, so ranks stay paired.
  std::vector<float> values;
  for (std::size_t l = 0; l < m.lora_specs.size(); ++l) {
    for (std::size_t t = 0; t < m.lora_specs[l].tensors.size(); ++t) {
      const zero::TensorSpec& spec = m.lora_specs[l].tensors[t];
      values.resize(spec.numel());
      TZ_RETURN_IF_ERROR(m.engine.get_tensor(m.lora_units[l], t, values));
      if (writer && write_error.is_ok()) write_error = writer->write_f32(spec.name, values);
    }
  }
  if (!writes) return Status::ok();
  TZ_RETURN_IF_ERROR(std::move(write_error));
  TZ_RETURN_IF_ERROR(writer->finish());
  return write_output_file(
      "", (std::filesystem::path(dir) / kAdapterConfigFile).string(),
      adapter_config_json(*m.lora, m.config.name).dump(2) + "\n");
}

Status Llama::save_merged(const std::string& dir, DType dtype) {
  Impl& m = *impl_;
  if (!m.lora) return Status::invalid_argument("model " + m.config.name + " has no adapters (--lora)");
  // Which base tensor each module's weight is, per layer: merged as W + (alpha / r) B A.
  const std::span<const std::string_view> names = llama_lora_modules();
  const std::vector<HfTensor> whole = hf_tensors(m.specs);
  std::vector<FolderTensor> tensors;
  for (const HfTensor& t : whole) tensors.push_back({t.name, t.shape});
  std::vector<float> a_values, b_values;
  const double scale = m.lora->scale();
  const auto source = [&](std::size_t i, std::span<float> out) -> Status {
    for (const HfTensorPart& p : whole[i].parts) {
      TZ_RETURN_IF_ERROR(
          m.engine.get_tensor(m.units[p.unit], p.tensor, out.subspan(p.first_elem, p.numel)));
    }
    const std::size_t u = whole[i].parts.front().unit;
    if (!m.specs[u].name.starts_with("layers.")) return Status::ok();  // embedding, norm, head
    const int layer = m.layer_of(u);
    const std::string& name = whole[i].name;
    for (int k = 0; k < kLoraModules; ++k) {
      if (!m.lora_on(k)) continue;
      const std::string module = "." + std::string(names[static_cast<std::size_t>(k)]) + ".weight";
      if (!name.ends_with(module)) continue;
      const auto [in_dim, out_dim] = llama_lora_dims(m.config, k);
      const zero::UnitId lu = m.lora_units[static_cast<std::size_t>(layer)];
      const std::int64_t r = m.lora->r;
      a_values.resize(static_cast<std::size_t>(r * in_dim));
      b_values.resize(static_cast<std::size_t>(out_dim * r));
      TZ_RETURN_IF_ERROR(m.engine.get_tensor(
          lu, static_cast<std::size_t>(m.lora_a[static_cast<std::size_t>(k)]), a_values));
      TZ_RETURN_IF_ERROR(m.engine.get_tensor(
          lu, static_cast<std::size_t>(m.lora_b[static_cast<std::size_t>(k)]), b_values));
      for (std::int64_t o = 0; o < out_dim; ++o) {
        for (std::int64_t c = 0; c < in_dim; ++c) {
          double sum = 0;
          for (std::int64_t j = 0; j < r; ++j) {
            sum += static_cast<double>(b_values[static_cast<std::size_t>(o * r + j)]) *
                   a_values[static_cast<std::size_t>(j * in_dim + c)];
          }
          float& w = out[static_cast<std::size_t>(o * in_dim + c)];
          w = static_cast<float>(w + scale * sum);
        }
      }
    }
    return Status::ok();
  };
  std::error_code ec;
  const std::string source_dir =
      std::filesystem::is_directory(m.config.name, ec) ? m.config.name : std::string();
  return write_hf_folder(m.engine.rank() == 0, tensors, source, dir,
                         llama_hf_config(m.config, dtype), dtype, source_dir);
}

}  // namespace tz::model
