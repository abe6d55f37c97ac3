// Hugging Face model folders (model/hf_folder.h): the index and its shards, the checks of every
// tensor against the model before any is set, the sharded writer and the copied tokenizer files.
#include "model/hf_folder.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "core/assert.h"
#include "core/output_file.h"
#include "core/safetensors.h"
#include "model/hf.h"

namespace tz::model {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// Buffers older transformers saved beside the parameters.
bool is_buffer(const std::string& name) { return name.ends_with("rotary_emb.inv_freq"); }

// The files a folder's tensors live in: the index's weight_map (name -> shard path), or the single
// file for every name (empty map: every tensor is in `single`).
struct Files {
  std::string single;                        // a single file, or empty with an index
  std::string index;                         // the index path, for errors
  std::map<std::string, std::string> where;  // tensor name -> shard path (with an index)
};

Result<Files> locate(const std::string& path) {
  Files files;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    files.single = path;
    return files;
  }
  const fs::path dir(path);
  const std::string index = (dir / kIndexFile).string();
  const std::string single = (dir / kSingleFile).string();
  if (fs::exists(single, ec) || !fs::exists(index, ec)) {
    files.single = single;  // a missing file is reported by the reader, naming it
    return files;
  }
  files.index = index;
  std::ifstream in(index);
  if (!in) return Status::from_errno(errno, "open", index);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::corrupt(index + ": not a JSON object");
  const auto map = j.find("weight_map");
  if (map == j.end() || !map->is_object()) {
    return Status::corrupt(index + ": key 'weight_map' is missing or not an object");
  }
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string()) {
      return Status::corrupt(index + ": weight_map['" + name + "'] is " + file.dump() +
                             ", not a file name");
    }
    files.where[name] = (dir / file.get<std::string>()).string();
  }
  return files;
}

struct Wanted {
  const HfTensor* tensor = nullptr;
  const SafetensorsReader* reader = nullptr;
  const SafetensorsEntry* entry = nullptr;
};

}  // namespace

std::vector<HfTensor> hf_tensors(const std::vector<zero::UnitSpec>& specs) {
  std::vector<HfTensor> out;
  std::map<std::string, std::size_t, std::less<>> index;
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
      const zero::TensorSpec& spec = specs[u].tensors[t];
      const auto [it, added] = index.emplace(spec.name, out.size());
      if (added) {
        out.push_back({spec.name, spec.shape, {{u, t, 0, spec.numel()}}});
        continue;
      }
      HfTensor& whole = out[it->second];
      TZ_ASSERT(!spec.shape.empty() && whole.shape.size() == spec.shape.size() &&
                    std::equal(spec.shape.begin() + 1, spec.shape.end(), whole.shape.begin() + 1),
                "hf_tensors: the parts of a split tensor differ but in their first dim");
      const HfTensorPart& last = whole.parts.back();
      whole.parts.push_back({u, t, last.first_elem + last.numel, spec.numel()});
      whole.shape[0] += spec.shape[0];
    }
  }
  return out;
}

Status load_hf_weights_folder(zero::Engine& engine, const std::vector<zero::UnitSpec>& specs,
                              const std::vector<zero::UnitId>& units, const std::string& path,
                              const std::vector<std::string>& ignorable) {
  TZ_ASSIGN_OR_RETURN(const Files files, locate(path));
  const std::vector<HfTensor> tensors = hf_tensors(specs);
  std::map<std::string, Wanted, std::less<>> wanted;
  for (const HfTensor& t : tensors) wanted.emplace(t.name, Wanted{&t});
  const std::set<std::string, std::less<>> skip(ignorable.begin(), ignorable.end());
  // Open every file that holds a tensor (headers validated, nothing read yet).
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
  const auto open = [&](const std::string& file, const std::string& why) -> Status {
    if (readers.contains(file)) return Status::ok();
    std::error_code ec;
    if (!files.index.empty() && !fs::exists(file, ec)) {
      return Status::invalid_argument(files.index + ": names shard '" +
                                      fs::path(file).filename().string() + "' (for tensor '" +
                                      why + "'), which does not exist");
    }
    Result<SafetensorsReader> r = SafetensorsReader::open(file);
    if (!r.is_ok()) return r.status();
    readers.emplace(file, std::make_unique<SafetensorsReader>(std::move(r).value()));
    return Status::ok();
  };
  if (files.index.empty()) {
    TZ_RETURN_IF_ERROR(open(files.single, "all"));
  } else {
    for (const auto& [name, file] : files.where) TZ_RETURN_IF_ERROR(open(file, name));
  }
  // Match every entry of every file against the model.
  for (const auto& [file, reader] : readers) {
    for (const SafetensorsEntry& entry : reader->entries()) {
      if (!files.index.empty()) {
        const auto it = files.where.find(entry.name);
        if (it == files.where.end() || it->second != file) continue;  // not the index's copy
      }
      if (is_buffer(entry.name)) continue;
      const auto it = wanted.find(entry.name);
      if (skip.contains(entry.name)) {
        // The tied head: its values are the embedding's, but it must have the embedding's shape.
        const HfTensor& embed = tensors.front();
        if (entry.shape != embed.shape) {
          return Status::invalid_argument(
              tensor_context(file, entry.name) + ": shape " + shape_text(entry.shape) +
              ", expected " + shape_text(embed.shape) + " (tied to " + embed.name + ")");
        }
        continue;
      }
      if (it == wanted.end()) {
        return Status::invalid_argument(tensor_context(file, entry.name) +
                                        ": unexpected, not a parameter of the model");
      }
      const HfTensor& spec = *it->second.tensor;
      if (entry.shape != spec.shape) {
        return Status::invalid_argument(tensor_context(file, entry.name) +
                                        ": wrong shape: expected " + shape_text(spec.shape) +
                                        ", found " + shape_text(entry.shape));
      }
      it->second.reader = reader.get();
      it->second.entry = &entry;
    }
  }
  // Missing tensors in model order.
  const std::string where = files.index.empty() ? files.single : files.index;
  for (const HfTensor& t : tensors) {
    if (wanted.at(t.name).entry == nullptr) {
      return Status::invalid_argument(tensor_context(where, t.name) + " is missing");
    }
  }
  for (const HfTensor& t : tensors) {
    const Wanted& w = wanted.at(t.name);
    for (const HfTensorPart& p : t.parts) {
      TZ_RETURN_IF_ERROR(load_tensor_part(engine, units[p.unit], p.tensor, *w.reader, *w.entry,
                                          kLoadChunkElems, p.first_elem));
    }
  }
  return Status::ok();
}

Status load_tensor_part(zero::Engine& engine, zero::UnitId unit, std::size_t tensor,
                        const SafetensorsReader& reader, const SafetensorsEntry& entry,
                        std::size_t chunk_elems, std::size_t entry_first_elem) {
  TZ_ASSERT(chunk_elems > 0);
  const auto [first, end] = engine.tensor_range(unit, tensor);
  std::vector<float> values(std::min(chunk_elems, end - first));
  for (std::size_t at = first; at < end; at += values.size()) {
    const std::span<float> piece(values.data(), std::min(values.size(), end - at));
    TZ_RETURN_IF_ERROR(reader.read_f32(entry, piece, entry_first_elem + at));
    TZ_RETURN_IF_ERROR(
        check_finite_weights(piece, reader.path(), entry.name, entry_first_elem + at));
    Status s = engine.set_tensor_slice(unit, tensor, at, piece);
    if (!s.is_ok()) return std::move(s).with_context(tensor_context(reader.path(), entry.name));
  }
  return Status::ok();
}

Status write_hf_folder(bool writes, const std::vector<FolderTensor>& tensors,
                       const FolderTensorSource& source, const std::string& dir,
                       const nlohmann::ordered_json& config, DType dtype,
                       const std::string& source_dir, std::uint64_t shard_bytes) {
  // Tensors into shards in order, each shard up to shard_bytes (a larger tensor alone).
  std::vector<std::vector<SafetensorsTensorSpec>> shards(1);
  std::vector<std::size_t> shard_of;
  std::uint64_t in_shard = 0, total = 0;
  const auto numel_of = [](const FolderTensor& t) {
    std::uint64_t numel = 1;
    for (const std::int64_t d : t.shape) numel *= static_cast<std::uint64_t>(d);
    return numel;
  };
  for (const FolderTensor& t : tensors) {
    const std::uint64_t bytes = numel_of(t) * dtype_size(dtype);
    if (in_shard > 0 && in_shard + bytes > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back({t.name, dtype, t.shape});
    shard_of.push_back(shards.size() - 1);
    in_shard += bytes;
    total += bytes;
  }
  const std::size_t n = shards.size();
  std::vector<std::string> names(n);
  for (std::size_t i = 0; i < n; ++i) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
    names[i] = n == 1 ? std::string(kSingleFile) : std::string(buf);
  }
  Status write_error;
  std::vector<std::optional<SafetensorsWriter>> writers(n);
  const fs::path out(dir);
  if (writes) {
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) write_error = Status::from_errno(ec.value(), "create directory", dir);
    // The other form's files from an earlier save would shadow or confuse this one.
    if (write_error.is_ok()) fs::remove(out / (n == 1 ? kIndexFile : kSingleFile), ec);
    for (std::size_t i = 0; i < n && write_error.is_ok(); ++i) {
      Result<SafetensorsWriter> w =
          SafetensorsWriter::create((out / names[i]).string(), shards[i], {{"format", "pt"}});
      if (w.is_ok()) {
        writers[i].emplace(std::move(w).value());
      } else {
        write_error = std::move(w).take_status();
      }
    }
  }
  std::vector<float> values;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    values.resize(numel_of(tensors[i]));
    Status s = source(i, values);
    if (!s.is_ok()) return std::move(s).with_context(tensor_context(dir, tensors[i].name));
    if (writers[shard_of[i]] && write_error.is_ok()) {
      write_error = writers[shard_of[i]]->write_f32(tensors[i].name, values);
    }
  }
  if (!writes) return Status::ok();
  TZ_RETURN_IF_ERROR(std::move(write_error));
  for (auto& w : writers) TZ_RETURN_IF_ERROR(w->finish());
  const auto write_text = [](const std::string& path, const std::string& text) -> Status {
    return write_output_file("", path, text);
  };
  if (n > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    for (std::size_t i = 0; i < tensors.size(); ++i) map[tensors[i].name] = names[shard_of[i]];
    index["weight_map"] = map;
    TZ_RETURN_IF_ERROR(write_text((out / kIndexFile).string(), index.dump(2) + "\n"));
  }
  TZ_RETURN_IF_ERROR(write_text((out / "config.json").string(), config.dump(2) + "\n"));
  std::error_code ec;
  if (!source_dir.empty() && fs::is_directory(source_dir, ec) &&
      !fs::equivalent(source_dir, out, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(source_dir, ec)) {
      const std::string file = e.path().filename().string();
      const bool tokenizer = file.starts_with("tokenizer") || file == "special_tokens_map.json" ||
                             file == "vocab.json" || file == "merges.txt" ||
                             file == "generation_config.json";
      if (!tokenizer || !e.is_regular_file()) continue;
      std::error_code copy_ec;
      fs::copy_file(e.path(), out / file, fs::copy_options::overwrite_existing, copy_ec);
      if (copy_ec) return Status::from_errno(copy_ec.value(), "copy", e.path().string());
    }
  }
  return Status::ok();
}

Status save_hf_weights_folder(zero::Engine& engine, const std::vector<zero::UnitSpec>& specs,
                              const std::vector<zero::UnitId>& units, const std::string& dir,
                              const nlohmann::ordered_json& config, DType dtype,
                              const std::string& source_dir, std::uint64_t shard_bytes) {
  const std::vector<HfTensor> whole = hf_tensors(specs);
  std::vector<FolderTensor> tensors;
  for (const HfTensor& t : whole) tensors.push_back({t.name, t.shape});
  return write_hf_folder(
      engine.rank() == 0, tensors,
      [&](std::size_t i, std::span<float> out) -> Status {
        for (const HfTensorPart& p : whole[i].parts) {
          TZ_RETURN_IF_ERROR(
              engine.get_tensor(units[p.unit], p.tensor, out.subspan(p.first_elem, p.numel)));
        }
        return Status::ok();
      },
      dir, config, dtype, source_dir, shard_bytes);
}

}  // namespace tz::model
