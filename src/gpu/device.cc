// The backend-independent part of Device: budgeted allocation with exact peak accounting, and
// DeviceBuffer, the RAII owner of one allocation.
#include "gpu/device.h"

#include <algorithm>
#include <utility>

#include "core/units.h"

namespace tz::gpu {

std::string_view device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kHost:
      return "host";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::exchange(other.device_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (ptr_ != nullptr) device_->release(ptr_, bytes_);
  device_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

Result<DeviceBuffer> Device::allocate(std::size_t bytes) {
  if (bytes == 0) return DeviceBuffer{};
  {
    // Reserve first so that concurrent allocations can never overshoot the budget together.
    std::lock_guard lock(mu_);
    if (bytes > stats_.budget_bytes - std::min(stats_.in_use_bytes, stats_.budget_bytes)) {
      ++stats_.refused_allocations;
      return Status::out_of_memory(
          "device pool (" + name() + "): allocating " + format_bytes(static_cast<double>(bytes)) +
          " (" + std::to_string(bytes) + " B) would exceed the budget: in use " +
          std::to_string(stats_.in_use_bytes) + " B, budget " +
          std::to_string(stats_.budget_bytes) + " B (" +
          format_bytes(static_cast<double>(stats_.budget_bytes)) + ")");
    }
    stats_.in_use_bytes += bytes;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.in_use_bytes);
    ++stats_.live_allocations;
    ++stats_.total_allocations;
  }
  Result<void*> ptr = allocate_raw(bytes);
  if (!ptr.is_ok()) {
    std::lock_guard lock(mu_);
    stats_.in_use_bytes -= bytes;
    --stats_.live_allocations;
    --stats_.total_allocations;
    ++stats_.refused_allocations;
    return std::move(ptr).take_status();
  }
  return DeviceBuffer(this, *ptr, bytes);
}

void Device::release(void* ptr, std::size_t bytes) {
  free_raw(ptr, bytes);
  std::lock_guard lock(mu_);
  TZ_ASSERT(stats_.in_use_bytes >= bytes && stats_.live_allocations > 0,
            "device pool: releasing more than was allocated");
  stats_.in_use_bytes -= bytes;
  --stats_.live_allocations;
}

MemoryStats Device::memory_stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Device::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak_bytes = stats_.in_use_bytes;
}

void Device::set_default_streams(std::unique_ptr<Stream> compute, std::unique_ptr<Stream> h2d,
                                 std::unique_ptr<Stream> d2h) {
  TZ_ASSERT(compute && h2d && d2h);
  compute_ = std::move(compute);
  h2d_ = std::move(h2d);
  d2h_ = std::move(d2h);
}

void Device::release_default_streams() {
  compute_.reset();
  h2d_.reset();
  d2h_.reset();
}

}  // namespace tz::gpu
