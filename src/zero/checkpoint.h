// Checkpoints (issue 13): everything a resumed run needs, laid out by parameter, not by rank, so a
// checkpoint is independent of the number of ranks, the stage and the offload choice. Only
// trainable units are saved: frozen ones (UnitSpec::frozen, a LoRA base) are the caller's to load.
//
//   DIR/step-000120/manifest.json       format version, step, ranks, stage, dtype, the caller's
//                                       model and trainer state, the frozen base's identity
//                                       (CheckpointExtra::base), the engine's scalar state, the
//                                       resolved config, and per tensor: shape, shard ranges and
//                                       the xxHash3 of each stored value (master, m, v)
//   DIR/step-000120/master.safetensors  fp32 master weights, one entry "unit/tensor" per tensor
//   DIR/step-000120/state0.safetensors  the optimizer's first state (Adam m), when it keeps one
//   DIR/step-000120/state1.safetensors  its second (Adam v)
//   DIR/latest                          the name of the newest complete checkpoint
//
// Crash consistency: a save writes into step-N.tmp, fsyncs every file, waits for every rank
// (barrier), lets rank 0 write and fsync the manifest, renames the directory, fsyncs DIR, then
// replaces `latest` by rename; older checkpoints are deleted only after that. A process killed at
// any moment leaves the previous checkpoint loadable; partial *.tmp directories are ignored and
// removed by the next save.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "core/status.h"
#include "zero/engine.h"

namespace tz::zero {

inline constexpr int kCheckpointFormatVersion = 1;

// What the caller stores beside the engine's state: the model's shape and the trainer's own state
// (data-loader position, RNG), both opaque to the checkpoint.
//
// `base` names the frozen base the trainable units were trained on (UnitSpec::frozen: a LoRA
// base), e.g. a hash of the base folder's files or "preset:seed"; empty when there is none. A
// checkpoint holds only trainable units' state (the base is not copied into it) and records
// `base` in its manifest; load_checkpoint refuses a checkpoint of another base.
struct CheckpointExtra {
  nlohmann::json model;
  nlohmann::json trainer;
  std::string base;
};

// Writes checkpoint `step` of `engine` into `dir` (created if needed). Collective: every rank
// calls it with the same arguments at a step boundary; `comm` is the engine's communicator (its
// barrier orders the ranks' writes before the manifest). Keeps the newest `keep` checkpoints
// (0 = all). Returns the checkpoint's directory. Errors (ENOSPC, EIO, ...) name the file and
// tensor; the previous checkpoint is then untouched and `latest` still names it.
Result<std::string> save_checkpoint(Engine& engine, comm::Comm& comm, const std::string& dir,
                                    std::int64_t step, const CheckpointExtra& extra, int keep = 0);

// Resolves what --resume names: a checkpoint directory (holding manifest.json), or a directory of
// checkpoints (its `latest`). kNotFound when there is none.
Result<std::string> resolve_checkpoint(const std::string& path);

// Reads and checks the manifest of a checkpoint directory (format version, the files it names).
Result<nlohmann::json> read_manifest(const std::string& checkpoint_dir);

// Loads a checkpoint into a finalized engine of the same model (any rank count, stage or
// offload: a reshard). Collective. Every tensor's checksum is verified as it is read; a corrupt or
// truncated file, a missing tensor or a shape mismatch is an error naming the file and tensor.
// After an error the engine holds partial state and must not be trained on. Returns the extra
// state the checkpoint holds. `base` is this run's base identity (CheckpointExtra::base): a
// checkpoint saved with another one (or with one where this run has none, or the reverse) is
// kInvalidArgument naming both. Frozen units are not loaded (the caller loads its base itself).
Result<CheckpointExtra> load_checkpoint(Engine& engine, const std::string& checkpoint_dir,
                                        const std::string& base = "");

// Verifies every checksum of a checkpoint without an engine (tierzero ckpt info), streaming.
struct CheckpointSummary {
  std::string path;
  nlohmann::json manifest;
  std::uint64_t tensors = 0;
  std::uint64_t params = 0;
  std::uint64_t bytes = 0;
};
Result<CheckpointSummary> verify_checkpoint(const std::string& checkpoint_dir);

// The checksum a manifest records for one stored value of a tensor: xxHash3-64 of its fp32 bytes,
// as 16 hex digits.
std::string tensor_checksum(std::span<const float> values);

// Removes partial checkpoints (step-*.tmp) left in `dir` by killed runs. Missing dir is OK.
Status remove_partial_checkpoints(const std::string& dir);

}  // namespace tz::zero
