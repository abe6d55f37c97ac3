// The flat layout of a unit (engine.h, UnitSpec): where each tensor starts in the unit's flat
// buffer and how the buffer is padded into world_size equal shards. Pure functions, so the plan
// can be tested without an engine.
#pragma once

#include <cstddef>
#include <vector>

#include "zero/engine.h"

namespace tz::zero {

// A shard is a multiple of this many elements: 4 KiB in 16-bit (8 KiB in fp32), so every shard
// of every dtype the engine keeps is O_DIRECT-aligned and starts 256-byte aligned on the device.
inline constexpr std::size_t kShardAlignElems = 2048;

struct UnitLayout {
  std::vector<std::size_t> offsets;  // element offset of each tensor in the flat buffer
  std::size_t numel = 0;             // sum of the tensors' numel (no padding)
  std::size_t padded = 0;            // flat buffer length: world_size * shard
  std::size_t shard = 0;             // elements per rank
  bool frozen = false;               // UnitSpec::frozen: parameters only (plan_memory)
  // The part of tensor `t` that lies in rank `rank`'s shard, as [begin, end) in tensor elements
  // (empty when begin == end).
  std::pair<std::size_t, std::size_t> shard_part(const std::vector<TensorSpec>& tensors,
                                                 std::size_t t, int rank) const;
};

// Tensors in order at multiples of kTensorAlignElems; padded to world_size * a multiple of
// kShardAlignElems. world_size >= 1 and every tensor non-empty (asserted).
UnitLayout plan_unit_layout(const UnitSpec& spec, int world_size);

}  // namespace tz::zero
