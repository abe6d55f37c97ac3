// Progress of long work: on a terminal a bar redrawn in place, otherwise a plain line at most
// every few seconds (so CI logs stay readable). Thread-safe; `add` is cheap between redraws.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace tz {

class Progress {
 public:
  // `total` units of work (bytes, steps, ...); `unit` names them in the output.
  Progress(std::string label, std::uint64_t total, std::string unit = "",
           std::FILE* out = stderr);
  ~Progress();  // finishes the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(std::uint64_t done_delta);
  void set(std::uint64_t done);
  void finish();
  // Whether output goes to a terminal (bar) or not (plain lines).
  bool interactive() const { return interactive_; }

 private:
  void maybe_draw(bool force);

  std::string label_;
  std::uint64_t total_;
  std::string unit_;
  std::FILE* out_;
  bool interactive_;
  std::atomic<std::uint64_t> done_{0};
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool finished_ = false;
};

}  // namespace tz
