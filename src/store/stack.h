// The tiered stack (DESIGN.md, "Layers": one function in store/ builds it): the pinned host pool
// and its registration with the device, the I/O engine chosen for the swap paths, the optional
// fault-injection wrapper around it, the swap space and the store over all of them. The engine,
// the benches and the tests describe what they want (StackDescription) and get it built the same
// way; zero/ never names an nvme/ type.
//
//   StackDescription d;  d.pool = ...; d.store = ...; d.swap = swap_description(config, paths);
//   TZ_ASSIGN_OR_RETURN(TieredStack stack, build_stack(d, device));
//
// Benches that measure the disk before the store exists call prepare_stack() (pool + swap
// factory), use the factory for a swap space of their own, then open_store().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/status.h"
#include "cpu/pinned_pool.h"
#include "gpu/device.h"
#include "nvme/fault_engine.h"
#include "nvme/io_engine.h"
#include "nvme/io_queue.h"
#include "nvme/swap_space.h"
#include "store/store.h"

namespace tz::store {

// Wraps the swap space's I/O engine (a test's own fault injection); runs on the store's mover
// thread, where the engine is made.
using IoEngineWrapper =
    std::function<std::unique_ptr<nvme::IoEngine>(std::unique_ptr<nvme::IoEngine>)>;

// Test hooks on the swap space's I/O: seeded faults, a wrapper applied after them, and observers
// of what was made. Every hook runs on the thread that makes the swap space (the store's mover).
struct IoHooks {
  std::optional<nvme::FaultOptions> faults;  // wrap the engine in nvme::FaultEngine
  std::function<void(nvme::FaultEngine&)> on_fault_engine;
  IoEngineWrapper wrap_io_engine;  // applied after the FaultEngine, if any
  std::function<void(const nvme::SwapSpace&)> on_swap;
};

// How the NVMe tier is made.
struct SwapDescription {
  // Paths, bytes per path, stripe, keep_files. `direct` is replaced by the probe's verdict when
  // the engine is chosen by name (engine_kind empty).
  nvme::SwapOptions swap;
  // The engine: a kind (no probe), or a name for nvme::choose_io_engine over swap.paths ("auto"
  // probes io_uring, libaio, psync), chosen when the stack is prepared, on the calling thread.
  std::optional<nvme::IoEngineKind> engine_kind;
  std::string engine_name = "auto";
  nvme::IoEngineOptions engine_options;
  nvme::IoQueueOptions queue_options;
};

// The config's NVMe settings (aio.block_size, aio.queue_depth, tierzero.io_engine, sqpoll,
// keep_swap_files) for swap files on `paths`; the caller sizes swap.bytes_per_path.
SwapDescription swap_description(const Config& config, const std::vector<std::string>& paths);
// The swap queue's block size the config asks for (aio.block_size rounded up to 4 KiB).
std::uint64_t swap_block_bytes(const Config& config);
// The requests the swap engine holds in flight over `files` swap files (aio.queue_depth per file).
std::uint64_t swap_queue_requests(const Config& config, std::size_t files);
// The swap space's default stripe (nvme::SwapOptions).
std::uint64_t default_swap_stripe_bytes();

struct StackDescription {
  PinnedPoolOptions pool;
  bool register_pool = true;  // register the pool's slabs with the device (fast async copies)
  StoreOptions store;
  std::optional<SwapDescription> swap;  // empty: no NVMe tier
  std::shared_ptr<const IoHooks> io_hooks;  // empty: no hooks
};

// What build_stack makes. Members are destroyed store first, then the pool it allocates from.
struct TieredStack {
  std::unique_ptr<PinnedPool> pool;
  Store::SwapFactory make_swap;                  // empty without a swap description
  std::string io_engine = "none";                // the engine's name, for reports
  std::unique_ptr<Store> store;                  // empty until open_store
};

// The pool (registered with `device` when asked) and the swap factory, no store yet. Errors: the
// pool's, the registration's, choose_io_engine's (an unknown engine name).
Result<TieredStack> prepare_stack(const StackDescription& description, gpu::Device& device);
// The store over a prepared stack, with `options` (the description's, possibly adjusted after
// measuring). `device` must outlive the stack. Errors: Store::create's.
Status open_store(TieredStack& stack, const StoreOptions& options, gpu::Device& device);
// prepare_stack + open_store with the description's store options.
Result<TieredStack> build_stack(const StackDescription& description, gpu::Device& device);

}  // namespace tz::store
