// CudaDevice: the Device interface on a real GPU. Memory comes from CUDA's stream-ordered
// allocator, from a pool of the device's own (not the process-wide default pool, which cuBLAS,
// NCCL and other code share), under our byte budget; the pool keeps at most the budget cached
// across synchronizations and is trimmed and retried once when the GPU runs out. Copies run on
// dedicated non-blocking streams per direction; typed operations are the kernels of kernels.cu,
// each launched through gpu/launch_check.h. Every CUDA call goes through TZ_CUDA_CHECK. A GPU
// older than the build's oldest target is refused, naming both. Built without CUDA, only the
// factory exists and reports "no GPU".
#include <string>

#include "gpu/select.h"

#if defined(TZ_HAVE_CUDA)

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "core/log.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_kernels.h"
#include "gpu/launch_check.h"

namespace tz::gpu {
namespace {

class CudaDevice;

class CudaStream final : public Stream {
 public:
  CudaStream(Device* device, int ordinal, cudaStream_t stream, std::string name)
      : device_(device), ordinal_(ordinal), stream_(stream), name_(std::move(name)) {}
  ~CudaStream() override {
    // Best effort: a destructor cannot return the error, so it is logged.
    Status st = TZ_CUDA_CHECK(cudaSetDevice(ordinal_));
    if (st.is_ok()) st = TZ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (st.is_ok()) st = TZ_CUDA_CHECK(cudaStreamDestroy(stream_));
    if (!st.is_ok()) TZ_LOG_ERROR("destroying stream %s: %s", name_.c_str(), st.to_string().c_str());
  }
  Device& device() override { return *device_; }
  const std::string& name() const override { return name_; }
  Status synchronize() override { return TZ_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  Status wait(const Event& event) override;
  void* native_handle() override { return stream_; }
  cudaStream_t raw() const { return stream_; }

 private:
  Device* device_;
  int ordinal_;
  cudaStream_t stream_;
  std::string name_;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(Device* device, int ordinal, cudaEvent_t event)
      : device_(device), ordinal_(ordinal), event_(event) {}
  ~CudaEvent() override {
    // cudaEventDestroy may be called while the event is pending; CUDA releases it afterwards.
    Status st = TZ_CUDA_CHECK(cudaEventDestroy(event_));
    if (!st.is_ok()) TZ_LOG_ERROR("destroying event: %s", st.to_string().c_str());
  }
  Status record(Stream& stream) override {
    TZ_ASSERT(&stream.device() == device_, "event recorded on a stream of another device");
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return TZ_CUDA_CHECK(cudaEventRecord(event_, static_cast<CudaStream&>(stream).raw()));
  }
  Result<bool> query() override {
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    return TZ_CUDA_CHECK(err);
  }
  Status synchronize() override { return TZ_CUDA_CHECK(cudaEventSynchronize(event_)); }
  cudaEvent_t raw() const { return event_; }
  Device* device() const { return device_; }

 private:
  Device* device_;
  int ordinal_;
  cudaEvent_t event_;
};

Status CudaStream::wait(const Event& event) {
  const auto& cuda_event = static_cast<const CudaEvent&>(event);
  TZ_ASSERT(cuda_event.device() == device_, "stream waits on an event of another device");
  return TZ_CUDA_CHECK(cudaStreamWaitEvent(stream_, cuda_event.raw(), 0));
}

void CUDART_CB run_host_function(void* data) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(data));
  (*fn)();
}

cudaMemcpyKind to_cuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

class CudaDevice final : public Device {
 public:
  static Result<std::unique_ptr<Device>> create(int ordinal, std::uint64_t budget_bytes) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      return Status::unavailable(std::string("no GPU: ") + cudaGetErrorName(err) + " (" +
                                 cudaGetErrorString(err) + ")");
    }
    if (count == 0) return Status::unavailable("no GPU: the CUDA driver reports 0 devices");
    const int chosen = ordinal % count;
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(chosen));
    cudaDeviceProp prop{};
    TZ_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, chosen));
    TZ_RETURN_IF_ERROR(check_compute_capability(prop.name, chosen, prop.major, prop.minor,
                                                build_min_compute_capability()));
    int pools_supported = 0;
    TZ_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, chosen));
    if (pools_supported == 0) {
      return Status::unavailable("no GPU: " + std::string(prop.name) +
                                 " does not support stream-ordered memory pools");
    }
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    TZ_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (budget_bytes == 0) budget_bytes = default_cuda_budget_bytes(free_bytes);

    std::unique_ptr<CudaDevice> device(new CudaDevice(chosen, budget_bytes, prop.name));
    // The device's own pool: its settings touch no other user of the GPU. It keeps up to the
    // budget cached across synchronizations instead of returning freed memory to the driver each
    // time; allocate_raw trims it when the GPU runs out.
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = chosen;
    TZ_CUDA_RETURN_IF_ERROR(cudaMemPoolCreate(&device->pool_, &props));
    std::uint64_t threshold = budget_bytes;
    TZ_CUDA_RETURN_IF_ERROR(
        cudaMemPoolSetAttribute(device->pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
    TZ_ASSIGN_OR_RETURN(device->alloc_stream_, device->make_stream("cuda:alloc"));
    TZ_ASSIGN_OR_RETURN(auto compute, device->make_stream("cuda:compute"));
    TZ_ASSIGN_OR_RETURN(auto h2d, device->make_stream("cuda:h2d"));
    TZ_ASSIGN_OR_RETURN(auto d2h, device->make_stream("cuda:d2h"));
    device->set_default_streams(std::move(compute), std::move(h2d), std::move(d2h));
    return std::unique_ptr<Device>(std::move(device));
  }

  ~CudaDevice() override {
    release_default_streams();  // synchronizes and destroys them
    TZ_ASSERT(memory_stats().live_allocations == 0, "CudaDevice destroyed while buffers are alive");
    alloc_stream_.reset();
    if (pool_ != nullptr) {
      const Status st = TZ_CUDA_CHECK(cudaMemPoolDestroy(pool_));
      if (!st.is_ok()) TZ_LOG_ERROR("destroying the memory pool: %s", st.to_string().c_str());
    }
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override {
    return gpu_name_ + " (cuda:" + std::to_string(ordinal_) + ")";
  }
  bool host_accessible() const override { return false; }
  int cuda_ordinal() const override { return ordinal_; }

  Result<std::unique_ptr<Stream>> create_stream(std::string name) override {
    TZ_ASSIGN_OR_RETURN(auto stream, make_stream("cuda:" + name));
    return std::unique_ptr<Stream>(std::move(stream));
  }

  Result<std::unique_ptr<Event>> create_event() override {
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaEvent_t event = nullptr;
    TZ_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return std::unique_ptr<Event>(std::make_unique<CudaEvent>(this, ordinal_, event));
  }

  Status synchronize() override {
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return TZ_CUDA_CHECK(cudaDeviceSynchronize());
  }

  Status register_host_memory(void* ptr, std::size_t bytes) override {
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return TZ_CUDA_CHECK(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
  }
  Status unregister_host_memory(void* ptr) override {
    return TZ_CUDA_CHECK(cudaHostUnregister(ptr));
  }

  Status copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                    Stream& stream) override {
    if (bytes == 0) return Status::ok();
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return TZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_cuda(kind), raw(stream)));
  }
  Status memset_async(void* dst, int value, std::size_t bytes, Stream& stream) override {
    if (bytes == 0) return Status::ok();
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return TZ_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, raw(stream)));
  }
  Status host_callback(Stream& stream, std::function<void()> fn) override {
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    auto heap_fn = std::make_unique<std::function<void()>>(std::move(fn));
    TZ_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(raw(stream), run_host_function, heap_fn.get()));
    heap_fn.release();  // owned by run_host_function from here on
    return Status::ok();
  }

  Status fill(void* dst, DType dtype, std::size_t n, float value, Stream& stream) override {
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return checked_launch(cuda_launch_errors(), "fill kernel",
                          [&] { return kernels::fill(dst, dtype, n, value, raw(stream)); });
  }
  Status cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::size_t n,
              Stream& stream) override {
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return checked_launch(cuda_launch_errors(), "cast kernel", [&] {
      return kernels::cast(src, src_dtype, dst, dst_dtype, n, raw(stream));
    });
  }
  Status scale(void* data, DType dtype, std::size_t n, float factor, Stream& stream) override {
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return checked_launch(cuda_launch_errors(), "scale kernel",
                          [&] { return kernels::scale(data, dtype, n, factor, raw(stream)); });
  }
  Status sum_squares(const void* src, DType dtype, std::size_t n, NormAccumulator* acc,
                     Stream& stream) override {
    if (n == 0) return Status::ok();
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    // The chunk sums' scratch is stream-ordered memory of the device's pool: taken and given back
    // on `stream` around the two kernels (16 B per 4096 elements, within the memory the default
    // budget leaves beside the pool).
    void* scratch = nullptr;
    TZ_CUDA_RETURN_IF_ERROR(cudaMallocFromPoolAsync(&scratch, kernels::sum_squares_scratch_bytes(n),
                                                    pool_, raw(stream)));
    const Status launched = checked_launch(cuda_launch_errors(), "sum_squares kernels", [&] {
      return kernels::sum_squares(src, dtype, n, acc, scratch, raw(stream));
    });
    TZ_CUDA_RETURN_IF_ERROR(cudaFreeAsync(scratch, raw(stream)));
    return launched;
  }
  Status optimizer_step(const OptimizerStepArgs& args, Stream& stream) override {
    TZ_RETURN_IF_ERROR(validate_optimizer_step(args));
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return checked_launch(cuda_launch_errors(), "optimizer_step kernel",
                          [&] { return kernels::optimizer_step(args, raw(stream)); });
  }

 private:
  CudaDevice(int ordinal, std::uint64_t budget_bytes, std::string gpu_name)
      : Device(budget_bytes), ordinal_(ordinal), gpu_name_(std::move(gpu_name)) {}

  cudaStream_t raw(Stream& stream) {
    TZ_ASSERT(&stream.device() == this, "operation enqueued on a stream of another device");
    return static_cast<CudaStream&>(stream).raw();
  }

  Result<std::unique_ptr<CudaStream>> make_stream(std::string name) {
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaStream_t stream = nullptr;
    TZ_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return std::make_unique<CudaStream>(this, ordinal_, stream, std::move(name));
  }

  Result<void*> allocate_raw(std::size_t bytes) override {
    TZ_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    void* ptr = nullptr;
    cudaError_t err = cudaMallocFromPoolAsync(&ptr, bytes, pool_, alloc_stream_->raw());
    if (err == cudaErrorMemoryAllocation) {
      // Allocation failures are not sticky; reading the last error clears it for later calls.
      static_cast<void>(cudaGetLastError());
      // The pool's cached free memory may be in pieces too small, or wanted by cuBLAS/NCCL:
      // give it back to the driver once and retry.
      TZ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(alloc_stream_->raw()));
      TZ_CUDA_RETURN_IF_ERROR(cudaMemPoolTrimTo(pool_, 0));
      err = cudaMallocFromPoolAsync(&ptr, bytes, pool_, alloc_stream_->raw());
    }
    if (err == cudaErrorMemoryAllocation) {
      static_cast<void>(cudaGetLastError());
      return Status::out_of_memory("CudaDevice " + name() + ": the GPU has no " +
                                   std::to_string(bytes) + " B left (under the budget, but "
                                   "other processes or fragmentation hold the memory)");
    }
    TZ_RETURN_IF_ERROR(cuda_status(err, "cudaMallocFromPoolAsync"));
    // The memory is usable from any stream once the allocating stream has reached it.
    TZ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(alloc_stream_->raw()));
    return ptr;
  }

  void free_raw(void* ptr, std::size_t /*bytes*/) override {
    // The caller guarantees no pending work uses the memory (DeviceBuffer's contract).
    Status st = TZ_CUDA_CHECK(cudaSetDevice(ordinal_));
    if (st.is_ok()) st = TZ_CUDA_CHECK(cudaFreeAsync(ptr, alloc_stream_->raw()));
    if (!st.is_ok()) TZ_LOG_ERROR("freeing device memory: %s", st.to_string().c_str());
  }

  int ordinal_;
  std::string gpu_name_;
  cudaMemPool_t pool_ = nullptr;
  std::unique_ptr<CudaStream> alloc_stream_;
};

}  // namespace

Result<std::unique_ptr<Device>> create_cuda_device(int ordinal, std::uint64_t budget_bytes) {
  return CudaDevice::create(ordinal < 0 ? default_cuda_ordinal() : ordinal, budget_bytes);
}

}  // namespace tz::gpu

#else  // !TZ_HAVE_CUDA

namespace tz::gpu {

Result<std::unique_ptr<Device>> create_cuda_device(int /*ordinal*/, std::uint64_t /*budget*/) {
  return Status::unavailable("no GPU: tierzero was built without CUDA (TZ_CUDA=OFF)");
}

}  // namespace tz::gpu

#endif
