// Unit layout: tensor offsets and shard padding (layout.h).
#include "zero/layout.h"

#include <algorithm>

#include "core/assert.h"

namespace tz::zero {

namespace {
std::size_t round_up(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }
}  // namespace

std::size_t TensorSpec::numel() const {
  std::size_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::size_t>(d);
  return shape.empty() ? 0 : n;
}

UnitLayout plan_unit_layout(const UnitSpec& spec, int world_size) {
  TZ_ASSERT(world_size >= 1, "world_size must be >= 1");
  UnitLayout layout;
  std::size_t end = 0;
  for (const TensorSpec& t : spec.tensors) {
    TZ_ASSERT(t.numel() > 0, "empty tensor in a unit layout");
    const std::size_t offset = round_up(end, kTensorAlignElems);
    layout.offsets.push_back(offset);
    end = offset + t.numel();
    layout.numel += t.numel();
  }
  const auto world = static_cast<std::size_t>(world_size);
  layout.padded = round_up(std::max<std::size_t>(end, 1), world * kShardAlignElems);
  layout.shard = layout.padded / world;
  layout.frozen = spec.frozen;
  return layout;
}

std::pair<std::size_t, std::size_t> UnitLayout::shard_part(const std::vector<TensorSpec>& tensors,
                                                           std::size_t t, int rank) const {
  const std::size_t lo = static_cast<std::size_t>(rank) * shard;
  const std::size_t hi = lo + shard;
  const std::size_t begin = std::clamp(lo, offsets[t], offsets[t] + tensors[t].numel());
  const std::size_t end = std::clamp(hi, offsets[t], offsets[t] + tensors[t].numel());
  return {begin - offsets[t], std::max(begin, end) - offsets[t]};
}

}  // namespace tz::zero
