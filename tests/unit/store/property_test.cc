// Seeded property test of the store: random create/destroy/pin/unpin/prefetch/write/step/flush
// sequences over all three tiers with tiny budgets, on HostDevice, through the fault-injecting
// I/O engine (EIO, short transfers, EINTR/EAGAIN, delayed and reordered completions). After every
// operation no budget is exceeded; every successful read equals the last completed write of the
// block (a plain in-memory copy); at the end nothing leaks. Runs over the I/O matrix (engine x
// registered buffers x grouping; the test's name says which), three seeds each; the combination
// and seed are printed with every failure. TZ_STORE_SEED=<n> replays one seed (pick the
// combination with --gtest_filter).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "store/store.h"
#include "store_harness.h"

namespace tz::store {
namespace {

using testing::Harness;
using testing::HarnessOptions;

constexpr std::uint64_t kDeviceBudget = 256 << 10;
constexpr std::uint64_t kHostBudget = 256 << 10;

struct Ref {
  std::vector<std::byte> bytes;  // the last completed write
  Tier home = Tier::kNvme;
};

struct Held {
  Lease lease;
  BlockId id = 0;
  bool writes = false;
  std::vector<std::byte> pending;  // what a write lease will have written at release
};

void check_budgets(Harness& h, std::uint64_t seed, int step) {
  const StoreStats st = h.store->stats();
  ASSERT_LE(st.tier(Tier::kDevice).used_bytes, kDeviceBudget) << "seed " << seed << " op " << step;
  ASSERT_LE(st.tier(Tier::kHost).used_bytes, kHostBudget) << "seed " << seed << " op " << step;
  ASSERT_LE(st.tier(Tier::kDevice).peak_bytes, kDeviceBudget) << "seed " << seed;
  ASSERT_LE(st.tier(Tier::kHost).peak_bytes, kHostBudget) << "seed " << seed;
  ASSERT_LE(h.store->used_bytes(Tier::kDevice), kDeviceBudget) << "seed " << seed;
  ASSERT_LE(h.store->used_bytes(Tier::kHost), kHostBudget) << "seed " << seed;
  ASSERT_LE(h.device->memory_stats().in_use_bytes, kDeviceBudget) << "seed " << seed;
  ASSERT_LE(h.pool->stats().in_use_bytes, h.pool_budget) << "seed " << seed;
}

void run_seed(const testing::IoCase& io, std::uint64_t seed, int ops, Policy policy) {
  const std::string label = testing::io_case_name(io) + " seed " + std::to_string(seed);
  SCOPED_TRACE(label + " policy " + policy_name(policy) +
               " (replay with TZ_STORE_SEED=" + std::to_string(seed) + ")");
  std::printf("store property: %s policy %s (replay with TZ_STORE_SEED=%llu)\n", label.c_str(),
              policy_name(policy), static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  Harness h;
  HarnessOptions o;
  o.store.policy = policy;
  o.store.device_budget_bytes = kDeviceBudget;
  o.store.host_budget_bytes = kHostBudget;
  o.store.chunk_bytes = 16 << 10;
  o.store.staging_buffers = 3;
  o.store.max_io_in_flight_bytes = 64 << 10;
  o.store.write_run_bytes = 64 << 10;
  o.swap_bytes = 32ull << 20;
  nvme::FaultOptions f;
  f.seed = seed;
  f.eio_rate = 0.01;
  f.short_rate = 0.1;
  f.transient_rate = 0.05;
  f.delay_rate = 0.2;
  f.reorder = true;
  o.faults = f;
  testing::apply_io_case(io, o);
  h.init(o);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::map<BlockId, Ref> ref;
  std::vector<Held> held;
  std::uint64_t reads_ok = 0;
  std::uint64_t errors = 0;
  auto fill = [&](std::size_t n) {
    std::vector<std::byte> v(n);
    for (auto& b : v) b = static_cast<std::byte>(rng());
    return v;
  };
  auto release = [&](std::size_t i) {
    Held& x = held[i];
    if (x.writes) ref[x.id].bytes = x.pending;  // the write completes at release
    x.lease.release();
    held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
  };
  auto is_held = [&](BlockId id, bool writers_only = false) {
    for (const Held& x : held) {
      if (x.id == id && (x.writes || !writers_only)) return true;
    }
    return false;
  };
  for (int step = 0; step < ops; ++step) {
    const int what = static_cast<int>(rng() % 100);
    if (what < 8 || ref.empty()) {
      if (ref.size() < 10) {
        const std::uint64_t n = 1 + rng() % (96 << 10);
        const int r = static_cast<int>(rng() % 10);
        const Tier home = r == 0 ? Tier::kDevice : r == 1 ? Tier::kHost : Tier::kNvme;
        auto id = h.store->create_block(n, home, "blk" + std::to_string(step));
        if (id.is_ok()) {
          ref[*id] = Ref{std::vector<std::byte>(n, std::byte{0}), home};
        } else {
          ASSERT_EQ(id.status().code(), ErrorCode::kOutOfMemory) << id.status().to_string();
        }
      }
    } else if (what < 12) {
      auto it = std::next(ref.begin(), static_cast<std::ptrdiff_t>(rng() % ref.size()));
      if (!is_held(it->first)) {
        ASSERT_TRUE(h.store->destroy_block(it->first).is_ok());
        ref.erase(it);
      }
    } else if (what < 20) {
      if (!held.empty()) release(rng() % held.size());
    } else if (what < 26) {
      auto it = std::next(ref.begin(), static_cast<std::ptrdiff_t>(rng() % ref.size()));
      const Tier t = static_cast<Tier>(rng() % (static_cast<int>(it->second.home) + 1));
      ASSERT_TRUE(h.store->prefetch(it->first, t).is_ok());
    } else if (what < 28) {
      h.store->mark_step();
    } else if (what < 30) {
      // Writes every dirty copy home while other leases are held; an injected EIO may fail it.
      Status st = h.store->flush();
      if (!st.is_ok()) {
        ASSERT_TRUE(st.code() == ErrorCode::kIoError || st.code() == ErrorCode::kCorrupt)
            << "seed " << seed << ": " << st.to_string();
        ++errors;
      }
    } else {
      auto it = std::next(ref.begin(), static_cast<std::ptrdiff_t>(rng() % ref.size()));
      const BlockId id = it->first;
      const int home = static_cast<int>(it->second.home);
      const Tier t = static_cast<Tier>(rng() % (std::min(home, 1) + 1));  // device or host
      const int a = static_cast<int>(rng() % 3);
      const Access access = a == 0 ? Access::kRead : a == 1 ? Access::kReadWrite : Access::kWrite;
      // A block held by a writer has no completed value to compare with until it is released.
      auto lease = is_held(id, true) ? Result<Lease>(Status::invalid_argument("held by a writer"))
                                     : h.store->pin(id, t, access);
      if (!lease.is_ok()) {
        // Budget full of pins, a conflicting write pin, or a block that lost its bytes.
        const ErrorCode c = lease.status().code();
        ASSERT_TRUE(c == ErrorCode::kOutOfMemory || c == ErrorCode::kInvalidArgument ||
                    c == ErrorCode::kIoError || c == ErrorCode::kCorrupt)
            << "seed " << seed << ": " << lease.status().to_string();
        ++errors;
      } else {
        Status st = lease->wait();
        if (!st.is_ok()) {
          ++errors;
          lease->release();
        } else {
          const std::size_t n = it->second.bytes.size();
          if (access != Access::kWrite) {
            ASSERT_EQ(std::memcmp(lease->data(), it->second.bytes.data(), n), 0)
                << "seed " << seed << " op " << step << ": block " << id << " pinned in "
                << tier_name(t) << " does not hold its last write";
            ++reads_ok;
          }
          Held x;
          x.id = id;
          x.writes = access != Access::kRead;
          if (x.writes) {
            x.pending = fill(n);
            std::memcpy(lease->data(), x.pending.data(), n);
          }
          x.lease = std::move(lease).value();
          held.push_back(std::move(x));
          if (held.size() > 2 || rng() % 2) release(rng() % held.size());
        }
      }
    }
    check_budgets(h, seed, step);
    if (Status inv = h.store->check_invariants(); !inv.is_ok()) {
      FAIL() << "seed " << seed << " op " << step << ": " << inv.to_string();
    }
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
  }
  while (!held.empty()) release(0);
  for (const auto& [id, r] : ref) ASSERT_TRUE(h.store->destroy_block(id).is_ok());
  ASSERT_TRUE(h.store->drain().is_ok());
  const StoreStats st = h.store->stats();
  EXPECT_EQ(st.tier(Tier::kNvme).used_bytes, 0u) << "swap extents leaked, seed " << seed;
  EXPECT_EQ(st.tier(Tier::kHost).used_bytes, 0u) << "host copies leaked, seed " << seed;
  EXPECT_EQ(st.tier(Tier::kDevice).used_bytes, 0u) << "device copies leaked, seed " << seed;
  EXPECT_EQ(h.store->used_bytes(Tier::kNvme), 0u);
  std::printf("  %llu verified reads, %llu errors, %llu injected EIO, %llu checksum failures\n",
              static_cast<unsigned long long>(reads_ok), static_cast<unsigned long long>(errors),
              static_cast<unsigned long long>(h.fault ? h.fault->counts().eio : 0),
              static_cast<unsigned long long>(st.checksum_failures));
  EXPECT_GT(reads_ok, 0u);
  h.finish();
}

class StoreProperty : public ::testing::TestWithParam<testing::IoCase> {};

TEST_P(StoreProperty, RandomOperationsKeepBudgetsDataAndNoLeaks) {
  if (const char* s = std::getenv("TZ_STORE_SEED")) {
    const std::uint64_t seed = std::strtoull(s, nullptr, 10);
    run_seed(GetParam(), seed, 400, seed % 3 == 0 ? Policy::kLru : Policy::kTrace);
    return;
  }
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    run_seed(GetParam(), seed, 400, seed % 3 == 0 ? Policy::kLru : Policy::kTrace);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, StoreProperty, ::testing::ValuesIn(testing::io_cases()),
                         testing::io_param_name);

}  // namespace
}  // namespace tz::store
