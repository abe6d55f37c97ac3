// Chrome trace writer (core/trace.h).
#include "core/trace.h"

#include <nlohmann/json.hpp>

#include "core/output_file.h"

namespace tz {

Trace& Trace::global() {
  static Trace trace;
  return trace;
}

double Trace::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch_)
      .count();
}

int Trace::track_id(std::string_view track) {
  for (std::size_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i] == track) return static_cast<int>(i) + 1;
  }
  tracks_.emplace_back(track);
  return static_cast<int>(tracks_.size());
}

void Trace::span(std::string_view track, std::string_view name, double start_us, double end_us,
                 std::string_view args_json) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(Event{'X', track_id(track), std::string(name), start_us, end_us - start_us,
                          std::string(args_json)});
}

void Trace::counter(std::string_view name, double value) {
  if (!enabled()) return;
  const double ts = now_us();
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(Event{'C', 0, std::string(name), ts, value, {}});
}

std::size_t Trace::event_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

void Trace::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
}

std::string Trace::to_json() const {
  using nlohmann::json;
  std::lock_guard<std::mutex> lock(mu_);
  json events = json::array();
  events.push_back({{"ph", "M"}, {"pid", 1}, {"tid", 0}, {"name", "process_name"},
                    {"args", {{"name", "tierzero"}}}});
  for (std::size_t i = 0; i < tracks_.size(); ++i) {
    events.push_back({{"ph", "M"}, {"pid", 1}, {"tid", static_cast<int>(i) + 1},
                      {"name", "thread_name"}, {"args", {{"name", tracks_[i]}}}});
  }
  for (const Event& e : events_) {
    json j = {{"ph", std::string(1, e.phase)}, {"pid", 1}, {"name", e.name}, {"ts", e.ts_us}};
    if (e.phase == 'X') {
      j["tid"] = e.track;
      j["dur"] = e.dur_us;
      if (!e.args_json.empty()) {
        j["args"] = json::parse(e.args_json, nullptr, /*allow_exceptions=*/false);
      }
    } else {
      j["tid"] = 0;
      j["args"] = {{"value", e.dur_us}};
    }
    events.push_back(std::move(j));
  }
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump();
}

Status Trace::write(const std::string& path) const {
  return write_output_file("trace", path, to_json());
}

TraceSpan::TraceSpan(std::string_view track, std::string_view name)
    : active_(Trace::global().enabled()) {
  if (active_) {
    track_ = track;
    name_ = name;
    start_us_ = Trace::global().now_us();
  }
}

TraceSpan::TraceSpan(std::string_view track, std::string_view prefix, std::string_view subject)
    : active_(Trace::global().enabled()) {
  if (active_) {
    track_ = track;
    name_.reserve(prefix.size() + subject.size());
    name_.append(prefix).append(subject);
    start_us_ = Trace::global().now_us();
  }
}

TraceSpan::~TraceSpan() {
  if (active_) {
    Trace& t = Trace::global();
    t.span(track_, name_, start_us_, t.now_us());
  }
}

}  // namespace tz
