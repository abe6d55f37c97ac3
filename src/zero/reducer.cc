// The gradient reducer (reducer.h): a unit's gradient buffer, its reduce-scatter into this
// rank's shard and the fp32 accumulation over micro-batches (on the device or the host), the
// global norm and overflow count over every rank's shards, and the gradients zeroed for a step.
#include "zero/reducer.h"

#include "core/busy_union.h"
#include "zero/optimizer_args.h"

namespace tz::zero::impl {

Status GradientReducer::finalize() {
  TZ_ASSERT(states_.empty() && ctx_.store != nullptr, "reducer finalized twice or early");
  states_.resize(ctx_.units.size());
  TZ_ASSIGN_OR_RETURN(norm_acc_, ctx_.device.allocate(sizeof(gpu::NormAccumulator)));
  TZ_ASSIGN_OR_RETURN(scalars_, ctx_.device.allocate(static_cast<std::size_t>(ctx_.world) * 2 *
                                                     kScalarPieces * sizeof(float)));
  return Status::ok();
}

Result<gpu::NormAccumulator> GradientReducer::global_norm() {
  TZ_ASSIGN_OR_RETURN(gpu::NormAccumulator local, local_norm());
  return all_reduce_norm(local);
}

void GradientReducer::finish_step() {
  const int k = ctx_.accumulation_steps();
  for (const Unit& u : ctx_.units) {
    GradState& g = state(u.id);
    TZ_ASSERT(g.reduces == (u.frozen() ? 0 : k), "step with a unit not reduced k times");
    TZ_ASSERT(g.buffer.empty(), "step with a gradient buffer handed out");
    g.reduces = 0;
    g.norm = gpu::NormAccumulator{};  // the next step's sum comes with its last reduce
  }
}

void GradientReducer::clear() {
  for (GradState& g : states_) g.buffer.reset();
}

Result<UnitViews> GradientReducer::grad(Unit& u) {
  GradState& g = state(u.id);
  TZ_ASSERT(!u.frozen(), "grad of a frozen unit");
  TZ_ASSERT(g.buffer.empty(), "grad of a unit that holds a buffer");
  const std::size_t bytes = u.layout.padded * dtype_size(ctx_.compute_dtype);
  TZ_ASSIGN_OR_RETURN(g.buffer, ctx_.buffers.allocate(bytes));
  TZ_RETURN_IF_ERROR(ctx_.device.memset_async(g.buffer.data(), 0, bytes, ctx_.stream()));
  g.views = ctx_.make_views(u, g.buffer.data(), ctx_.compute_dtype);
  return g.views;
}

Result<bool> GradientReducer::reduce(Unit& u) {
  GradState& g = state(u.id);
  TZ_ASSERT(!u.frozen(), "reduce of a frozen unit");
  TZ_ASSERT(!g.buffer.empty(), "reduce of a unit that holds no gradient buffer");
  const auto t0 = Clock::now();
  gpu::Stream& st = ctx_.stream();
  const std::size_t es = dtype_size(ctx_.compute_dtype);
  const std::size_t s = u.layout.shard;
  auto* full = g.buffer.as<std::byte>();
  std::byte* mine = full + static_cast<std::size_t>(ctx_.rank) * s * es;
  // In place: rank r's reduced shard lands where its part of the full gradient was.
  TZ_RETURN_IF_ERROR(ctx_.with_unit(
      u, "reduce: reduce_scatter",
      ctx_.comm.reduce_scatter(full, mine, s, ctx_.compute_dtype, comm::ReduceOp::kSum, st)));
  if (ctx_.grad_place == Placement::kDevice) {
    TZ_ASSIGN_OR_RETURN(Lease acc,
                        ctx_.pin_for(u, "reduce", u.grad_acc, Tier::kDevice, Access::kReadWrite));
    TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "reduce", acc.wait()));
    gpu::OptimizerStepArgs a = device_accumulate_coeffs();
    a.param = static_cast<float*>(acc.data());
    a.grad = mine;
    a.grad_dtype = ctx_.compute_dtype;
    a.n = s;
    TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "reduce: accumulate", ctx_.device.optimizer_step(a, st)));
    acc.release(&st);
    TZ_RETURN_IF_ERROR(ctx_.buffers.defer_free(std::move(g.buffer)));
  } else {
    TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "reduce: copy to host",
                                      ctx_.device.copy_async(ctx_.stage16.data(), mine, s * es,
                                                             gpu::CopyKind::kDeviceToHost, st)));
    TZ_RETURN_IF_ERROR(ctx_.sync(st, "reduce '" + u.spec.name + "'"));
    ctx_.counters.copy_bytes += s * es;
    g.buffer.reset();
    // The step's first micro-batch finds the accumulator zeroed (every update zeroes it after
    // reading it), so it is written without being read: a write-only pin loads nothing, and the
    // store's trace-driven read-ahead does not fetch the old bytes back from NVMe for it (it did,
    // again and again, for every NVMe-homed accumulator between its update and this pin).
    const bool first = g.reduces == 0;
    TZ_ASSIGN_OR_RETURN(Lease acc, ctx_.pin_for(u, "reduce", u.grad_acc, Tier::kHost,
                                                first ? Access::kWrite : Access::kReadWrite));
    TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "reduce", acc.wait()));
    const auto t_acc = Clock::now();
    {
      BusyScope busy(BusyUnion::host_cores());  // the cores' busy time (Accounting::bound_terms)
      host_accumulate(acc.data(), ctx_.grad_dtype, ctx_.stage16.data(), ctx_.compute_dtype, s,
                      first);
      // The shard is final after the step's last micro-batch: its sum of squares is taken now,
      // while it is in the host cache, so the norm never reads it again (an NVMe-homed shard
      // would come back from the disk for it, between the backward and the update).
      if (g.reduces + 1 == ctx_.accumulation_steps()) {
        gpu::sum_squares_fixed_order(acc.data(), ctx_.grad_dtype, s, g.norm);
      }
    }
    ctx_.counters.optimizer_s += seconds_since(t_acc);
    acc.release();
  }
  g.views = UnitViews{};
  ++g.reduces;
  ctx_.counters.stall_reduce_s += seconds_since(t0);
  return g.reduces == ctx_.accumulation_steps();
}

Result<gpu::NormAccumulator> GradientReducer::local_norm() {
  gpu::NormAccumulator local;
  if (ctx_.grad_place != Placement::kDevice) {
    // Host shards: each one's sum, taken at its last reduce by the function every device's
    // sum_squares matches bit for bit, added in unit order as the device adds them below.
    for (const Unit& u : ctx_.units) {
      if (u.frozen()) continue;
      const gpu::NormAccumulator& n = state(u.id).norm;
      local.sum_squares += n.sum_squares;
      local.nonfinite_count += n.nonfinite_count;
    }
    return local;
  }
  gpu::Stream& st = ctx_.stream();
  TZ_RETURN_IF_ERROR(
      ctx_.device.memset_async(norm_acc_.data(), 0, sizeof(gpu::NormAccumulator), st));
  auto* dev_acc = norm_acc_.as<gpu::NormAccumulator>();
  std::vector<Lease> leases;
  for (const Unit& u : ctx_.units) {
    if (u.frozen()) continue;
    TZ_ASSIGN_OR_RETURN(Lease l, ctx_.store->pin(u.grad_acc, Tier::kDevice, Access::kRead));
    TZ_RETURN_IF_ERROR(ctx_.with_unit(u, "norm", l.wait()));
    TZ_RETURN_IF_ERROR(ctx_.device.sum_squares(l.data(), DType::kF32, u.layout.shard, dev_acc, st));
    leases.push_back(std::move(l));
  }
  TZ_RETURN_IF_ERROR(
      ctx_.device.copy_async(&local, dev_acc, sizeof(local), gpu::CopyKind::kDeviceToHost, st));
  TZ_RETURN_IF_ERROR(ctx_.sync(st, "norm"));
  for (Lease& l : leases) l.release();
  return local;
}

Result<gpu::NormAccumulator> GradientReducer::all_reduce_norm(const gpu::NormAccumulator& local) {
  const std::size_t per_rank = 2 * kScalarPieces;
  std::vector<float> buf(static_cast<std::size_t>(ctx_.world) * per_rank, 0.0f);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &local.sum_squares, sizeof(bits));
  encode_u64(bits, buf.data() + static_cast<std::size_t>(ctx_.rank) * per_rank);
  encode_u64(local.nonfinite_count,
             buf.data() + static_cast<std::size_t>(ctx_.rank) * per_rank + kScalarPieces);
  gpu::Stream& st = ctx_.stream();
  const std::size_t bytes = buf.size() * sizeof(float);
  TZ_RETURN_IF_ERROR(
      ctx_.device.copy_async(scalars_.data(), buf.data(), bytes, gpu::CopyKind::kHostToDevice, st));
  TZ_RETURN_IF_ERROR(ctx_.comm.all_reduce(scalars_.data(), scalars_.data(), buf.size(), DType::kF32,
                                          comm::ReduceOp::kSum, st));
  TZ_RETURN_IF_ERROR(
      ctx_.device.copy_async(buf.data(), scalars_.data(), bytes, gpu::CopyKind::kDeviceToHost, st));
  TZ_RETURN_IF_ERROR(ctx_.sync(st, "norm all_reduce"));
  gpu::NormAccumulator total;
  for (int r = 0; r < ctx_.world; ++r) {
    const float* slot = buf.data() + static_cast<std::size_t>(r) * per_rank;
    const std::uint64_t s = decode_u64(slot);
    double v = 0;
    std::memcpy(&v, &s, sizeof(v));
    total.sum_squares += v;
    total.nonfinite_count += decode_u64(slot + kScalarPieces);
  }
  return total;
}

Status GradientReducer::zero_gradients() {
  for (const Unit& u : ctx_.units) {
    if (!u.frozen()) TZ_RETURN_IF_ERROR(ctx_.zero_gradient(u, "zeroing the gradient"));
  }
  return Status::ok();
}

}  // namespace tz::zero::impl
