// ExtentAllocator hands out aligned extents of a linear byte space (the swap space's logical
// addresses): best fit from a free list that is coalesced on every free, so free space never
// splinters into more pieces than there are live extents plus one.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace tz::nvme {

struct Extent {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;  // a multiple of the allocator's alignment
  friend bool operator==(const Extent&, const Extent&) = default;
};

class ExtentAllocator {
 public:
  // Manages [0, capacity_bytes rounded down to align_bytes). align_bytes: a power of two.
  explicit ExtentAllocator(std::uint64_t capacity_bytes, std::uint64_t align_bytes = 4096);

  // The smallest free extent that fits `bytes` rounded up to the alignment (lowest offset among
  // equals), or nullopt when none does. bytes == 0 is a programmer error.
  std::optional<Extent> allocate(std::uint64_t bytes);
  // Returns an extent from allocate(). Freeing space that is already free aborts.
  void free(const Extent& extent);

  std::uint64_t capacity_bytes() const { return capacity_; }
  std::uint64_t align_bytes() const { return align_; }
  std::uint64_t free_bytes() const { return free_bytes_; }
  std::uint64_t used_bytes() const { return capacity_ - free_bytes_; }
  std::uint64_t largest_free_bytes() const;
  std::size_t free_extent_count() const { return by_offset_.size(); }
  // Free extents in offset order (for tests and statistics).
  std::vector<Extent> free_extents() const;

 private:
  void insert_free(std::uint64_t offset, std::uint64_t bytes);
  void erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it);

  std::uint64_t capacity_;
  std::uint64_t align_;
  std::uint64_t free_bytes_ = 0;
  std::map<std::uint64_t, std::uint64_t> by_offset_;         // offset -> bytes
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;  // (bytes, offset)
};

}  // namespace tz::nvme
