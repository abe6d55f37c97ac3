// The store's trace index (trace_index.h).
#include "store/trace_index.h"

#include <algorithm>

#include "core/assert.h"

namespace tz::store {

void TraceIndex::check() const {
  TZ_ASSERT(pos_ <= trace_.size(), "trace index: position past the trace");
  TZ_ASSERT(!following_ || !trace_.empty(), "trace index: following an empty trace");
  TZ_ASSERT(!following_ || record_.size() >= pos_,
            "trace index: the trace moved on by more pins than were recorded");
}

TraceIndex::PinMark TraceIndex::begin_pin(const TraceEntry& e, bool noted) {
  check();
  TZ_ASSERT(e.block != 0, "trace index: a pin of no block");
  const PinMark mark{pos_, following_, noted, record_.size()};
  if (!noted) return mark;
  record_.push_back(e);
  if (!following_) return mark;
  if (pos_ < trace_.size() && trace_[pos_] == e) {
    ++pos_;
    return mark;
  }
  following_ = false;
  return mark;
}

bool TraceIndex::undo_pin(const PinMark& mark) {
  check();
  TZ_ASSERT(record_.size() == mark.record_size + (mark.noted ? 1 : 0),
            "trace index: undoing a pin that is not the last one taken");
  TZ_ASSERT(mark.pos <= pos_ && pos_ <= mark.pos + 1,
            "trace index: undoing a pin that moved the position by more than one");
  TZ_ASSERT(following_ == mark.following || (mark.following && !following_),
            "trace index: a pin can only leave the trace, never rejoin it");
  if (mark.noted) record_.pop_back();
  const bool left = following_ != mark.following;
  pos_ = mark.pos;
  following_ = mark.following;
  check();
  return left;
}

void TraceIndex::end_step(bool adopt_record, const std::function<bool(BlockId)>& nvme_homed) {
  check();
  const bool followed = following_;  // the whole step followed the trace
  if (adopt_record) {
    trace_ = std::move(record_);
    build(nvme_homed);
    following_ = !trace_.empty();
  }
  pos_ = 0;
  if (followed) {
    spill_trace_ = std::move(spill_record_);
  } else {
    spill_trace_.clear();
  }
  spill_record_.clear();
  record_.clear();
  check();
}

void TraceIndex::build(const std::function<bool(BlockId)>& nvme_homed) {
  dev_uses_.clear();
  any_uses_.clear();
  overwrites_.clear();
  has_nvme_blocks_ = false;
  has_host_loads_ = false;
  TZ_ASSERT(trace_.size() < kNoPos, "trace index: a trace of 2^32 pins");
  for (std::size_t i = 0; i < trace_.size(); ++i) {
    const TraceEntry& e = trace_[i];
    const auto pos = static_cast<std::uint32_t>(i);
    const bool homed_on_nvme = nvme_homed(e.block);
    has_nvme_blocks_ |= homed_on_nvme;
    // A write-only pin needs space, not the bytes: it is no reason to keep a copy.
    if (e.access == Access::kWrite) {
      overwrites_[e.block].push_back(pos);
      continue;
    }
    has_host_loads_ |= homed_on_nvme && e.tier == Tier::kHost;
    if (e.tier == Tier::kDevice) dev_uses_[e.block].push_back(pos);
    any_uses_[e.block].push_back(pos);
  }
}

const TraceEntry& TraceIndex::ahead(std::size_t d) const {
  TZ_ASSERT(!trace_.empty(), "trace index: looking ahead in an empty trace");
  TZ_ASSERT(d < trace_.size(), "trace index: looking ahead past a whole repeat of the trace");
  return trace_[(pos_ + d) % trace_.size()];
}

const TraceEntry& TraceIndex::at(std::size_t i) const {
  TZ_ASSERT(i < trace_.size(), "trace index: a position past the trace");
  return trace_[i];
}

std::uint32_t TraceIndex::last_recorded() const {
  return record_.empty() ? kNoPos : static_cast<std::uint32_t>(record_.size() - 1);
}

std::uint64_t TraceIndex::next_in(const Uses& uses, BlockId block, std::uint64_t from) const {
  TZ_ASSERT(pos_ <= trace_.size(), "trace index: position past the trace");
  auto it = uses.find(block);
  if (it == uses.end() || it->second.empty()) return kNever;
  const auto& v = it->second;
  const std::uint64_t n = trace_.size();
  const std::uint64_t start = pos_ + from;  // an absolute position, past n in a later repeat
  const std::uint64_t repeat = start / n * n;
  auto p = std::lower_bound(v.begin(), v.end(), static_cast<std::uint32_t>(start - repeat));
  if (p != v.end()) return repeat + *p - pos_;
  return repeat + n + v.front() - pos_;
}

std::uint64_t TraceIndex::next_use(BlockId block, Tier tier, std::uint64_t from) const {
  TZ_ASSERT(static_cast<std::size_t>(tier) < kTierCount, "trace index: no such tier");
  const std::uint64_t nu = next_in(tier == Tier::kDevice ? dev_uses_ : any_uses_, block, from);
  return next_in(overwrites_, block, from) < nu ? kNever : nu;
}

std::uint64_t TraceIndex::next_overwrite(BlockId block) const {
  return next_in(overwrites_, block);
}

void TraceIndex::note_spill(std::uint32_t pos) {
  TZ_ASSERT(pos != kNoPos, "trace index: a spill of no write pin");
  spill_record_.insert(pos);
}

}  // namespace tz::store
