// The store's I/O scheduler (io_scheduler.h).
#include "store/io_scheduler.h"

#include <algorithm>
#include <utility>

#include "core/assert.h"

namespace tz::store {

IoScheduler::IoScheduler(IoGrouping grouping, std::uint64_t max_in_flight_bytes,
                         std::uint64_t write_run_bytes)
    : grouping_(grouping),
      max_in_flight_bytes_(max_in_flight_bytes),
      write_run_bytes_(write_run_bytes) {}

void IoScheduler::check() const {
  const std::uint32_t jobs = in_flight_reads_ + in_flight_writes_;
  TZ_ASSERT(in_flight_bytes_ <= max_in_flight_bytes_ || jobs == 1,
            "I/O scheduler: past the in-flight bound with more than one job");
  TZ_ASSERT((in_flight_bytes_ == 0) == (jobs == 0),
            "I/O scheduler: bytes and jobs in flight disagree");
  TZ_ASSERT(grouping_ == IoGrouping::kMixed || in_flight_reads_ == 0 || in_flight_writes_ == 0,
            "kGrouped never has both directions in flight");
}

void IoScheduler::queue(IoJob job) {
  check();
  TZ_ASSERT(job.block != 0, "I/O scheduler: a job of no block");
  TZ_ASSERT(job.io_bytes > 0 && job.io_bytes % kAlign == 0,
            "I/O scheduler: a job that is not a positive multiple of 4 KiB");
  job.order = job_order_++;
  if (job.dir == nvme::IoOp::kRead) {
    read_q_.push_back(std::move(job));
  } else {
    write_q_.push_back(std::move(job));
  }
}

void IoScheduler::complete(const IoJob& job) {
  check();
  TZ_ASSERT(in_flight_bytes_ >= job.io_bytes, "completing more bytes than are in flight");
  in_flight_bytes_ -= job.io_bytes;
  if (job.dir == nvme::IoOp::kRead) {
    TZ_ASSERT(in_flight_reads_ > 0, "completing a read that is not in flight");
    --in_flight_reads_;
  } else {
    TZ_ASSERT(in_flight_writes_ > 0, "completing a write that is not in flight");
    --in_flight_writes_;
  }
  check();
}

bool IoScheduler::empty() const {
  return read_q_.empty() && write_q_.empty() && in_flight_bytes_ == 0;
}

bool IoScheduler::fits(const IoJob& job) const {
  // One job always fits an idle disk, whatever its size.
  return in_flight_bytes_ == 0 || in_flight_bytes_ + job.io_bytes <= max_in_flight_bytes_;
}

void IoScheduler::take(std::deque<IoJob>& q, std::vector<IoJob>& out) {
  IoJob j = std::move(q.front());
  q.pop_front();
  in_flight_bytes_ += j.io_bytes;
  run_bytes_ += j.io_bytes;
  if (j.dir == nvme::IoOp::kRead) {
    ++in_flight_reads_;
  } else {
    ++in_flight_writes_;
  }
  out.push_back(std::move(j));
}

std::vector<IoJob> IoScheduler::pick(const std::function<bool(BlockId)>& deferrable) {
  check();
  std::vector<IoJob> out;
  // Writes somebody waits for (a victim's, whose space a load needs) before deferrable ones.
  std::stable_partition(write_q_.begin(), write_q_.end(),
                        [&](const IoJob& j) { return !deferrable(j.block); });
  if (grouping_ == IoGrouping::kMixed) {
    pick_mixed(out);
  } else {
    pick_grouped(out);
  }
  check();
  return out;
}

void IoScheduler::pick_mixed(std::vector<IoJob>& out) {
  for (;;) {
    std::deque<IoJob>* q = nullptr;
    if (!read_q_.empty() && (write_q_.empty() || read_q_.front().order < write_q_.front().order)) {
      q = &read_q_;
    } else if (!write_q_.empty()) {
      q = &write_q_;
    }
    if (q == nullptr || !fits(q->front())) return;
    take(*q, out);
  }
}

void IoScheduler::pick_grouped(std::vector<IoJob>& out) {
  for (;;) {
    std::deque<IoJob>& cur = writing_ ? write_q_ : read_q_;
    std::deque<IoJob>& other = writing_ ? read_q_ : write_q_;
    const std::uint32_t cur_in_flight = writing_ ? in_flight_writes_ : in_flight_reads_;
    const std::uint32_t other_in_flight = writing_ ? in_flight_reads_ : in_flight_writes_;
    const bool run_over = run_bytes_ >= write_run_bytes_;
    if (!cur.empty() && !(run_over && !other.empty())) {
      if (other_in_flight > 0 || !fits(cur.front())) return;  // drain the other side first
      take(cur, out);
      continue;
    }
    if (other.empty()) return;
    // Switch direction once the current one has drained.
    if (cur_in_flight > 0) return;
    writing_ = !writing_;
    run_bytes_ = 0;
  }
}

}  // namespace tz::store
