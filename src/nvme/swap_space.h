// SwapSpace owns the NVMe tier's backing store: one preallocated swap file per path (mode 0600, in
// a directory it creates), an IoQueue over them, and an extent allocator over the logical space.
// Logical bytes are striped over the files in `stripe_bytes` units (RAID-0), so an extent larger
// than a stripe spans every path and N drives add their bandwidth.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "nvme/extent_allocator.h"
#include "nvme/file.h"
#include "nvme/io_queue.h"

namespace tz::nvme {

struct SwapOptions {
  std::vector<std::string> paths;  // one swap file per path (several on one path is allowed)
  std::uint64_t bytes_per_path = 1ull << 30;  // rounded down to a stripe multiple
  std::uint64_t stripe_bytes = 1ull << 20;    // a multiple of 4 KiB
  bool keep_files = false;                    // leave the files on disk at destruction
  DirectMode direct = DirectMode::kPrefer;
};

struct SwapExtent {
  std::uint64_t offset = 0;  // logical
  std::uint64_t bytes = 0;   // multiple of 4 KiB
};

class SwapSpace {
 public:
  // Creates `<path>/tierzero-swap-<pid>-<n>/swap.<i>` per path and preallocates them with
  // fallocate. Errors: kNoSpace naming the path, how much was asked and how much is free; the
  // open/mkdir errno naming the path. Whatever was created is removed on failure.
  static Result<SwapSpace> create(const SwapOptions& options, std::unique_ptr<IoEngine> engine,
                                  const IoQueueOptions& queue_options);

  SwapSpace(SwapSpace&&) noexcept;
  SwapSpace& operator=(SwapSpace&&) noexcept;
  SwapSpace(const SwapSpace&) = delete;
  SwapSpace& operator=(const SwapSpace&) = delete;
  // Waits for I/O in flight, closes the files and removes them and their directories unless
  // keep_files.
  ~SwapSpace();

  // A 4 KiB-aligned extent of at least `bytes`. Errors: kNoSpace "swap space full: asked N bytes,
  // F free (largest free extent L) on <paths>".
  Result<SwapExtent> allocate(std::uint64_t bytes);
  void free(const SwapExtent& extent);

  // The per-file transfers for [offset, offset+len) of `extent` <-> `buf` (for IoQueue::start).
  // A range outside the extent is a programmer error.
  std::vector<Transfer> transfers(IoOp op, const SwapExtent& extent, std::uint64_t offset,
                                  void* buf, std::uint64_t len) const;
  // Blocking helpers: the range through the queue; the Status names file, offset and length.
  Status write(const SwapExtent& extent, std::uint64_t offset, const void* buf, std::uint64_t len);
  Status read(const SwapExtent& extent, std::uint64_t offset, void* buf, std::uint64_t len);

  IoQueue& queue();
  std::uint64_t capacity_bytes() const;
  std::uint64_t free_bytes() const;
  const ExtentAllocator& allocator() const;
  std::vector<std::string> file_paths() const;
  bool direct() const;  // every file is O_DIRECT

 private:
  struct State;
  explicit SwapSpace(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tz::nvme
