// Chrome trace (Perfetto-readable JSON) of what ran where: complete events ("X") on named tracks,
// one track per stream or thread (compute, copy, comm, nvme, cpu optimizer). Recording is off
// until a Trace is enabled; emitting into a disabled trace costs one atomic load.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tz {

class Trace {
 public:
  // The process-wide trace that modules emit into.
  static Trace& global();

  void enable() { enabled_.store(true, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Microseconds since the trace's epoch.
  double now_us() const;
  // Records a span [start_us, end_us) on `track` (created on first use).
  void span(std::string_view track, std::string_view name, double start_us, double end_us,
            std::string_view args_json = {});
  // Records a counter sample (drawn as a graph track).
  void counter(std::string_view name, double value);
  std::size_t event_count() const;
  // Writes {"traceEvents": [...]} to `path`.
  Status write(const std::string& path) const;
  // The JSON text of the trace.
  std::string to_json() const;
  void clear();

 private:
  struct Event {
    char phase;  // 'X' span, 'C' counter
    int track;
    std::string name;
    double ts_us;
    double dur_us;
    std::string args_json;
  };
  int track_id(std::string_view track);  // requires mu_

  std::atomic<bool> enabled_{false};
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  mutable std::mutex mu_;
  std::vector<std::string> tracks_;
  std::vector<Event> events_;
};

// RAII span on the global trace: records [construction, destruction) when the trace is enabled.
class TraceSpan {
 public:
  TraceSpan(std::string_view track, std::string_view name);
  // Named `prefix` + `subject`, joined only when the trace is enabled (no string is built on a
  // hot path that is not traced).
  TraceSpan(std::string_view track, std::string_view prefix, std::string_view subject);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  bool active_;
  std::string track_;
  std::string name_;
  double start_us_ = 0;
};

}  // namespace tz
