// Names of tiers and links, the JSON form of the store's counters, and the store's bookkeeping
// of them (tier use and peaks, link busy time; Store::Impl, under its mutex).
#include "store/stats.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "store/store_impl.h"

namespace tz::store {

BlockStats Store::block_stats(std::span<const BlockId> ids) const {
  std::lock_guard lock(impl_->mu);
  BlockStats sum;
  for (const BlockId id : ids) {
    const auto it = impl_->blocks.find(id);
    if (it != impl_->blocks.end()) sum += it->second.stats;
  }
  return sum;
}

const char* tier_name(Tier tier) {
  switch (tier) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
  }
  return "?";
}

Result<Tier> parse_tier(std::string_view name) {
  if (name == "device") return Tier::kDevice;
  if (name == "host") return Tier::kHost;
  if (name == "nvme") return Tier::kNvme;
  return Status::invalid_argument("unknown tier '" + std::string(name) +
                                  "' (accepted: device, host, nvme)");
}

const char* link_name(Link link) {
  switch (link) {
    case Link::kNvmeToHost: return "nvme_to_host";
    case Link::kHostToNvme: return "host_to_nvme";
    case Link::kNvmeToDevice: return "nvme_to_device";
    case Link::kDeviceToNvme: return "device_to_nvme";
    case Link::kHostToDevice: return "host_to_device";
    case Link::kDeviceToHost: return "device_to_host";
  }
  return "?";
}

std::string StoreStats::to_json() const {
  nlohmann::json j;
  for (std::size_t i = 0; i < kTierCount; ++i) {
    const TierStats& t = tiers[i];
    j["tiers"][tier_name(static_cast<Tier>(i))] = {
        {"budget_bytes", t.budget_bytes}, {"used_bytes", t.used_bytes},
        {"cached_bytes", t.cached_bytes},
        {"peak_bytes", t.peak_bytes},     {"bytes_in", t.bytes_in},
        {"bytes_out", t.bytes_out},       {"hits", t.hits},
        {"misses", t.misses},             {"prefetch_hits", t.prefetch_hits},
        {"prefetches", t.prefetches},     {"evictions", t.evictions},
        {"write_backs", t.write_backs},   {"stall_s", t.stall_s},
        {"fragmentation_evictions", t.fragmentation_evictions}};
  }
  for (std::size_t i = 0; i < kLinkCount; ++i) {
    const LinkStats& l = links[i];
    const double gbps = l.busy_s > 0 ? static_cast<double>(l.bytes) / l.busy_s / 1e9 : 0.0;
    j["links"][link_name(static_cast<Link>(i))] = {
        {"bytes", l.bytes}, {"moves", l.moves}, {"busy_s", l.busy_s}, {"busy_gbps", gbps}};
  }
  j["nvme_read_bytes"] = nvme_read_bytes();
  j["nvme_write_bytes"] = nvme_write_bytes();
  j["checksum_failures"] = checksum_failures;
  j["io_errors"] = io_errors;
  j["trace_deviations"] = trace_deviations;
  j["early_write_backs"] = early_write_backs;
  j["early_writes_failed"] = early_writes_failed;
  j["steps"] = steps;
  j["read_ahead_bytes"] = read_ahead_bytes;
  j["read_ahead_dropped_bytes"] = read_ahead_dropped_bytes;
  j["writer_hashed_bytes"] = writer_hashed_bytes;
  return j.dump();
}

// ---- Store::Impl's counters: tier use and peaks, link busy time -------------------------------

// Tier statistics follow the physical use; kept device buffers are reported apart.
void Store::Impl::update_used(Tier t) {
  TierStats& ts = stats.tiers[ti(t)];
  ts.used_bytes = phys_used[ti(t)] - (t == Tier::kDevice ? dev_cache_bytes : 0);
  ts.cached_bytes = t == Tier::kDevice ? dev_cache_bytes : 0;
  ts.peak_bytes = std::max(ts.peak_bytes, phys_used[ti(t)]);
}

// A whole move of b's bytes from `src` to `dst` landed: the link's, the tiers' and the block's
// counters.
void Store::Impl::count_move(Block& b, Tier src, Tier dst) {
  LinkStats& ls = stats.links[li(link_of(src, dst))];
  ls.bytes += b.bytes;
  ++ls.moves;
  stats.tiers[ti(src)].bytes_out += b.bytes;
  stats.tiers[ti(dst)].bytes_in += b.bytes;
  b.stats.bytes_in[ti(dst)] += b.bytes;
  if (dst == b.home) b.stats.home_write_bytes += b.bytes;
}

void Store::Impl::link_start(Link l) {
  if (link_active[li(l)]++ == 0) link_busy_since[li(l)] = now_s();
}

void Store::Impl::link_end(Link l) {
  TZ_ASSERT(link_active[li(l)] > 0);
  if (--link_active[li(l)] == 0) {
    stats.links[li(l)].busy_s += now_s() - link_busy_since[li(l)];
  }
}

}  // namespace tz::store
