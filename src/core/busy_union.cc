// BusyUnion (busy_union.h): a count of active users and the time the count was above zero.
#include "core/busy_union.h"

#include "core/assert.h"

namespace tz {

BusyUnion& BusyUnion::host_cores() {
  // Never destroyed: stream workers of a device that outlives main's statics may still call it.
  static BusyUnion* const cores = new BusyUnion;
  return *cores;
}

void BusyUnion::enter() {
  std::lock_guard lock(mu_);
  if (active_++ == 0) since_ = Clock::now();
}

void BusyUnion::leave() {
  std::lock_guard lock(mu_);
  TZ_ASSERT(active_ > 0, "BusyUnion::leave without a matching enter");
  if (--active_ == 0) {
    closed_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since_).count();
  }
}

double BusyUnion::seconds() const {
  std::lock_guard lock(mu_);
  std::int64_t ns = closed_ns_;
  if (active_ > 0) {
    ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since_).count();
  }
  return static_cast<double>(ns) * 1e-9;
}

}  // namespace tz
