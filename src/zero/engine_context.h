// What the engine's components share (engine_impl.h): one registered unit (Unit, the blocks and
// layout every component reads), the step's counters they add to and accounting reads, the
// device buffers freed once the compute stream is past them, and EngineContext, the references
// and settings (config, device, comm, store, placements, units, host staging) passed to each
// component explicitly. Private to zero/. The host-side math the reducer and the optimizer driver
// share (fp32 accumulation, casts, the exact scalar encoding of the norm's all-reduce) sits here
// too.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/assert.h"
#include "core/config.h"
#include "core/dtype.h"
#include "cpu/pinned_pool.h"
#include "gpu/device.h"
#include "store/store.h"
#include "zero/engine.h"
#include "zero/layout.h"
#include "zero/plan.h"

namespace tz::zero::impl {
using store::Access;
using store::BlockId;
using store::Lease;
using store::Tier;
using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// fp32 += a 16-bit or fp32 gradient on the host, the same IEEE sums as device_accumulate_coeffs.
// `zeroed`: the accumulator holds zeros and is not read (its bytes may be anything): 0 + g, the
// same bits as the sum with a zeroed accumulator (-0 becomes +0 as it does there).
// A 16-bit accumulator (gradient_accumulator_dtype: one micro-batch a step) is only written
// zeroed, from a gradient of its own dtype: 0 + g is g's value, so it stores g with -0 made +0,
// the value the fp32 accumulator holds (NaN payloads aside).
inline void host_accumulate(void* acc, DType acc_dtype, const void* grad, DType dtype,
                            std::size_t n, bool zeroed = false) {
  if (acc_dtype != DType::kF32) {
    TZ_ASSERT(zeroed && acc_dtype == dtype, "a 16-bit accumulator holds one gradient of its dtype");
    static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2);
    const auto* g = static_cast<const std::uint16_t*>(grad);
    auto* a = static_cast<std::uint16_t*>(acc);
    for (std::size_t i = 0; i < n; ++i) a[i] = g[i] == 0x8000u ? std::uint16_t{0} : g[i];
    return;
  }
  auto* acc32 = static_cast<float*>(acc);
  auto run = [&](auto to_f32, const auto* g) {
    if (zeroed) {
      for (std::size_t i = 0; i < n; ++i) acc32[i] = 0.0f + to_f32(g[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i) acc32[i] = acc32[i] + to_f32(g[i]);
    }
  };
  switch (dtype) {
    case DType::kF32:
      run([](float x) { return x; }, static_cast<const float*>(grad));
      return;
    case DType::kBF16:
      run([](bf16 x) { return bf16_to_f32(x); }, static_cast<const bf16*>(grad));
      return;
    case DType::kF16:
      run([](fp16 x) { return fp16_to_f32(x); }, static_cast<const fp16*>(grad));
      return;
  }
}

// fp32 -> dtype on the host (round to nearest even, as Device::cast).
inline void host_cast_from_f32(const float* src, void* dst, DType dtype, std::size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      auto* d = static_cast<bf16*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<fp16*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_fp16(src[i]);
      return;
    }
  }
}

// A collective scalar reduction that is exact and identical on every rank: rank r writes its
// values, each split into four 16-bit pieces stored as small integers in fp32, into slot r of an
// otherwise zero buffer; an fp32 sum all-reduce of integers below 2^24 with zeros is exact, so
// every rank decodes every rank's exact values and combines them in rank order.
inline constexpr std::size_t kScalarPieces = 4;
inline void encode_u64(std::uint64_t x, float* out) {
  for (std::size_t i = 0; i < kScalarPieces; ++i) {
    out[i] = static_cast<float>((x >> (16 * i)) & 0xffffu);
  }
}
inline std::uint64_t decode_u64(const float* in) {
  std::uint64_t x = 0;
  for (std::size_t i = 0; i < kScalarPieces; ++i) {
    x |= static_cast<std::uint64_t>(in[i]) << (16 * i);
  }
  return x;
}

// The block id of a frozen unit's absent master, states and gradient accumulator.
inline constexpr BlockId kNoBlock = std::numeric_limits<BlockId>::max();

// One registered unit: its spec, layout and store blocks. What a component keeps per unit
// (gathered buffers, gradient buffers, snapshots, pending updates) lives in that component.
struct Unit {
  UnitId id = 0;  // its index in EngineContext::units
  UnitSpec spec;
  UnitLayout layout;
  // Elements of master and states on this rank (P in stage 0, else S; 0 for a frozen unit).
  std::size_t opt_elems = 0;
  BlockId param = 0;  // stage 3: this rank's shard; stages 0-2: the full unit
  BlockId master = kNoBlock;
  BlockId state[2] = {kNoBlock, kNoBlock};
  BlockId grad_acc = kNoBlock;  // reduced gradient shard, accumulated over micro-batches (in
                                // EngineContext::grad_dtype)
  // Stage 3, numel below stage3_param_persistence_threshold: gathered once per step and kept
  // (the plan decides, at finalize).
  bool persistent = false;
  bool frozen() const { return spec.frozen; }
};

// This step's counters: the components add to them, Accounting reads them into the step report
// and starts them again.
struct StepCounters {
  double stall_gather_s = 0;     // the parameter coordinator's gathers
  double stall_reduce_s = 0;     // the gradient reducer's reduces
  double optimizer_s = 0;        // CPU optimizer and host gradient accumulation
  double early_update_s = 0;     // eager: the early updates (inside reduce)
  std::uint64_t copy_bytes = 0;  // the engine's own host<->device copies
  // exact with the optimizer on NVMe: the update's master and states loaded into the host during
  // the backward (ExactOverlap::on_reduced's read-ahead).
  std::uint64_t state_read_ahead_bytes = 0;
  // Per unit: all-gathers of its updated parameters (stages 1-2; stage 0: of its reduced
  // gradient), for Accounting's comm formula.
  std::vector<std::uint64_t> update_gathers;
};

// Device buffers freed only after the compute stream's work so far (an event), so release()
// and reduce() never block; an allocation that does not fit waits for them first.
class DeviceBuffers {
 public:
  explicit DeviceBuffers(gpu::Device& device) : device_(device) {}

  // The device tier's plan and the store whose device room counts as taken (set at finalize,
  // before the first allocate).
  void set_limits(const store::Store* store, std::uint64_t device_plan_bytes) {
    store_ = store;
    device_plan_bytes_ = device_plan_bytes;
  }

  // The compute stream may run far behind the caller (HostDevice, a queued GPU), so buffers whose
  // free waits for it can pile up: an allocation that would take the device past the plan (or that
  // the device refuses) first waits for them, so the peak stays within the plan, not the budget.
  // The store's device room not yet filled counts as taken: its cache of offloaded shards loads
  // ahead on its own threads, so deferred frees that filled that room would let its next load
  // pass the plan (stage 3 with offloaded parameters).
  Result<gpu::DeviceBuffer> allocate(std::size_t bytes);

  // `buffer` freed once the compute stream's work enqueued so far is done.
  Status defer_free(gpu::DeviceBuffer buffer);

  // Frees what the stream is past (all: waits for every pending free).
  void reap(bool all);

  // Drops every pending free without waiting (the engine's destructor, after the device is idle).
  void clear() { deferred_.clear(); }

 private:
  struct DeferredFree {
    std::unique_ptr<gpu::Event> done;
    gpu::DeviceBuffer buffer;
  };
  // Device bytes the store may still allocate: its device budget less what it holds (copies in
  // use and its cache of freed buffers).
  std::uint64_t store_device_room() const;

  gpu::Device& device_;
  const store::Store* store_ = nullptr;
  std::uint64_t device_plan_bytes_ = 0;
  std::deque<DeferredFree> deferred_;
};

// The references and settings every component of one rank's engine shares. EngineImpl owns it
// and its store; init() sets the settings, register_unit() the units, finalize() the store, the
// staging buffers and the limits, and nothing changes them afterwards but the per-step counters.
struct EngineContext {
  EngineContext(const Config& config_in, gpu::Device& device_in, comm::Comm& comm_in)
      : config(config_in),
        device(device_in),
        comm(comm_in),
        rank(comm_in.rank()),
        world(comm_in.world_size()),
        buffers(device_in) {}
  EngineContext(const EngineContext&) = delete;
  EngineContext& operator=(const EngineContext&) = delete;

  const Config& config;
  gpu::Device& device;
  comm::Comm& comm;
  const int rank;
  const int world;
  // init()
  int stage = 0;
  DType compute_dtype = DType::kF32;
  Placement opt_place = Placement::kDevice;
  Placement param_place = Placement::kDevice;
  Placement grad_place = Placement::kDevice;
  DType grad_dtype = DType::kF32;  // the gradient accumulators' (MemoryPlan::grad_dtype)
  int states = 0;  // optimizer state arrays per unit (Adam 2, SGD with momentum 1)
  // register_unit(); stable addresses (views point at the specs)
  std::deque<Unit> units;
  // finalize()
  store::Store* store = nullptr;
  PinnedBuffer stage16;  // host staging: one unit in 16 bits
  PinnedBuffer stage32;  // and one in fp32
  DeviceBuffers buffers;
  StepCounters counters;

  int accumulation_steps() const { return static_cast<int>(config.gradient_accumulation_steps); }
  // A trainable unit's fp32 master and optimizer states: opt_elems * 4 * (1 + states) bytes (the
  // plan's UnitBytes::optimizer).
  std::uint64_t optimizer_bytes(const Unit& u) const {
    return static_cast<std::uint64_t>(u.opt_elems) * 4 * (1 + static_cast<std::uint64_t>(states));
  }
  // A unit's parameter block: its shard at stage 3, the whole padded unit below, in the compute
  // dtype.
  std::uint64_t param_bytes(const Unit& u) const {
    return static_cast<std::uint64_t>(stage == 3 ? u.layout.shard : u.layout.padded) *
           dtype_size(compute_dtype);
  }
  // A trainable unit's gradient accumulator: its shard in the gradient dtype.
  std::uint64_t grad_bytes(const Unit& u) const {
    return static_cast<std::uint64_t>(u.layout.shard) * dtype_size(grad_dtype);
  }
  gpu::Stream& stream() { return device.compute_stream(); }
  Unit& unit(UnitId id) {
    TZ_ASSERT(id < units.size(), "unit id out of range");
    return units[id];
  }

  // A store pin whose error names the unit, shard and what it was for.
  Result<Lease> pin_for(const Unit& u, const char* what, BlockId block, Tier tier, Access access);

  // Zeroes the unit's gradient accumulator where the gradients live (step()'s zeroing, eager's
  // worker after the units it updated, the streamed update after reading it): on the device a
  // memset on the compute stream; in the host or NVMe tier Store::zero, which zeroes the copies
  // where they are and leaves none dirty, so a spilled accumulator's zeros never go to the disk
  // and back. The accumulator must not be pinned. `what` names the caller in errors.
  Status zero_gradient(const Unit& u, const char* what);

  // Prefixes an error with the unit and rank.
  Status with_unit(const Unit& u, const char* what, Status s) const;

  // Waits for `st` and the communicator's asynchronous errors; an error names `what` and the rank.
  Status sync(gpu::Stream& st, const std::string& what);

  // Views of the unit's tensors in a flat buffer at `base` of `dtype` elements.
  UnitViews make_views(const Unit& u, void* base, DType dtype) const;

  // The first trainable unit after units[i] in registration order, or null.
  const Unit* next_trainable(std::size_t i) const;
};

}  // namespace tz::zero::impl
