// FaultEngine: seeded fault decisions at submission, hold-back and shuffling at reaping.
#include "nvme/fault_engine.h"

#include <algorithm>
#include <cerrno>

#include "core/assert.h"

namespace tz::nvme {

FaultEngine::FaultEngine(std::unique_ptr<IoEngine> inner, const FaultOptions& options)
    : inner_(std::move(inner)), options_(options), rng_(options.seed) {
  TZ_ASSERT(inner_ != nullptr);
  inner_out_.resize(inner_->capacity());
}

std::uint32_t FaultEngine::in_flight() const {
  return inner_->in_flight() + static_cast<std::uint32_t>(ready_.size());
}

Status FaultEngine::submit(std::span<const IoRequest> requests) {
  TZ_ASSERT(in_flight() + requests.size() <= capacity(), "fault engine: submit past capacity");
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  pass_.clear();
  for (IoRequest r : requests) {
    ++counts_.requests;
    if (options_.eio_on_request == counts_.requests ||
        (options_.eio_rate > 0 && coin(rng_) < options_.eio_rate)) {
      ++counts_.eio;
      ready_.push_back({r.user_data, -EIO});
      continue;
    }
    if (options_.transient_rate > 0 && coin(rng_) < options_.transient_rate) {
      ++counts_.transient;
      ready_.push_back({r.user_data, (rng_() & 1) ? -EINTR : -EAGAIN});
      continue;
    }
    if (options_.short_rate > 0 && r.len > 4096 && coin(rng_) < options_.short_rate) {
      const std::uint32_t blocks = r.len / 4096;
      const auto keep = static_cast<std::uint32_t>(1 + rng_() % std::max<std::uint32_t>(1, blocks - 1));
      if (keep * 4096u < r.len) {
        r.len = keep * 4096u;
        ++counts_.short_transfers;
      }
    }
    if (r.op == IoOp::kWrite && options_.enospc_after_write_bytes != UINT64_MAX) {
      const std::uint64_t room =
          written_ >= options_.enospc_after_write_bytes ? 0 : options_.enospc_after_write_bytes - written_;
      if (room == 0) {
        ++counts_.enospc;
        ready_.push_back({r.user_data, -ENOSPC});
        continue;
      }
      if (room < r.len) {
        // The filesystem fills up inside this write: the kernel writes what fits (whole blocks).
        const std::uint32_t fits = static_cast<std::uint32_t>(room / 4096 * 4096);
        if (fits == 0) {
          written_ = options_.enospc_after_write_bytes;
          ++counts_.enospc;
          ready_.push_back({r.user_data, -ENOSPC});
          continue;
        }
        r.len = fits;
      }
      written_ += r.len;
    }
    pass_.push_back(r);
  }
  if (pass_.empty()) return Status::ok();
  return inner_->submit(pass_);
}

Result<std::size_t> FaultEngine::reap(std::span<IoCompletion> out, std::size_t min_complete) {
  const std::size_t want = std::min<std::size_t>({min_complete, in_flight(), out.size()});
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  // Collect from the inner engine until enough are ready (or nothing more is coming).
  while (inner_->in_flight() > 0) {
    const bool need = ready_.size() < want;
    TZ_ASSIGN_OR_RETURN(const std::size_t n, inner_->reap(inner_out_, need ? 1 : 0));
    for (std::size_t i = 0; i < n; ++i) ready_.push_back(inner_out_[i]);
    if (!need) break;
  }
  if (options_.reorder && ready_.size() > 1) std::shuffle(ready_.begin(), ready_.end(), rng_);
  std::size_t got = 0;
  std::deque<IoCompletion> held;
  while (!ready_.empty() && got < out.size()) {
    IoCompletion c = ready_.front();
    ready_.pop_front();
    // Hold a completion back only while more are coming, so a waiter always makes progress.
    if (options_.delay_rate > 0 && got >= want && inner_->in_flight() > 0 &&
        coin(rng_) < options_.delay_rate) {
      ++counts_.delayed;
      held.push_back(c);
      continue;
    }
    out[got++] = c;
  }
  for (const IoCompletion& c : held) ready_.push_back(c);
  return got;
}

}  // namespace tz::nvme
