// Progress reporter (core/progress.h).
#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace tz {

Progress::Progress(std::string label, std::uint64_t total, std::string unit, std::FILE* out)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      out_(out),
      interactive_(isatty(fileno(out)) == 1 && std::getenv("CI") == nullptr),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::add(std::uint64_t done_delta) {
  done_.fetch_add(done_delta, std::memory_order_relaxed);
  maybe_draw(false);
}

void Progress::set(std::uint64_t done) {
  done_.store(done, std::memory_order_relaxed);
  maybe_draw(false);
}

void Progress::finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
  }
  maybe_draw(true);
  std::lock_guard<std::mutex> lock(mu_);
  finished_ = true;
  if (interactive_) std::fputc('\n', out_);
  std::fflush(out_);
}

void Progress::maybe_draw(bool force) {
  const auto now = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || finished_) return;
  const auto interval = interactive_ ? std::chrono::milliseconds(100) : std::chrono::seconds(5);
  if (!force && now - last_draw_ < interval) return;
  last_draw_ = now;
  const std::uint64_t done = std::min(done_.load(std::memory_order_relaxed), total_);
  const double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (interactive_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(out_, "\r%s [%s] %5.1f%% %llu/%llu %s %.1fs", label_.c_str(), bar.c_str(),
                 frac * 100, static_cast<unsigned long long>(done),
                 static_cast<unsigned long long>(total_), unit_.c_str(), elapsed);
  } else {
    std::fprintf(out_, "%s: %.1f%% (%llu/%llu %s) %.1fs\n", label_.c_str(), frac * 100,
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total_),
                 unit_.c_str(), elapsed);
  }
  std::fflush(out_);
}

}  // namespace tz
