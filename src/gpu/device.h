// The Device interface: what the engine allocates on, copies to and computes on. Two backends
// implement it, CudaDevice (a real GPU) and HostDevice (the CPU standing in for one, with a
// byte-budgeted pool in place of HBM and ordered worker threads in place of streams).
//
// Semantics are CUDA's on both backends: work enqueued on one stream runs in order; work on
// different streams may run concurrently and is ordered only through events; every enqueue call
// returns at once. Pointers returned by allocate() are device pointers; host pointers passed to
// copies should be pinned (registered) memory for full bandwidth, but pageable memory works.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"
#include "gpu/optimizer_step.h"

namespace tz::gpu {

enum class DeviceKind : std::uint8_t { kHost, kCuda };
std::string_view device_kind_name(DeviceKind kind);

enum class CopyKind : std::uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };

class Device;
class Event;

// An ordered queue of device work. Owned by whoever created it (Device::create_stream) or by the
// device (its default streams). A stream must outlive the work enqueued on it; its destructor
// waits for that work.
class Stream {
 public:
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  virtual Device& device() = 0;
  virtual const std::string& name() const = 0;
  // Blocks until all work enqueued so far on this stream has completed.
  virtual Status synchronize() = 0;
  // Work enqueued on this stream after this call waits until the most recent record() of `event`
  // issued before this call has completed (an event never recorded is complete), as
  // cudaStreamWaitEvent.
  virtual Status wait(const Event& event) = 0;
  // The cudaStream_t of a CudaDevice stream; nullptr on HostDevice.
  virtual void* native_handle() = 0;
  // Seconds this stream has spent running work since it was created, where the backend can tell
  // without slowing the work down (HostDevice times its tasks; time blocked in wait() for another
  // stream's event is not work); a negative value where it cannot (CUDA: the GPU runs
  // asynchronously and the engine measures compute from the host side).
  virtual double busy_seconds() const { return -1; }

 protected:
  Stream() = default;
};

// A marker in a stream. Created by Device::create_event; owned by the caller. It may be destroyed
// while a record or a wait is still pending (the backend keeps what it needs alive).
class Event {
 public:
  virtual ~Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the work enqueued on `stream` so far; completes when that work has.
  virtual Status record(Stream& stream) = 0;
  // True when the most recent record has completed (or the event was never recorded).
  virtual Result<bool> query() = 0;
  // Blocks until the most recent record has completed.
  virtual Status synchronize() = 0;

 protected:
  Event() = default;
};

// Device memory owned by one buffer; returns to the device's pool on destruction. The caller must
// make sure no enqueued work still uses the memory when the buffer dies (synchronize the streams
// that use it, or an event recorded after the last use). The device must outlive its buffers.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t size_bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }
  // Frees the memory now (same contract as the destructor).
  void reset();

 private:
  friend class Device;
  DeviceBuffer(Device* device, void* ptr, std::size_t bytes)
      : device_(device), ptr_(ptr), bytes_(bytes) {}

  Device* device_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

struct MemoryStats {
  std::uint64_t budget_bytes = 0;
  std::uint64_t in_use_bytes = 0;
  std::uint64_t peak_bytes = 0;  // largest in_use_bytes since creation or reset_peak()
  std::uint64_t live_allocations = 0;
  std::uint64_t total_allocations = 0;
  std::uint64_t refused_allocations = 0;  // requests that would have exceeded the budget
};

// The accumulator of sum_squares, in device memory: the sum of x^2 over every finite element and
// the number of elements that were Inf or NaN (the overflow flag of mixed-precision training).
// Zero it (memset_async) before the first sum_squares of a reduction.
struct NormAccumulator {
  double sum_squares = 0;
  std::uint64_t nonfinite_count = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceKind kind() const = 0;
  // "host (HostDevice)" or "NVIDIA H100 80GB HBM3 (cuda:0)".
  virtual std::string name() const = 0;
  // True when the host may read and write device pointers directly (HostDevice).
  virtual bool host_accessible() const = 0;
  // The CUDA device ordinal of a CudaDevice (what NCCL binds to); -1 for other backends.
  virtual int cuda_ordinal() const { return -1; }

  // --- Memory -------------------------------------------------------------------------------
  // A buffer of `bytes` from the device pool. Fails with kOutOfMemory, naming the bytes asked,
  // in use and allowed, when the allocation would take the pool past its budget; never
  // over-allocates. Memory is 256-byte aligned; its contents are unspecified. bytes == 0 gives an
  // empty buffer. Thread-safe.
  Result<DeviceBuffer> allocate(std::size_t bytes);
  // Exact byte accounting of live allocations against the budget (requested bytes).
  MemoryStats memory_stats() const;
  void reset_peak();

  // --- Streams and events --------------------------------------------------------------------
  virtual Result<std::unique_ptr<Stream>> create_stream(std::string name) = 0;
  virtual Result<std::unique_ptr<Event>> create_event() = 0;
  // Streams owned by the device: compute, and one copy stream per direction.
  Stream& compute_stream() { return *compute_; }
  Stream& h2d_stream() { return *h2d_; }
  Stream& d2h_stream() { return *d2h_; }
  // Waits for all work on all streams of this device.
  virtual Status synchronize() = 0;

  // --- Host memory --------------------------------------------------------------------------
  // Page-locks [ptr, ptr+bytes) for fast asynchronous copies (cudaHostRegister). The range must
  // stay valid until unregister_host_memory(ptr). No-op bookkeeping on HostDevice.
  virtual Status register_host_memory(void* ptr, std::size_t bytes) = 0;
  virtual Status unregister_host_memory(void* ptr) = 0;

  // --- Asynchronous operations on a stream of this device -------------------------------------
  // Copies `bytes` from `src` to `dst` in stream order. Host pointers may be pinned or pageable
  // (pageable copies may be synchronous on CUDA).
  virtual Status copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                            Stream& stream) = 0;
  // Sets `bytes` of device memory to `value` (a byte).
  virtual Status memset_async(void* dst, int value, std::size_t bytes, Stream& stream) = 0;
  // Runs `fn` on a host thread once the work enqueued before it on `stream` has completed; later
  // work on the stream waits for it. `fn` must not enqueue work on this device (as in CUDA, where
  // a host function may not make CUDA calls) and must not throw. It must also not block on, or
  // take a lock held by, any thread that may be enqueueing on this device: an enqueue can block
  // until the stream's worker (the thread running `fn`) catches up (HostStream bounds its queue;
  // CUDA's launch queue is bounded too), so such a wait deadlocks. Post a completion to a
  // mailbox guarded by its own short-held mutex instead (the store's Impl::wake_mu).
  virtual Status host_callback(Stream& stream, std::function<void()> fn) = 0;

  // Typed element-wise operations; `n` counts elements of the given dtype, pointers are device
  // pointers. The per-element math is gpu/elementwise.h, shared by both backends.
  // dst[i] = value (rounded to `dtype`).
  virtual Status fill(void* dst, DType dtype, std::size_t n, float value, Stream& stream) = 0;
  // dst[i] = src[i] converted (fp32 -> 16-bit rounds to nearest even). src and dst must not
  // overlap unless they are equal and the dtypes are too.
  virtual Status cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
                      Stream& stream) = 0;
  // data[i] *= factor (computed in fp32, rounded to `dtype`).
  virtual Status scale(void* data, DType dtype, std::size_t n, float factor, Stream& stream) = 0;
  // acc->sum_squares += sum of x^2 over finite x (accumulated in fp64); acc->nonfinite_count +=
  // number of Inf/NaN elements. `acc` points to device memory.
  virtual Status sum_squares(const void* src, DType dtype, std::size_t n, NormAccumulator* acc,
                             Stream& stream) = 0;
  // One optimizer update of a shard (gpu/optimizer_step.h): the bits of cpu/optimizer_math.h's
  // per-element functors applied to every element (CUDA runs them, HostDevice the CPU
  // optimizer's SIMD kernels, which match them). kInvalidArgument when a needed buffer is null or
  // the parameter copy is not bf16/fp16.
  virtual Status optimizer_step(const OptimizerStepArgs& args, Stream& stream) = 0;

 protected:
  explicit Device(std::uint64_t budget_bytes) { stats_.budget_bytes = budget_bytes; }
  // Backend allocation of `bytes` (> 0), 256-byte aligned, or an error; and its release.
  virtual Result<void*> allocate_raw(std::size_t bytes) = 0;
  virtual void free_raw(void* ptr, std::size_t bytes) = 0;
  // Installs the device-owned streams (called once by the backend's create()).
  void set_default_streams(std::unique_ptr<Stream> compute, std::unique_ptr<Stream> h2d,
                           std::unique_ptr<Stream> d2h);
  // Destroys the device-owned streams; backends call it first thing in their destructor.
  void release_default_streams();

 private:
  friend class DeviceBuffer;
  void release(void* ptr, std::size_t bytes);

  mutable std::mutex mu_;
  MemoryStats stats_;  // guarded by mu_
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<Stream> h2d_;
  std::unique_ptr<Stream> d2h_;
};

}  // namespace tz::gpu
