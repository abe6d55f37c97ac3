// HostDevice: the Device interface on the CPU, the real backend of machines without a GPU. Its
// pool is host memory under a byte budget (standing in for HBM), each stream is one worker thread
// that runs its operations in order, events and host callbacks behave as on CUDA, copies are
// memcpy. Device pointers are host pointers, so host code may also touch them directly once the
// work that writes them is known to be complete.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/busy_union.h"
#include "gpu/device.h"

namespace tz::gpu {

class HostDevice;

// One ordered worker thread. Its queue holds at most kMaxQueued operations; enqueueing into a
// full queue blocks until the worker catches up (the bound every queue needs).
class HostStream final : public Stream {
 public:
  static constexpr std::size_t kMaxQueued = 4096;

  // What a task does: work (a kernel, a copy, a host callback) counts in busy_seconds() and in
  // the stream's BusyUnion; a sync task (an event's record, a wait for another stream's event)
  // only orders work and may block for as long as the other stream runs, so it counts in neither.
  enum class TaskKind : std::uint8_t { kWork, kSync };

  // Starts the worker thread; fails with kUnavailable when the thread cannot be created. `cores`
  // (may be null): the tracker the stream's work tasks enter while they run (the compute
  // stream's: BusyUnion::host_cores(), core/busy_union.h).
  static Result<std::unique_ptr<HostStream>> create(HostDevice* device, std::string name,
                                                    BusyUnion* cores = nullptr);
  // Waits for the enqueued work, then stops the worker.
  ~HostStream() override;

  Device& device() override;
  const std::string& name() const override { return name_; }
  Status synchronize() override;
  Status wait(const Event& event) override;
  void* native_handle() override { return nullptr; }
  // The time spent in work tasks (TaskKind::kWork); waits on other streams' events are not work.
  double busy_seconds() const override { return static_cast<double>(busy_ns_.load()) * 1e-9; }

  // Appends `task` (labelled `op` in the trace); it runs after every task enqueued before it.
  void enqueue(const char* op, std::function<void()> task, TaskKind kind = TaskKind::kWork);

 private:
  HostStream(HostDevice* device, std::string name, BusyUnion* cores)
      : device_(device), name_(std::move(name)), cores_(cores) {}
  void run();

  HostDevice* device_;
  std::string name_;
  BusyUnion* cores_;  // null: the stream's work is tracked by busy_ns_ only
  std::mutex mu_;
  std::condition_variable work_cv_;   // the worker waits for tasks
  std::condition_variable space_cv_;  // enqueue waits for room
  std::condition_variable done_cv_;   // synchronize waits for completions
  struct Task {
    const char* op;
    std::function<void()> fn;
    TaskKind kind;
  };
  std::deque<Task> queue_;       // guarded by mu_
  std::uint64_t enqueued_ = 0;   // guarded by mu_
  std::uint64_t completed_ = 0;  // guarded by mu_
  bool stopping_ = false;        // guarded by mu_
  std::atomic<std::uint64_t> busy_ns_{0};  // time spent in work tasks, written by the worker
  std::thread worker_;
};

class HostDevice final : public Device {
 public:
  // A device whose pool may hold at most `budget_bytes` at once. Starts the three default
  // streams' threads. In debug builds, or with TZ_DEVICE_POISON=1, new and freed device memory
  // is filled with 0xa5 so that reads of uninitialized or freed memory show up loudly.
  static Result<std::unique_ptr<HostDevice>> create(std::uint64_t budget_bytes);
  bool poisons_memory() const { return poison_; }
  // Waits for all streams, then stops them. Buffers must be gone (asserted).
  ~HostDevice() override;

  DeviceKind kind() const override { return DeviceKind::kHost; }
  std::string name() const override { return "host (HostDevice)"; }
  bool host_accessible() const override { return host_accessible_; }
  // Makes this device report host_accessible() == false, as a GPU does, so that the paths code
  // takes for devices without host access (a CudaDevice's) run and are tested on the CPU. The
  // memory stays host memory; only what the device claims changes. Call before first use.
  void claim_no_host_access() { host_accessible_ = false; }

  Result<std::unique_ptr<Stream>> create_stream(std::string name) override;
  Result<std::unique_ptr<Event>> create_event() override;
  Status synchronize() override;

  Status register_host_memory(void* ptr, std::size_t bytes) override;
  Status unregister_host_memory(void* ptr) override;
  // Number of registered host ranges (tests check that pool slabs were registered).
  std::size_t registered_host_ranges() const;

  Status copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                    Stream& stream) override;
  Status memset_async(void* dst, int value, std::size_t bytes, Stream& stream) override;
  Status host_callback(Stream& stream, std::function<void()> fn) override;
  Status fill(void* dst, DType dtype, std::size_t n, float value, Stream& stream) override;
  Status cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
              Stream& stream) override;
  Status scale(void* data, DType dtype, std::size_t n, float factor, Stream& stream) override;
  Status sum_squares(const void* src, DType dtype, std::size_t n, NormAccumulator* acc,
                     Stream& stream) override;
  Status optimizer_step(const OptimizerStepArgs& args, Stream& stream) override;

  // Fault injection, for tests of the callers' error paths (a GPU fails these calls when it is
  // lost or a launch is refused): after `after` more calls of the kinds in `ops` (a mask of
  // DeviceFault bits) succeed, the next `count` of them fail with kInternal and enqueue nothing.
  // A new call replaces the previous plan; count 0 switches injection off.
  enum DeviceFault : unsigned {
    kFaultCopy = 1u << 0,      // copy_async
    kFaultMemset = 1u << 1,    // memset_async
    kFaultCallback = 1u << 2,  // host_callback
    kFaultRecord = 1u << 3,    // Event::record
    kFaultWait = 1u << 4,      // Stream::wait
  };
  void inject_failures(unsigned ops, std::uint64_t after, std::uint64_t count);
  std::uint64_t injected_failures() const;  // calls failed so far by injection
  // The injection check of one call of kind `op` (used by this backend's streams and events).
  Status check_fault(DeviceFault op, const char* what);

  // A test's observer of calls into this device: fn(what) runs on the calling thread at the
  // start of every allocation and release, event creation, enqueue (copy, memset, callback),
  // event record, stream wait and synchronize (of the device, a stream or an event), e.g. to
  // check what the caller holds while it calls (the store makes no device call under its lock).
  // Set it while no other thread uses the device; an empty function removes it.
  void set_call_observer(std::function<void(const char* what)> fn) { observer_ = std::move(fn); }
  void observe_call(const char* what) const {
    if (observer_) observer_(what);
  }

 private:
  friend class HostStream;
  explicit HostDevice(std::uint64_t budget_bytes) : Device(budget_bytes) {}
  Result<void*> allocate_raw(std::size_t bytes) override;
  void free_raw(void* ptr, std::size_t bytes) override;
  HostStream& host_stream(Stream& stream);
  // Streams alive on this device (default ones and created ones), for synchronize().
  void add_stream(HostStream* stream);
  void remove_stream(HostStream* stream);

  bool poison_ = false;
  bool host_accessible_ = true;
  std::function<void(const char*)> observer_;
  // Freed buffers kept by (rounded) size for the next allocation of that size, as CUDA's caching
  // allocators keep them: glibc returns a buffer above its mmap threshold (32 MiB at most) to the
  // kernel on free, and the next one is faulted in again a page at a time (the engine's per-step
  // gradient buffers cost ~24k faults per step on a 14.6M-parameter model). At most
  // cache_limit_ bytes; a freed buffer that does not fit goes back to the system. A miss first
  // frees kept buffers until live + kept bytes are within the peak of live bytes (memory_stats),
  // so the free lists never hold memory the device's peak (and so the engine's plan) does not.
  std::mutex cache_mu_;
  std::multimap<std::size_t, void*> cache_;  // guarded by cache_mu_
  std::size_t cache_bytes_ = 0;              // guarded by cache_mu_
  std::size_t cache_limit_ = 0;
  void release_cache();
  mutable std::mutex fault_mu_;
  unsigned fault_ops_ = 0;              // guarded by fault_mu_
  std::uint64_t fault_after_ = 0;       // guarded by fault_mu_
  std::uint64_t fault_count_ = 0;       // guarded by fault_mu_
  std::uint64_t fault_injected_ = 0;    // guarded by fault_mu_
  mutable std::mutex mu_;
  std::map<void*, std::size_t> registered_;  // guarded by mu_
  std::vector<HostStream*> streams_;          // guarded by mu_
};

}  // namespace tz::gpu
