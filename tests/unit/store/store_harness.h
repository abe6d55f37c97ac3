// A store over HostDevice, a small pinned pool and a swap file in a temporary directory (optionally
// behind the seeded fault-injecting engine), shared by the store's unit, policy and fault tests,
// the I/O matrix the round-trip and property tests sweep, and a deadline for scenarios that could
// hang.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cpu/pinned_pool.h"
#include "gpu/host_device.h"
#include "nvme/fault_engine.h"
#include "nvme/io_engine.h"
#include "nvme/swap_space.h"
#include "store/stack.h"
#include "store/store.h"

namespace tz::store::testing {

// Runs `body` on a thread; if it has not finished after `seconds`, the scenario hangs: report it
// and end the process (a hung thread cannot be joined), so ctest never blocks.
inline void within_deadline(const char* what, int seconds, std::function<void()> body) {
  std::packaged_task<void()> task(std::move(body));
  std::future<void> done = task.get_future();
  std::thread runner(std::move(task));
  if (done.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: %s did not finish within %d s (hang)\n", what, seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }
  runner.join();
  done.get();
}

class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TZ_TEST_DIR");
    std::string tmpl = std::string(base ? base : ::testing::TempDir().c_str());
    if (tmpl.empty() || tmpl.back() != '/') tmpl += '/';
    tmpl += "tz-store-test-XXXXXX";
    char* p = mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr) << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct HarnessOptions {
  StoreOptions store;
  std::uint64_t swap_bytes = 64ull << 20;
  std::optional<nvme::FaultOptions> faults;  // wrap the engine in FaultEngine
  nvme::IoEngineKind engine = nvme::IoEngineKind::kPsync;
  // Wraps the engine (after the FaultEngine, if any): a test's own fault injection.
  std::function<std::unique_ptr<nvme::IoEngine>(std::unique_ptr<nvme::IoEngine>)> wrap_engine;
  // The pinned pool's size, in one slab; default: twice the host budget plus staging and 4 MiB.
  std::optional<std::uint64_t> pool_budget;
};

// One combination of the I/O matrix: the engine, whether the pool's slabs are registered with it
// (io_uring fixed buffers; the other engines ignore registration, so they run it once) and how
// reads and writes share the disk.
struct IoCase {
  nvme::IoEngineKind engine = nvme::IoEngineKind::kPsync;
  bool registered = true;
  IoGrouping grouping = IoGrouping::kMixed;
};

inline std::vector<IoCase> io_cases() {
  std::vector<IoCase> out;
  for (IoGrouping g : {IoGrouping::kMixed, IoGrouping::kGrouped}) {
    out.push_back({nvme::IoEngineKind::kIoUring, true, g});
    out.push_back({nvme::IoEngineKind::kIoUring, false, g});
    out.push_back({nvme::IoEngineKind::kLibaio, true, g});
    out.push_back({nvme::IoEngineKind::kPsync, true, g});
  }
  return out;
}

// "io_uring_registered_grouped", "libaio_mixed": a GoogleTest name that says the combination.
inline std::string io_case_name(const IoCase& c) {
  std::string n = nvme::io_engine_name(c.engine);
  if (c.engine == nvme::IoEngineKind::kIoUring) n += c.registered ? "_registered" : "_unregistered";
  return n + (c.grouping == IoGrouping::kGrouped ? "_grouped" : "_mixed");
}

inline std::string io_param_name(const ::testing::TestParamInfo<IoCase>& p) {
  return io_case_name(p.param);
}

inline void apply_io_case(const IoCase& c, HarnessOptions& o) {
  o.engine = c.engine;
  o.store.register_pool_buffers = c.registered;
  o.store.io_grouping = c.grouping;
}

// Holds every write request while the gate is closed (they count as in flight) and hands them to
// the inner engine once it opens: a disk whose writes are slow for as long as the test says.
class WriteGateEngine final : public nvme::IoEngine {
 public:
  WriteGateEngine(std::unique_ptr<nvme::IoEngine> inner, std::shared_ptr<std::atomic<bool>> open)
      : inner_(std::move(inner)), open_(std::move(open)) {}
  nvme::IoEngineKind kind() const override { return inner_->kind(); }
  std::uint32_t capacity() const override { return inner_->capacity(); }
  std::uint32_t in_flight() const override {
    return inner_->in_flight() + static_cast<std::uint32_t>(held_.size());
  }
  Result<int> add_file(int fd) override { return inner_->add_file(fd); }
  Status register_buffers(std::span<const iovec> regions) override {
    return inner_->register_buffers(regions);
  }
  bool buffers_registered() const override { return inner_->buffers_registered(); }
  Status submit(std::span<const nvme::IoRequest> requests) override {
    for (const nvme::IoRequest& r : requests) {
      if (r.op == nvme::IoOp::kWrite && !open_->load()) {
        held_.push_back(r);
        ++held_total_;
      } else {
        TZ_RETURN_IF_ERROR(inner_->submit(std::span<const nvme::IoRequest>(&r, 1)));
      }
    }
    return Status::ok();
  }
  Status flush() override { return inner_->flush(); }
  Result<std::size_t> reap(std::span<nvme::IoCompletion> out, std::size_t min_complete) override {
    if (open_->load() && !held_.empty()) {
      std::vector<nvme::IoRequest> go(held_.begin(), held_.end());
      held_.clear();
      TZ_RETURN_IF_ERROR(inner_->submit(go));
    }
    // Never block for a held request: it completes only once the gate opens.
    const std::size_t need = held_.empty() ? min_complete : 0;
    if (!held_.empty() && inner_->in_flight() == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      return std::size_t{0};
    }
    return inner_->reap(out, need);
  }
  // Read by the test thread while the mover submits.
  std::uint64_t held_total() const { return held_total_.load(); }

 private:
  std::unique_ptr<nvme::IoEngine> inner_;
  std::shared_ptr<std::atomic<bool>> open_;
  std::deque<nvme::IoRequest> held_;
  std::atomic<std::uint64_t> held_total_{0};
};

// Wraps the store's engine in a WriteGateEngine that holds writes while *open is false; *gate
// points to it once the store's mover has made the engine.
inline void gate_writes(HarnessOptions& o, std::shared_ptr<std::atomic<bool>> open,
                        WriteGateEngine** gate) {
  o.wrap_engine = [open,
                   gate](std::unique_ptr<nvme::IoEngine> e) -> std::unique_ptr<nvme::IoEngine> {
    auto g = std::make_unique<WriteGateEngine>(std::move(e), open);
    *gate = g.get();
    return g;
  };
}

struct Harness {
  ScratchDir dir;
  std::unique_ptr<gpu::HostDevice> device;
  std::unique_ptr<PinnedPool> pool;
  std::unique_ptr<Store> store;
  nvme::FaultEngine* fault = nullptr;  // owned by the swap space inside the store
  std::vector<std::string> swap_files;
  std::uint64_t pool_budget = 0;

  // Builds everything; failures are test failures.
  void init(const HarnessOptions& o) {
    auto dev = gpu::HostDevice::create(o.store.device_budget_bytes);
    ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
    device = std::move(dev).value();
    StackDescription sd;
    // Host budget + staging + room for fragmentation (the store enforces the host budget).
    pool_budget = o.pool_budget.value_or(o.store.host_budget_bytes * 2 +
                                         o.store.staging_buffers * o.store.chunk_bytes +
                                         (4ull << 20));
    sd.pool.budget_bytes = pool_budget;
    // A pool of a given size is one slab of that size, as the engine makes it (fragmentation
    // then shows); the default is one roomy slab.
    sd.pool.slab_bytes = o.pool_budget ? (pool_budget + 4095) / 4096 * 4096 : 32ull << 20;
    sd.pool.huge_pages = false;
    sd.pool.prefault = false;
    sd.pool.lock = MemlockPolicy::kOff;
    sd.register_pool = false;
    sd.store = o.store;
    SwapDescription& swap = sd.swap.emplace();
    swap.swap.paths = {dir.path()};
    swap.swap.bytes_per_path = o.swap_bytes;
    swap.swap.stripe_bytes = 1ull << 20;
    swap.queue_options.block_bytes = 1ull << 20;
    swap.queue_options.depth_per_file = 16;
    swap.engine_kind = o.engine;
    swap.engine_options.queue_depth = 16;
    // The engine is made inside the store's swap factory, on its mover thread: an io_uring ring
    // (SINGLE_ISSUER) refuses registrations from any other thread (EEXIST).
    auto hooks = std::make_shared<IoHooks>();
    hooks->faults = o.faults;
    hooks->on_fault_engine = [this](nvme::FaultEngine& f) { fault = &f; };
    hooks->wrap_io_engine = o.wrap_engine;
    hooks->on_swap = [this](const nvme::SwapSpace& sp) { swap_files = sp.file_paths(); };
    sd.io_hooks = hooks;
    auto s = build_stack(sd, *device);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    pool = std::move(s->pool);
    store = std::move(s->store);
  }

  // Tears down in order and reports leaks: live pinned buffers or device allocations.
  void finish() {
    store.reset();
    if (pool) {
      EXPECT_EQ(pool->stats().live_buffers, 0u) << "pinned buffers leaked";
      EXPECT_EQ(pool->stats().in_use_bytes, 0u);
    }
    if (device) {
      EXPECT_EQ(device->memory_stats().live_allocations, 0u) << "device buffers leaked";
      EXPECT_EQ(device->memory_stats().in_use_bytes, 0u);
    }
    pool.reset();
    device.reset();
  }
};

}  // namespace tz::store::testing
