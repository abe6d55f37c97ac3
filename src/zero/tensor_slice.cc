// Setting a tensor by slices on the ranks that keep them (Engine::tensor_range and
// set_tensor_slice, zero/engine.h), so a loader reads only the bytes of a file this rank needs
// and never holds a whole tensor. Not collective: nothing here talks to the other ranks.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "zero/engine_impl.h"

namespace tz::zero::impl {

std::pair<std::size_t, std::size_t> EngineImpl::tensor_range(UnitId id, std::size_t tensor) const {
  TZ_ASSERT(id < ctx_.units.size() && tensor < ctx_.units[id].spec.tensors.size(),
            "tensor_range: no such unit or tensor");
  const Unit& u = ctx_.units[id];
  if (ctx_.stage < 3) return {0, u.spec.tensors[tensor].numel()};
  return u.layout.shard_part(u.spec.tensors, tensor, ctx_.rank);
}

Status EngineImpl::set_tensor_slice(UnitId id, std::size_t tensor, std::size_t first_elem,
                                    std::span<const float> values, TensorState which) {
  TZ_RETURN_IF_ERROR(check_unit(id, "set_tensor_slice"));
  Unit& u = ctx_.units[id];
  if (tensor >= u.spec.tensors.size()) {
    return check_tensor(id, tensor, 0, "set_tensor_slice");  // names the unit and the index
  }
  const std::size_t n = u.spec.tensors[tensor].numel();
  const std::size_t last = first_elem + values.size();
  if (first_elem > n || values.size() > n - first_elem) {
    return Status::invalid_argument("set_tensor_slice '" + u.spec.name + "." +
                                    u.spec.tensors[tensor].name + "': elements [" +
                                    std::to_string(first_elem) + ", " + std::to_string(last) +
                                    ") past its " + std::to_string(n));
  }
  // An update still running finishes first (delayed: and is published), so the value set here
  // is not overwritten by parameters computed before it.
  TZ_RETURN_IF_ERROR(overlap_->wait());
  TZ_RETURN_IF_ERROR(overlap_->publish());
  const std::size_t off = u.layout.offsets[tensor];
  const auto shard = u.layout.shard_part(u.spec.tensors, tensor, ctx_.rank);
  // Writes the part of the slice inside [b, e) (tensor elements) of `bytes`-per-element `src` to
  // `dst`, which holds the rank's shard (`sharded`) or the whole unit.
  const auto write_part = [&](BlockId dst, const std::byte* src, std::size_t es, bool sharded) {
    const std::size_t b = std::max(first_elem, sharded ? shard.first : 0);
    const std::size_t e = std::min(last, sharded ? shard.second : n);
    if (e <= b) return Status::ok();
    const std::size_t at =
        off + b - (sharded ? static_cast<std::size_t>(ctx_.rank) * u.layout.shard : 0);
    return write_block(dst, at * es, src + (b - first_elem) * es, (e - b) * es);
  };
  // A frozen unit has no master: its kMaster is the compute-dtype parameters alone.
  if (!u.frozen() || which != TensorState::kMaster) {
    TZ_ASSIGN_OR_RETURN(BlockId block, state_block(u, which));
    TZ_RETURN_IF_ERROR(
        write_part(block, reinterpret_cast<const std::byte*>(values.data()), 4, ctx_.stage != 0));
  }
  if (which != TensorState::kMaster) return Status::ok();
  // The compute-dtype parameters follow the master (a persistent gathered copy is refreshed at
  // its next gather).
  coordinator_.invalidate(id);
  frozen_unflushed_ = frozen_unflushed_ || u.frozen();
  const std::size_t es = dtype_size(ctx_.compute_dtype);
  std::vector<std::byte> converted(values.size() * es);
  host_cast_from_f32(values.data(), converted.data(), ctx_.compute_dtype, values.size());
  return write_part(u.param, converted.data(), es, ctx_.stage == 3);
}

}  // namespace tz::zero::impl
