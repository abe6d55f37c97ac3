// FaultEngine wraps any IoEngine and injects seeded faults, so the retry and error paths of
// IoQueue and everything above it are tested over every backend: EIO on the k-th request or at a
// rate, short transfers, EINTR/EAGAIN, ENOSPC past a write budget, and completions held back and
// released out of order.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "nvme/io_engine.h"

namespace tz::nvme {

struct FaultOptions {
  std::uint64_t seed = 1;
  std::uint64_t eio_on_request = 0;  // the k-th submitted request (1-based) fails with EIO; 0: never
  double eio_rate = 0;               // each request fails with EIO with this probability
  double short_rate = 0;             // each request longer than 4 KiB transfers a 4 KiB-aligned prefix
  double transient_rate = 0;         // each request fails with EINTR or EAGAIN (not submitted)
  // Bytes of writes the "filesystem" accepts; a write crossing the limit is cut short at it and
  // every later write fails with ENOSPC. UINT64_MAX: no limit.
  std::uint64_t enospc_after_write_bytes = UINT64_MAX;
  double delay_rate = 0;  // each completion is held back for a later reap with this probability
  bool reorder = false;   // completions are returned in a shuffled order
};

struct FaultCounts {
  std::uint64_t requests = 0;
  std::uint64_t eio = 0;
  std::uint64_t short_transfers = 0;
  std::uint64_t transient = 0;
  std::uint64_t enospc = 0;
  std::uint64_t delayed = 0;
};

class FaultEngine final : public IoEngine {
 public:
  FaultEngine(std::unique_ptr<IoEngine> inner, const FaultOptions& options);

  IoEngineKind kind() const override { return inner_->kind(); }
  std::uint32_t capacity() const override { return inner_->capacity(); }
  std::uint32_t in_flight() const override;
  Result<int> add_file(int fd) override { return inner_->add_file(fd); }
  Status register_buffers(std::span<const iovec> regions) override {
    return inner_->register_buffers(regions);
  }
  bool buffers_registered() const override { return inner_->buffers_registered(); }
  bool files_registered() const override { return inner_->files_registered(); }
  Status submit(std::span<const IoRequest> requests) override;
  Status flush() override { return inner_->flush(); }
  Result<std::size_t> reap(std::span<IoCompletion> out, std::size_t min_complete) override;

  const FaultCounts& counts() const { return counts_; }
  // Faults from now on (FaultOptions{} switches them off, e.g. to verify what was written).
  // Completions already held back are still delivered; the write-byte count is kept.
  void set_options(const FaultOptions& options) {
    options_ = options;
    rng_.seed(options.seed);
  }

 private:
  std::unique_ptr<IoEngine> inner_;
  FaultOptions options_;
  std::mt19937_64 rng_;
  FaultCounts counts_;
  std::uint64_t written_ = 0;     // write bytes accepted so far (for ENOSPC)
  std::deque<IoCompletion> ready_;  // synthetic and held-back completions
  std::vector<IoRequest> pass_;
  std::vector<IoCompletion> inner_out_;
};

}  // namespace tz::nvme
