// BusyUnion: the wall time during which at least one of several concurrent users was busy, the
// union of their busy intervals. Work that shares the same cores (a host-memory device's kernels
// and the CPU optimizer, each slowed by the other when they overlap) is counted once by its
// union, where adding the users' own times would count the overlap twice (docs/zero.md, the
// step's bound).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace tz {

class BusyUnion {
 public:
  BusyUnion() = default;
  BusyUnion(const BusyUnion&) = delete;
  BusyUnion& operator=(const BusyUnion&) = delete;

  // The process's tracker of work on the host's cores that the step's bound counts: the compute
  // stream's work on every HostDevice and every CPU optimizer call (gpu/host_device.h,
  // zero/optimizer_driver.h). Process-wide because threads of one process (ranks as threads, a
  // rank and its update worker) share the machine's cores.
  static BusyUnion& host_cores();

  // A user starts (enter) or stops (leave) being busy; users may nest and overlap, from any
  // thread. Every enter is matched by one leave (asserted); BusyScope pairs them.
  void enter();
  void leave();
  // Seconds during which at least one user was busy, since this tracker was created, including
  // the interval still open now (so the difference of two calls is the union within that window).
  double seconds() const;

 private:
  using Clock = std::chrono::steady_clock;
  mutable std::mutex mu_;
  int active_ = 0;              // guarded by mu_: users busy now
  Clock::time_point since_;     // guarded by mu_: when active_ last went from 0 to 1
  std::int64_t closed_ns_ = 0;  // guarded by mu_: the union of intervals already closed
};

// enter() on construction, leave() on destruction.
class BusyScope {
 public:
  explicit BusyScope(BusyUnion& u) : u_(u) { u_.enter(); }
  ~BusyScope() { u_.leave(); }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  BusyUnion& u_;
};

}  // namespace tz
