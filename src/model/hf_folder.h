// Hugging Face model folders in and out of the engine, for models whose unit tensors carry their
// HF names (the Llama family): config.json with model.safetensors, or the shards listed in
// model.safetensors.index.json; tensors fp32, bf16 or fp16. Weights stream one tensor at a time
// through set_tensor / get_tensor, so no file or model is held whole in host memory.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "zero/engine.h"

namespace tz::model {

// transformers' save_pretrained default (max_shard_size "5GB"): a folder above it is sharded.
inline constexpr std::uint64_t kDefaultShardBytes = 5'000'000'000ull;

// A Hugging Face tensor and where its elements live in the units: one unit tensor of the same
// name, or several same-named unit tensors holding consecutive row ranges in unit order (the
// Llama family's vocabulary chunks, model/llama.h), their shapes equal but for the first dim.
struct HfTensorPart {
  std::size_t unit = 0, tensor = 0;  // indices into the specs and their tensors
  std::size_t first_elem = 0;        // where the part starts in the HF tensor (row-major)
  std::size_t numel = 0;
};
struct HfTensor {
  std::string name;
  std::vector<std::int64_t> shape;  // the whole tensor's
  std::vector<HfTensorPart> parts;
};
// The HF tensors of `specs` in the order of their first part.
std::vector<HfTensor> hf_tensors(const std::vector<zero::UnitSpec>& specs);

// Loads every tensor of `specs` (tensor names are HF names; hf_tensors joins split ones) from `path`: a folder (its index and
// shards, or its model.safetensors) or one safetensors file. Names in `ignorable` (the tied
// lm_head.weight) may be present with any content of the right size and are skipped, as are
// rotary inv_freq buffers older files hold. Everything is checked before the first tensor is set
// (so nothing changes on bad input), each error one line naming the file: an index that does not
// parse or names a shard that does not exist, a truncated or corrupt shard (kCorrupt), an
// unsupported dtype, a missing tensor (its name), a tensor of the wrong shape (name, expected,
// found), an unexpected tensor. Each rank reads the headers, then only the elements it keeps
// (load_tensor_part: at stage 3 its shards' bytes), so a model larger than host memory loads. Not
// collective; on a NaN or Inf only the ranks whose part holds it fail.
Status load_hf_weights_folder(zero::Engine& engine, const std::vector<zero::UnitSpec>& specs,
                              const std::vector<zero::UnitId>& units, const std::string& path,
                              const std::vector<std::string>& ignorable);

// Elements read per piece by load_tensor_part: 64 MiB of fp32, so loading holds at most that much
// of any tensor in host memory (the 394 M-element embedding of llama-3.2-3b included).
inline constexpr std::size_t kLoadChunkElems = std::size_t{16} << 20;

// Sets the master weights of tensor `tensor` of `unit` from `entry` of `reader` (its shape already
// checked against the model): only the elements this rank keeps (Engine::tensor_range; at stage 3
// its shard's part), read in pieces of at most `chunk_elems` elements, so the bytes of the other
// ranks' parts are never read; each piece checked finite (check_finite_weights). Not collective:
// a rank may fail where another does not (a NaN in its part), so callers that train next agree
// on the outcome (train/trainer.h does). Errors name the file and the tensor.
// The unit tensor may be a part of the entry (HfTensorPart): its element 0 is the entry's element
// `entry_first_elem`.
Status load_tensor_part(zero::Engine& engine, zero::UnitId unit, std::size_t tensor,
                        const SafetensorsReader& reader, const SafetensorsEntry& entry,
                        std::size_t chunk_elems = kLoadChunkElems,
                        std::size_t entry_first_elem = 0);

// One tensor of a folder being written, and where its fp32 values come from (the values of
// tensor `index` into `out`, numel elements).
struct FolderTensor {
  std::string name;
  std::vector<std::int64_t> shape;
};
using FolderTensorSource = std::function<Status(std::size_t index, std::span<float> out)>;

// Writes the folder `dir` (created if needed) when `writes`: config.json (`config`), the tensors
// as `dtype` in order, in model.safetensors or, above `shard_bytes`, in
// model-0000i-of-0000n.safetensors shards with model.safetensors.index.json; and copies the
// tokenizer and generation files (tokenizer*, special_tokens_map.json, vocab.json, merges.txt,
// generation_config.json) of `source_dir` when it is non-empty and not `dir`. `source` is called
// for every tensor in order whether or not this caller writes (so collective sources pair up);
// after a write error the remaining sources still run and the first error is returned.
Status write_hf_folder(bool writes, const std::vector<FolderTensor>& tensors,
                       const FolderTensorSource& source, const std::string& dir,
                       const nlohmann::ordered_json& config, DType dtype,
                       const std::string& source_dir,
                       std::uint64_t shard_bytes = kDefaultShardBytes);

// The engine's master weights as a folder (write_hf_folder): every tensor of `specs` in unit
// order (hf_tensors: split ones whole). Collective: every rank gathers each tensor; rank 0
// writes.
Status save_hf_weights_folder(zero::Engine& engine, const std::vector<zero::UnitSpec>& specs,
                              const std::vector<zero::UnitId>& units, const std::string& dir,
                              const nlohmann::ordered_json& config, DType dtype,
                              const std::string& source_dir,
                              std::uint64_t shard_bytes = kDefaultShardBytes);

}  // namespace tz::model
