// The store's vocabulary (tiers, links) and its counters: bytes per tier and per link, hits,
// misses, prefetch hits, stall time and peaks, exported as JSON for benches and logs.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tz::store {

// Ordered from fastest to slowest: a lower value is an upper tier.
enum class Tier : std::uint8_t { kDevice = 0, kHost = 1, kNvme = 2 };
inline constexpr std::size_t kTierCount = 3;
const char* tier_name(Tier tier);
Result<Tier> parse_tier(std::string_view name);  // "device", "host" or "nvme"

// The directions bytes move in. NVMe <-> device goes through staging buffers but is one link:
// it costs disk and PCIe bandwidth, never host-tier space.
enum class Link : std::uint8_t {
  kNvmeToHost = 0,
  kHostToNvme,
  kNvmeToDevice,
  kDeviceToNvme,
  kHostToDevice,
  kDeviceToHost,
};
inline constexpr std::size_t kLinkCount = 6;
const char* link_name(Link link);  // "nvme_to_host", ...

struct TierStats {
  std::uint64_t budget_bytes = 0;
  std::uint64_t used_bytes = 0;       // physical bytes held by copies now
  std::uint64_t cached_bytes = 0;     // device: freed buffers kept for reuse (within the budget)
  std::uint64_t peak_bytes = 0;       // largest used_bytes + cached_bytes
  std::uint64_t bytes_in = 0;         // bytes copied into this tier
  std::uint64_t bytes_out = 0;        // bytes copied out of this tier
  std::uint64_t hits = 0;             // pins that found a current copy (or one being loaded)
  std::uint64_t misses = 0;           // pins that had to start a load
  std::uint64_t prefetch_hits = 0;    // hits on a copy a prefetch brought
  std::uint64_t prefetches = 0;       // loads started by prefetch
  std::uint64_t evictions = 0;
  std::uint64_t write_backs = 0;      // evictions that had to copy dirty bytes down
  std::uint64_t fragmentation_evictions = 0;  // host: rounds of extra evictions an allocation
                                              // forced (a fragmented pool, or frees stuck behind
                                              // later allocations)
  double stall_s = 0;                 // time pins of this tier waited
};

struct LinkStats {
  std::uint64_t bytes = 0;
  std::uint64_t moves = 0;
  double busy_s = 0;  // time with at least one move of this link in flight
};

// One block's counters (Store::block_stats): the bytes its moves copied into each tier (loads,
// write-backs, flushes; a never-written NVMe block's zero fill copies nothing). bytes_in of the
// block's home tier is what was written to its durable copy: 0 for a block whose bytes were never
// written back (a frozen weight that is only read). home_write_bytes: the bytes written into the
// home copy, the moves into the home tier (write-backs, NVMe writes) and the write pins (kWrite,
// kReadWrite) of it, each counted at the block's full size; a block only ever pinned for reading
// after it was written (zero's frozen units) stops counting. Zeroed by Store::reset_stats.
// Store::block_stats of several blocks adds them up (operator+=).
struct BlockStats {
  std::array<std::uint64_t, kTierCount> bytes_in{};
  std::uint64_t home_write_bytes = 0;
  std::uint64_t tier_bytes_in(Tier t) const { return bytes_in[static_cast<std::size_t>(t)]; }
  BlockStats& operator+=(const BlockStats& o) {
    for (std::size_t t = 0; t < kTierCount; ++t) bytes_in[t] += o.bytes_in[t];
    home_write_bytes += o.home_write_bytes;
    return *this;
  }
};

struct StoreStats {
  std::array<TierStats, kTierCount> tiers{};
  std::array<LinkStats, kLinkCount> links{};
  std::uint64_t checksum_failures = 0;
  std::uint64_t io_errors = 0;
  std::uint64_t trace_deviations = 0;  // steps (or parts) that fell back to LRU
  // Dirty copies written home early: at unpin, or asked (write_back); also in write_backs.
  std::uint64_t early_write_backs = 0;
  // Early write-backs that failed and lost nothing (an upper copy still held the bytes, now dirty
  // again, or the next write of the extent replaced them); also in io_errors.
  std::uint64_t early_writes_failed = 0;
  std::uint64_t steps = 0;
  // Read ahead: NVMe bytes read into staging buffers before their device load was decided, and
  // those of them dropped unused (read again later, or never needed); the used ones are counted
  // by their load's link, the dropped ones only here and in nvme_read_bytes.
  std::uint64_t read_ahead_bytes = 0;
  std::uint64_t read_ahead_dropped_bytes = 0;
  // NVMe write bytes whose checksums the block's writer handed in (Lease::release_hashed), so
  // the mover wrote them without hashing them.
  std::uint64_t writer_hashed_bytes = 0;

  const TierStats& tier(Tier t) const { return tiers[static_cast<std::size_t>(t)]; }
  const LinkStats& link(Link l) const { return links[static_cast<std::size_t>(l)]; }
  std::uint64_t nvme_read_bytes() const {
    return link(Link::kNvmeToHost).bytes + link(Link::kNvmeToDevice).bytes +
           read_ahead_dropped_bytes;
  }
  std::uint64_t nvme_write_bytes() const {
    return link(Link::kHostToNvme).bytes + link(Link::kDeviceToNvme).bytes;
  }
  std::uint64_t total_moved_bytes() const {
    std::uint64_t sum = 0;
    for (const LinkStats& l : links) sum += l.bytes;
    return sum;
  }
  // {"tiers": {"device": {...}}, "links": {"nvme_to_host": {...}}, ...}
  std::string to_json() const;
};

}  // namespace tz::store
