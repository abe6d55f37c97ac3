// The tiered stack built from its description (stack.h).
#include "store/stack.h"

#include <utility>

#include "core/assert.h"
#include "gpu/pinned_registration.h"
#include "nvme/nvme_config.h"
#include "nvme/probe.h"

namespace tz::store {

SwapDescription swap_description(const Config& config, const std::vector<std::string>& paths) {
  const nvme::NvmeSettings ns = nvme::nvme_settings(config, paths.size());
  SwapDescription d;
  d.swap.paths = paths;
  d.swap.keep_files = ns.keep_swap_files;
  d.engine_name = ns.engine;
  d.engine_options = ns.engine_options;
  d.queue_options = ns.queue_options;
  return d;
}

std::uint64_t swap_block_bytes(const Config& config) {
  return nvme::nvme_settings(config).queue_options.block_bytes;
}

std::uint64_t swap_queue_requests(const Config& config, std::size_t files) {
  return nvme::nvme_settings(config, files).engine_options.queue_depth;
}

std::uint64_t default_swap_stripe_bytes() { return nvme::SwapOptions{}.stripe_bytes; }

namespace {

// The swap factory: the engine of `kind`, the hooks around it, the swap space over it.
Store::SwapFactory swap_factory(const nvme::SwapOptions& swap, nvme::IoEngineKind kind,
                                const nvme::IoEngineOptions& engine_options,
                                const nvme::IoQueueOptions& queue_options,
                                std::shared_ptr<const IoHooks> hooks) {
  return [swap, kind, engine_options, queue_options,
          hooks = std::move(hooks)]() -> Result<std::unique_ptr<nvme::SwapSpace>> {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<nvme::IoEngine> engine,
                        nvme::make_io_engine(kind, engine_options));
    if (hooks && hooks->faults) {
      auto faulty = std::make_unique<nvme::FaultEngine>(std::move(engine), *hooks->faults);
      if (hooks->on_fault_engine) hooks->on_fault_engine(*faulty);
      engine = std::move(faulty);
    }
    if (hooks && hooks->wrap_io_engine) engine = hooks->wrap_io_engine(std::move(engine));
    TZ_ASSERT(engine != nullptr, "an I/O engine wrapper returned no engine");
    TZ_ASSIGN_OR_RETURN(nvme::SwapSpace space,
                        nvme::SwapSpace::create(swap, std::move(engine), queue_options));
    auto out = std::make_unique<nvme::SwapSpace>(std::move(space));
    if (hooks && hooks->on_swap) hooks->on_swap(*out);
    return out;
  };
}

}  // namespace

Result<TieredStack> prepare_stack(const StackDescription& description, gpu::Device& device) {
  TieredStack stack;
  TZ_ASSIGN_OR_RETURN(PinnedPool pool, PinnedPool::create(description.pool));
  stack.pool = std::make_unique<PinnedPool>(std::move(pool));
  if (description.register_pool) {
    TZ_RETURN_IF_ERROR(gpu::register_pinned_pool(device, *stack.pool));
  }
  if (!description.swap) return stack;
  const SwapDescription& sd = *description.swap;
  TZ_ASSERT(!sd.swap.paths.empty(), "a swap description needs at least one path");
  nvme::SwapOptions swap = sd.swap;
  nvme::IoEngineKind kind;
  if (sd.engine_kind) {
    kind = *sd.engine_kind;
  } else {
    TZ_ASSIGN_OR_RETURN(nvme::EngineChoice choice,
                        nvme::choose_io_engine(sd.engine_name, sd.swap.paths));
    kind = choice.kind;
    swap.direct = choice.direct ? nvme::DirectMode::kPrefer : nvme::DirectMode::kOff;
  }
  stack.io_engine = nvme::io_engine_name(kind);
  stack.make_swap =
      swap_factory(swap, kind, sd.engine_options, sd.queue_options, description.io_hooks);
  return stack;
}

Status open_store(TieredStack& stack, const StoreOptions& options, gpu::Device& device) {
  TZ_ASSERT(stack.pool != nullptr, "open_store needs a prepared stack");
  TZ_ASSERT(stack.store == nullptr, "open_store called twice on one stack");
  TZ_ASSIGN_OR_RETURN(stack.store, Store::create(options, device, *stack.pool, stack.make_swap));
  return Status::ok();
}

Result<TieredStack> build_stack(const StackDescription& description, gpu::Device& device) {
  TZ_ASSIGN_OR_RETURN(TieredStack stack, prepare_stack(description, device));
  TZ_RETURN_IF_ERROR(open_store(stack, description.store, device));
  return stack;
}

}  // namespace tz::store
