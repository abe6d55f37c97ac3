// Checkpoint save, load and verification (checkpoint.h): tensors stream one at a time through the
// engine's get_tensor/set_tensor, so host memory holds one tensor whatever the model size; each
// rank writes the part of every tensor that lies in its own shard; rank 0 writes the manifest and
// publishes the directory by rename once every rank's bytes are durable.
#include "zero/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/log.h"
#include "core/safetensors.h"
#include "core/xxhash.h"
#include "zero/layout.h"

namespace tz::zero {
namespace {

namespace fs = std::filesystem;

constexpr const char* kStateFiles[3] = {"master.safetensors", "state0.safetensors",
                                        "state1.safetensors"};
constexpr TensorState kStates[3] = {TensorState::kMaster, TensorState::kState0,
                                    TensorState::kState1};

std::string step_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::string tensor_key(const UnitSpec& unit, const TensorSpec& tensor) {
  return unit.name + "/" + tensor.name;
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Status fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return Status::from_errno(errno, "open for fsync", path);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Status::from_errno(err, "fsync", path);
  return Status::ok();
}

// Writes `text` to `path` durably: a temporary file, fsync, rename over `path`, fsync the parent.
Status write_file_durably(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::from_errno(errno, "create", tmp);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Status::from_errno(err, "write", tmp);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::from_errno(err, "fsync", tmp);
  }
  if (::close(fd) != 0) return Status::from_errno(errno, "close", tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Status::from_errno(errno, "rename", tmp);
  return fsync_path(fs::path(path).parent_path().string(), /*directory=*/true);
}

// Every rank learns whether any rank failed, so no rank waits in a collective the others skip.
// The all-reduce is also the barrier that orders the phases of a save across ranks.
Status agree(Engine& engine, comm::Comm& comm, const Status& mine) {
  gpu::Device& device = engine.device();
  TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer flag, device.allocate(sizeof(float)));
  const float failed = mine.is_ok() ? 0.0f : 1.0f;
  gpu::Stream& stream = engine.compute_stream();
  TZ_RETURN_IF_ERROR(device.copy_async(flag.data(), &failed, sizeof(float),
                                       gpu::CopyKind::kHostToDevice, stream));
  TZ_RETURN_IF_ERROR(comm.all_reduce(flag.data(), flag.data(), 1, DType::kF32,
                                     comm::ReduceOp::kSum, stream));
  float total = 0;
  TZ_RETURN_IF_ERROR(device.copy_async(&total, flag.data(), sizeof(float),
                                       gpu::CopyKind::kDeviceToHost, stream));
  TZ_RETURN_IF_ERROR(stream.synchronize());
  if (!mine.is_ok()) return mine;
  if (total > 0) {
    return Status(ErrorCode::kIoError, 0, "checkpoint: another rank failed (see its error)");
  }
  return Status::ok();
}

Result<std::vector<std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return names;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0 && name.find('.') == std::string::npos) {
      names.push_back(name);
    }
  }
  if (ec) return Status::from_errno(ec.value(), "list checkpoints in", dir);
  std::sort(names.begin(), names.end());  // zero-padded step numbers sort in step order
  return names;
}

std::string base_label(const std::string& base) { return base.empty() ? "(none)" : "'" + base + "'"; }

// A checkpoint resumes only on the base it was trained on (CheckpointExtra::base).
Status check_base(const std::string& checkpoint_dir, const nlohmann::json& manifest,
                  const std::string& base) {
  const std::string there = manifest.value("base", "");
  if (there == base) return Status::ok();
  return Status::invalid_argument("checkpoint " + checkpoint_dir + " was trained on base " +
                                  base_label(there) + ", this run's base is " + base_label(base));
}

}  // namespace

std::string tensor_checksum(std::span<const float> values) {
  return hex64(XXH3_64bits(values.data(), values.size_bytes()));
}

Status remove_partial_checkpoints(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return Status::ok();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool partial = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
    if (partial) {
      fs::remove_all(e.path(), ec);
      if (ec) return Status::from_errno(ec.value(), "remove partial checkpoint", e.path().string());
      TZ_LOG_INFO("checkpoint: removed partial %s", e.path().string().c_str());
    }
  }
  return Status::ok();
}

namespace {

// Where one save writes: DIR/step-N.tmp, renamed to DIR/step-N once complete.
struct SavePaths {
  std::string dir;
  std::string final_dir;
  std::string tmp_dir;
  std::int64_t step = 0;
};

// Rank 0: the checkpoint directory, partial saves removed, and the state files with their
// headers fixed up front (one fp32 entry per trainable tensor; frozen units are not saved).
Status prepare_files(Engine& engine, const SavePaths& p, int states) {
  std::error_code ec;
  fs::create_directories(p.dir, ec);
  if (ec) return Status::from_errno(ec.value(), "create checkpoint directory", p.dir);
  TZ_RETURN_IF_ERROR(remove_partial_checkpoints(p.dir));
  fs::remove_all(p.final_dir, ec);  // a stale directory of the same step (an older run's)
  fs::create_directories(p.tmp_dir, ec);
  if (ec) return Status::from_errno(ec.value(), "create", p.tmp_dir);
  std::vector<SafetensorsTensorSpec> specs;
  for (UnitId u = 0; u < engine.unit_count(); ++u) {
    const UnitSpec& unit = engine.unit_spec(u);
    if (unit.frozen) continue;
    for (const TensorSpec& t : unit.tensors) {
      specs.push_back({tensor_key(unit, t), DType::kF32, t.shape});
    }
  }
  for (int s = 0; s < states; ++s) {
    TZ_ASSIGN_OR_RETURN(SafetensorsWriter w,
                        SafetensorsWriter::create(p.tmp_dir + "/" + kStateFiles[s], specs,
                                                  {{"format", "tierzero-checkpoint"}}));
    TZ_RETURN_IF_ERROR(w.finish());
  }
  return Status::ok();
}

// Every rank writes the part of each trainable tensor in its own shard; every rank computes the
// checksums (they have the full value from get_tensor) into `tensors`, which rank 0 records.
// get_tensor is a collective, so a rank whose file fails keeps taking part in it (writing
// nothing more) and the failure is reported after the loop, when every rank agrees on the
// outcome.
Status write_shards(Engine& engine, comm::Comm& comm, const SavePaths& p, int states,
                    nlohmann::ordered_json& tensors) {
  std::vector<SafetensorsWriter> writers;
  Status file_error = Status::ok();
  for (int s = 0; s < states && file_error.is_ok(); ++s) {
    Result<SafetensorsWriter> w = SafetensorsWriter::open_existing(p.tmp_dir + "/" + kStateFiles[s]);
    if (w.is_ok()) {
      writers.push_back(std::move(*w));
    } else {
      file_error = w.status();
    }
  }
  std::vector<float> values;
  for (UnitId u = 0; u < engine.unit_count(); ++u) {
    const UnitSpec& unit = engine.unit_spec(u);
    if (unit.frozen) continue;  // the base is the caller's (CheckpointExtra::base)
    const UnitLayout& layout = engine.layout(u);
    for (std::size_t t = 0; t < unit.tensors.size(); ++t) {
      const TensorSpec& spec = unit.tensors[t];
      values.resize(spec.numel());
      nlohmann::ordered_json entry = {{"name", tensor_key(unit, spec)},
                                      {"unit", unit.name},
                                      {"tensor", spec.name},
                                      {"shape", spec.shape}};
      nlohmann::ordered_json ranges = nlohmann::ordered_json::array();
      for (int r = 0; r < comm.world_size(); ++r) {
        const auto [b, e] = layout.shard_part(unit.tensors, t, r);
        if (b < e) ranges.push_back({r, b, e});
      }
      entry["shard_ranges"] = ranges;
      const auto [begin, end] = layout.shard_part(unit.tensors, t, comm.rank());
      nlohmann::ordered_json sums = nlohmann::ordered_json::object();
      for (int s = 0; s < states; ++s) {
        TZ_RETURN_IF_ERROR(std::move(engine.get_tensor(u, t, values, kStates[s]))
                               .with_context("checkpoint " + tensor_key(unit, spec)));
        if (begin < end && file_error.is_ok()) {
          file_error = writers[static_cast<std::size_t>(s)].write_f32(
              tensor_key(unit, spec), std::span<const float>(values).subspan(begin, end - begin),
              begin);
        }
        sums[kStateFiles[s]] = tensor_checksum(values);
      }
      entry["xxh3"] = sums;
      tensors.push_back(std::move(entry));
    }
  }
  TZ_RETURN_IF_ERROR(file_error);
  for (SafetensorsWriter& w : writers) TZ_RETURN_IF_ERROR(w.finish());
  return Status::ok();
}

// Rank 0, once every rank's bytes are durable: the manifest, the directory renamed into place,
// `latest` replaced, and only then the checkpoints beyond the newest `keep` removed.
Status publish(Engine& engine, comm::Comm& comm, const SavePaths& p, int states,
               const CheckpointExtra& extra, nlohmann::ordered_json tensors, int keep) {
  const EngineOptions& options = engine.options();
  nlohmann::ordered_json manifest = {
      {"format", "tierzero-checkpoint"},
      {"format_version", kCheckpointFormatVersion},
      {"step", p.step},
      {"ranks", comm.world_size()},
      {"stage", options.config.zero.stage},
      {"compute_dtype", std::string(dtype_name(engine.compute_dtype()))},
      {"optimizer_states", states - 1},
      {"params", engine.trainable_param_count()},
      {"base", extra.base},
      {"model", extra.model},
      {"trainer", extra.trainer},
      {"engine", engine.scalar_state()},
      {"files", nlohmann::ordered_json::array()},
      {"tensors", std::move(tensors)}};
  for (int s = 0; s < states; ++s) manifest["files"].push_back(kStateFiles[s]);
  TZ_RETURN_IF_ERROR(write_file_durably(p.tmp_dir + "/manifest.json", manifest.dump(1) + "\n"));
  TZ_RETURN_IF_ERROR(fsync_path(p.tmp_dir, /*directory=*/true));
  if (::rename(p.tmp_dir.c_str(), p.final_dir.c_str()) != 0) {
    return Status::from_errno(errno, "rename", p.tmp_dir);
  }
  TZ_RETURN_IF_ERROR(fsync_path(p.dir, /*directory=*/true));
  TZ_RETURN_IF_ERROR(write_file_durably(p.dir + "/latest", step_name(p.step) + "\n"));
  // Only now that the new checkpoint is complete and named may older ones go.
  if (keep > 0) {
    TZ_ASSIGN_OR_RETURN(std::vector<std::string> all, list_checkpoints(p.dir));
    const std::size_t kept = static_cast<std::size_t>(keep);
    for (std::size_t i = 0; i + kept < all.size(); ++i) {
      if (all[i] == step_name(p.step)) continue;
      std::error_code ec;
      fs::remove_all(p.dir + "/" + all[i], ec);
      if (ec) TZ_LOG_WARN("checkpoint: could not remove old %s/%s", p.dir.c_str(), all[i].c_str());
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::string> save_checkpoint(Engine& engine, comm::Comm& comm, const std::string& dir,
                                    std::int64_t step, const CheckpointExtra& extra, int keep) {
  SavePaths p;
  p.dir = dir;
  p.step = step;
  p.final_dir = dir + "/" + step_name(step);
  p.tmp_dir = p.final_dir + ".tmp";
  const int states = 1 + engine.optimizer_state_count();
  const bool leader = comm.rank() == 0;
  // Rank 0 prepares the directory and the files; the others wait (agree is the barrier).
  TZ_RETURN_IF_ERROR(
      agree(engine, comm, leader ? prepare_files(engine, p, states) : Status::ok()));
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  TZ_RETURN_IF_ERROR(agree(engine, comm, write_shards(engine, comm, p, states, tensors)));
  const Status published =
      leader ? publish(engine, comm, p, states, extra, std::move(tensors), keep) : Status::ok();
  TZ_RETURN_IF_ERROR(agree(engine, comm, published));
  return p.final_dir;
}

Result<std::string> resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::exists(path + "/manifest.json", ec)) return path;
  std::ifstream latest(path + "/latest");
  if (!latest) {
    return Status::not_found("no checkpoint at " + path +
                             " (neither a manifest.json nor a 'latest' file)");
  }
  std::string name;
  std::getline(latest, name);
  const std::string dir = path + "/" + name;
  if (name.empty() || !fs::exists(dir + "/manifest.json", ec)) {
    return Status::not_found(path + "/latest names '" + name +
                             "', which is not a complete checkpoint");
  }
  return dir;
}

Result<nlohmann::json> read_manifest(const std::string& checkpoint_dir) {
  const std::string path = checkpoint_dir + "/manifest.json";
  std::ifstream in(path);
  if (!in) return Status::not_found("checkpoint manifest " + path + " cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json manifest = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return Status::corrupt(path + ": not valid JSON");
  }
  if (manifest.value("format", "") != "tierzero-checkpoint") {
    return Status::corrupt(path + ": not a tierzero checkpoint manifest");
  }
  if (manifest.value("format_version", 0) != kCheckpointFormatVersion) {
    return Status::invalid_argument(path + ": format_version " +
                                    manifest.value("format_version", nlohmann::json()).dump() +
                                    " is not the supported " +
                                    std::to_string(kCheckpointFormatVersion));
  }
  if (!manifest["tensors"].is_array() || !manifest["files"].is_array()) {
    return Status::corrupt(path + ": no tensors or files list");
  }
  return manifest;
}

Result<CheckpointExtra> load_checkpoint(Engine& engine, const std::string& checkpoint_dir,
                                        const std::string& base) {
  TZ_ASSIGN_OR_RETURN(nlohmann::json manifest, read_manifest(checkpoint_dir));
  TZ_RETURN_IF_ERROR(check_base(checkpoint_dir, manifest, base));
  const int states_there = manifest.value("optimizer_states", 0);
  const int states_here = engine.optimizer_state_count();
  if (states_there != states_here) {
    return Status::invalid_argument(checkpoint_dir + ": holds " + std::to_string(states_there) +
                                    " optimizer states per parameter, this run's optimizer keeps " +
                                    std::to_string(states_here));
  }
  std::vector<SafetensorsReader> readers;
  for (int s = 0; s <= states_here; ++s) {
    TZ_ASSIGN_OR_RETURN(SafetensorsReader r,
                        SafetensorsReader::open(checkpoint_dir + "/" + kStateFiles[s]));
    readers.push_back(std::move(r));
  }
  std::map<std::string, const nlohmann::json*> by_name;
  for (const nlohmann::json& t : manifest["tensors"]) by_name[t.value("name", "")] = &t;

  std::vector<float> values;
  std::size_t matched = 0;
  for (UnitId u = 0; u < engine.unit_count(); ++u) {
    const UnitSpec& unit = engine.unit_spec(u);
    if (unit.frozen) continue;  // not in checkpoints: the caller loads its base
    for (std::size_t t = 0; t < unit.tensors.size(); ++t) {
      const TensorSpec& spec = unit.tensors[t];
      const std::string key = tensor_key(unit, spec);
      const auto it = by_name.find(key);
      if (it == by_name.end()) {
        return Status::not_found(checkpoint_dir + "/manifest.json: tensor '" + key + "' is missing");
      }
      ++matched;
      const nlohmann::json& entry = *it->second;
      if (entry["shape"] != nlohmann::json(spec.shape)) {
        return Status::invalid_argument(tensor_context(checkpoint_dir, key) + " has shape " +
                                        entry["shape"].dump() + " there but " +
                                        nlohmann::json(spec.shape).dump() + " in this model");
      }
      values.resize(spec.numel());
      for (int s = 0; s <= states_here; ++s) {
        const SafetensorsReader& reader = readers[static_cast<std::size_t>(s)];
        const SafetensorsEntry* e = reader.find(key);
        if (e == nullptr) {
          return Status::not_found(tensor_context(reader.path(), key) + " is missing");
        }
        if (e->numel() != spec.numel() || e->dtype != DType::kF32) {
          return Status::invalid_argument(tensor_context(reader.path(), key) +
                                          " does not hold fp32 of the model's shape");
        }
        TZ_RETURN_IF_ERROR(reader.read_f32(*e, values));
        const std::string want = entry["xxh3"].value(kStateFiles[s], "");
        if (tensor_checksum(values) != want) {
          return Status::corrupt(tensor_context(reader.path(), key) +
                                 " does not match its checksum (xxh3 " + tensor_checksum(values) +
                                 ", manifest " + want + ")");
        }
        TZ_RETURN_IF_ERROR(engine.set_tensor(u, t, values, kStates[s]));
      }
    }
  }
  if (matched != by_name.size()) {
    return Status::invalid_argument(checkpoint_dir + ": holds " + std::to_string(by_name.size()) +
                                    " tensors, this model has " + std::to_string(matched));
  }
  TZ_RETURN_IF_ERROR(engine.restore_scalar_state(manifest["engine"]));
  CheckpointExtra extra;
  extra.model = manifest["model"];
  extra.trainer = manifest["trainer"];
  extra.base = manifest.value("base", "");
  return extra;
}

Result<CheckpointSummary> verify_checkpoint(const std::string& checkpoint_dir) {
  CheckpointSummary summary;
  summary.path = checkpoint_dir;
  TZ_ASSIGN_OR_RETURN(summary.manifest, read_manifest(checkpoint_dir));
  std::vector<SafetensorsReader> readers;
  for (const nlohmann::json& f : summary.manifest["files"]) {
    TZ_ASSIGN_OR_RETURN(SafetensorsReader r,
                        SafetensorsReader::open(checkpoint_dir + "/" + f.get<std::string>()));
    readers.push_back(std::move(r));
  }
  constexpr std::size_t kChunk = 1u << 20;
  std::vector<float> chunk;
  for (const nlohmann::json& t : summary.manifest["tensors"]) {
    const std::string key = t.value("name", "");
    ++summary.tensors;
    for (std::size_t s = 0; s < readers.size(); ++s) {
      const SafetensorsReader& reader = readers[s];
      const SafetensorsEntry* e = reader.find(key);
      if (e == nullptr) {
        return Status::not_found(tensor_context(reader.path(), key) + " is missing");
      }
      if (s == 0) summary.params += e->numel();
      summary.bytes += e->end - e->begin;
      XXH3_state_t* state = XXH3_createState();
      XXH3_64bits_reset(state);
      Status st = Status::ok();
      for (std::uint64_t done = 0; done < e->numel() && st.is_ok();) {
        const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, e->numel() - done));
        chunk.resize(k);
        st = reader.read_f32(*e, chunk, done);
        if (st.is_ok()) XXH3_64bits_update(state, chunk.data(), k * sizeof(float));
        done += k;
      }
      const std::uint64_t got = XXH3_64bits_digest(state);
      XXH3_freeState(state);
      TZ_RETURN_IF_ERROR(std::move(st));
      const std::string want =
          t["xxh3"].value(summary.manifest["files"][s].get<std::string>(), "");
      if (hex64(got) != want) {
        return Status::corrupt(tensor_context(reader.path(), key) +
                               " does not match its checksum (xxh3 " + hex64(got) + ", manifest " +
                               want + ")");
      }
    }
  }
  return summary;
}

}  // namespace tz::zero
