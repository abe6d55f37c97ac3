// ExtentAllocator: best fit over a size-ordered index, coalescing free list by offset.
#include "nvme/extent_allocator.h"

#include <iterator>

#include "core/assert.h"

namespace tz::nvme {

ExtentAllocator::ExtentAllocator(std::uint64_t capacity_bytes, std::uint64_t align_bytes)
    : capacity_(capacity_bytes / align_bytes * align_bytes), align_(align_bytes) {
  TZ_ASSERT(align_bytes > 0 && (align_bytes & (align_bytes - 1)) == 0,
            "extent alignment must be a power of two");
  if (capacity_ > 0) insert_free(0, capacity_);
}

void ExtentAllocator::insert_free(std::uint64_t offset, std::uint64_t bytes) {
  by_offset_.emplace(offset, bytes);
  by_size_.emplace(bytes, offset);
  free_bytes_ += bytes;
}

void ExtentAllocator::erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

std::optional<Extent> ExtentAllocator::allocate(std::uint64_t bytes) {
  TZ_ASSERT(bytes > 0, "allocation of 0 bytes");
  const std::uint64_t need = (bytes + align_ - 1) / align_ * align_;
  if (need < bytes) return std::nullopt;  // overflow
  auto fit = by_size_.lower_bound({need, 0});
  if (fit == by_size_.end()) return std::nullopt;
  const std::uint64_t offset = fit->second;
  const std::uint64_t have = fit->first;
  erase_free(by_offset_.find(offset));
  if (have > need) insert_free(offset + need, have - need);
  return Extent{offset, need};
}

void ExtentAllocator::free(const Extent& extent) {
  TZ_ASSERT(extent.bytes > 0 && extent.bytes % align_ == 0 && extent.offset % align_ == 0,
            "freeing an extent this allocator did not hand out");
  TZ_ASSERT(extent.offset + extent.bytes <= capacity_, "freeing an extent past the capacity");
  std::uint64_t offset = extent.offset;
  std::uint64_t bytes = extent.bytes;
  auto next = by_offset_.lower_bound(offset);
  TZ_ASSERT(next == by_offset_.end() || next->first >= offset + bytes, "double free of an extent");
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    TZ_ASSERT(prev->first + prev->second <= offset, "double free of an extent");
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      erase_free(prev);
    }
  }
  if (next != by_offset_.end() && next->first == extent.offset + extent.bytes) {
    bytes += next->second;
    erase_free(next);
  }
  insert_free(offset, bytes);
}

std::uint64_t ExtentAllocator::largest_free_bytes() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

std::vector<Extent> ExtentAllocator::free_extents() const {
  std::vector<Extent> out;
  out.reserve(by_offset_.size());
  for (const auto& [off, len] : by_offset_) out.push_back({off, len});
  return out;
}

}  // namespace tz::nvme
