// The store's I/O scheduler (DESIGN.md, "The store"): the queues of NVMe piece jobs waiting for the
// disk and the accounting of those in flight. It decides which jobs the mover submits next: within
// the in-flight byte bound, writes somebody waits for before deferrable ones, and either in arrival
// order with both directions in flight (IoGrouping::kMixed) or one direction at a time, reads
// first, switching once a run of `write_run_bytes` is done and the other side waits
// (IoGrouping::kGrouped). No threads and no device: the mover calls it under the store's lock, and
// tests drive it with hand-written jobs (tests/unit/store/io_scheduler_test.cc).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "store/store.h"
#include "store/store_internal.h"

namespace tz::store {

class IoScheduler {
 public:
  IoScheduler() = default;  // kMixed, as StoreOptions' defaults
  IoScheduler(IoGrouping grouping, std::uint64_t max_in_flight_bytes,
              std::uint64_t write_run_bytes);

  // Queues `job` (its `order` is set to its arrival): a piece of a block, of a positive multiple
  // of 4 KiB.
  void queue(IoJob job);
  // The jobs to submit now, taken from the queues and counted in flight. `deferrable(block)`
  // says whether a write of that block may wait behind the others (an early write-back nothing
  // waits for); it is asked of queued writes only.
  std::vector<IoJob> pick(const std::function<bool(BlockId)>& deferrable);
  // A picked job completed (or failed): its bytes leave the in-flight count.
  void complete(const IoJob& job);

  bool empty() const;  // nothing queued, nothing in flight
  std::uint64_t in_flight_bytes() const { return in_flight_bytes_; }
  std::uint32_t in_flight_reads() const { return in_flight_reads_; }
  std::uint32_t in_flight_writes() const { return in_flight_writes_; }
  std::size_t queued_reads() const { return read_q_.size(); }
  std::size_t queued_writes() const { return write_q_.size(); }
  bool writing() const { return writing_; }  // kGrouped: the direction being issued

 private:
  // The state every entry point starts from: the in-flight bound is kept (past it only one job,
  // which an idle disk always takes), bytes and jobs in flight agree, and kGrouped never has
  // both directions in flight.
  void check() const;
  void take(std::deque<IoJob>& q, std::vector<IoJob>& out);
  bool fits(const IoJob& job) const;
  void pick_mixed(std::vector<IoJob>& out);
  void pick_grouped(std::vector<IoJob>& out);

  IoGrouping grouping_ = StoreOptions{}.io_grouping;
  std::uint64_t max_in_flight_bytes_ = StoreOptions{}.max_io_in_flight_bytes;
  std::uint64_t write_run_bytes_ = StoreOptions{}.write_run_bytes;
  std::deque<IoJob> read_q_;
  std::deque<IoJob> write_q_;
  std::uint64_t job_order_ = 0;
  bool writing_ = false;         // kGrouped: the direction being issued
  std::uint64_t run_bytes_ = 0;  // bytes issued in the current direction's run
  std::uint64_t in_flight_bytes_ = 0;
  std::uint32_t in_flight_reads_ = 0;
  std::uint32_t in_flight_writes_ = 0;
};

}  // namespace tz::store
