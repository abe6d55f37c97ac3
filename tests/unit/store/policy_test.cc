// The trace-driven policy against LRU on the stage-3 training access pattern, in exact byte
// counts: every placement is decided inside pin()/mark_step(), so the bytes a call sequence moves
// are the same on every run whatever the timing. The counts cover steps 2.. and a final flush (the
// bytes that make the last step durable). Belady's rule must never move more bytes than
// LRU, and strictly fewer when the host tier holds only part of the model.
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

#include "store/store.h"
#include "store/walk.h"
#include "store_harness.h"

namespace tz::store {
namespace {

using testing::Harness;
using testing::HarnessOptions;

struct Pattern {
  int layers = 12;
  std::uint64_t block_bytes = 64 << 10;
  int device_blocks = 3;  // device budget in blocks
  int host_blocks = 4;    // host budget in blocks
  int steps = 4;
};

struct Moved {
  std::uint64_t nvme_read = 0;
  std::uint64_t nvme_write = 0;
  std::uint64_t total = 0;
  std::uint64_t read_ahead = 0;
  std::uint64_t read_ahead_dropped = 0;
};

// The stage-3 walk (store/walk.h) over one store. Every block is written once first (write-only
// pins, a step of its own) so that it has real bytes on NVMe.
struct Walk {
  Harness h;
  std::vector<BlockId> ids;

  // False when the set-up failed (the failure is already reported).
  bool init(const Pattern& p, Policy policy,
            std::uint32_t host_prefetch_depth = StoreOptions{}.host_prefetch_depth,
            std::uint32_t read_ahead = StoreOptions{}.read_ahead_buffers) {
    HarnessOptions o;
    o.store.policy = policy;
    o.store.device_budget_bytes = p.device_blocks * p.block_bytes;
    o.store.host_budget_bytes = p.host_blocks * p.block_bytes;
    o.store.chunk_bytes = 32 << 10;
    o.store.staging_buffers = 4;
    o.store.host_prefetch_depth = host_prefetch_depth;
    o.store.read_ahead_buffers = read_ahead;
    o.swap_bytes = 16ull << 20;
    h.init(o);
    if (::testing::Test::HasFatalFailure()) return false;
    for (int i = 0; i < p.layers; ++i) {
      auto id = h.store->create_block(p.block_bytes, Tier::kNvme, "p" + std::to_string(i));
      EXPECT_TRUE(id.is_ok());
      if (!id.is_ok()) return false;
      ids.push_back(*id);
    }
    for (int i = 0; i < p.layers; ++i) touch(i, Access::kWrite);
    h.store->mark_step();
    return true;
  }
  void touch(int i, Access a) {
    auto l = h.store->pin(ids[static_cast<std::size_t>(i)], Tier::kDevice, a);
    EXPECT_TRUE(l.is_ok()) << l.status().to_string();
    if (!l.is_ok()) return;
    EXPECT_TRUE(l->wait().is_ok());
  }
  Status visit(const Visit& v) {
    touch(v.layer, v.access);
    return Status::ok();  // a failed pin is a test failure already
  }
  int layers() const { return static_cast<int>(ids.size()); }
  void forward() { (void)walk_forward(layers(), [this](const Visit& v) { return visit(v); }); }
  // Backward from the last layer down to `last`.
  void backward(int last = 0) {
    (void)walk_backward(layers(), [this](const Visit& v) { return visit(v); }, last);
  }
  void step() {
    (void)walk_step(layers(), [this](const Visit& v) { return visit(v); });
    h.store->mark_step();
  }
};

// Counts the bytes of steps 2.. (step 1 records the trace).
Moved run(const Pattern& p, Policy policy,
          std::uint32_t read_ahead = StoreOptions{}.read_ahead_buffers) {
  Walk w;
  if (!w.init(p, policy, StoreOptions{}.host_prefetch_depth, read_ahead)) return {};
  for (int s = 0; s < p.steps; ++s) {
    if (s == 1) {
      EXPECT_TRUE(w.h.store->drain().is_ok());
      w.h.store->reset_stats();
    }
    w.step();
  }
  // Dirty copies still cached are written home too: a policy that writes early is not charged for
  // writes another one merely left for after the last step.
  EXPECT_TRUE(w.h.store->flush().is_ok());
  const StoreStats st = w.h.store->stats();
  Moved m;
  m.nvme_read = st.nvme_read_bytes();
  m.nvme_write = st.nvme_write_bytes();
  m.total = st.total_moved_bytes();
  m.read_ahead = st.read_ahead_bytes;
  m.read_ahead_dropped = st.read_ahead_dropped_bytes;
  w.h.finish();
  return m;
}

void compare(const Pattern& p, bool expect_strict) {
  const Moved t = run(p, Policy::kTrace);
  const Moved l = run(p, Policy::kLru);
  std::printf("layers %d, device %d blocks, host %d blocks: trace nvme r/w %llu/%llu total %llu;"
              " lru nvme r/w %llu/%llu total %llu\n",
              p.layers, p.device_blocks, p.host_blocks,
              static_cast<unsigned long long>(t.nvme_read),
              static_cast<unsigned long long>(t.nvme_write),
              static_cast<unsigned long long>(t.total),
              static_cast<unsigned long long>(l.nvme_read),
              static_cast<unsigned long long>(l.nvme_write),
              static_cast<unsigned long long>(l.total));
  EXPECT_LE(t.nvme_read + t.nvme_write, l.nvme_read + l.nvme_write);
  EXPECT_LE(t.total, l.total);
  if (expect_strict) {
    EXPECT_LT(t.nvme_read + t.nvme_write, l.nvme_read + l.nvme_write);
  }
}

// The walk's order, written out: forward reads 0..2, backward rewrites 2..0; an error stops it.
TEST(StorePolicy, WalkVisitsForwardThenBackward) {
  std::vector<Visit> seen;
  auto record = [&](const Visit& v) {
    seen.push_back(v);
    return Status::ok();
  };
  ASSERT_TRUE(walk_step(3, record).is_ok());
  const std::vector<Visit> want = {
      {Pass::kForward, 0, Access::kRead},       {Pass::kForward, 1, Access::kRead},
      {Pass::kForward, 2, Access::kRead},       {Pass::kBackward, 2, Access::kReadWrite},
      {Pass::kBackward, 1, Access::kReadWrite}, {Pass::kBackward, 0, Access::kReadWrite}};
  EXPECT_EQ(seen, want);
  seen.clear();
  ASSERT_TRUE(walk_backward(4, record, 2).is_ok());
  EXPECT_EQ(seen, (std::vector<Visit>{{Pass::kBackward, 3, Access::kReadWrite},
                                      {Pass::kBackward, 2, Access::kReadWrite}}));
  int calls = 0;
  const Status st = walk_step(3, [&](const Visit& v) {
    ++calls;
    return v.pass == Pass::kBackward ? Status::internal("stop") : Status::ok();
  });
  EXPECT_FALSE(st.is_ok());
  EXPECT_EQ(calls, 4);
}

TEST(StorePolicy, TraceMovesStrictlyFewerBytesWhenHostHoldsPartOfTheModel) {
  compare(Pattern{12, 64 << 10, 3, 4, 4}, true);
  compare(Pattern{16, 64 << 10, 2, 6, 3}, true);
  compare(Pattern{10, 96 << 10, 2, 3, 3}, true);
  compare(Pattern{6, 64 << 10, 1, 4, 3}, true);
}

TEST(StorePolicy, TraceNeverMovesMoreThanLru) {
  compare(Pattern{8, 64 << 10, 2, 8, 3}, false);   // host holds the whole model
  compare(Pattern{8, 64 << 10, 8, 1, 3}, false);   // device holds the whole model
  compare(Pattern{10, 64 << 10, 2, 0, 3}, false);  // no host tier
  compare(Pattern{10, 64 << 10, 1, 1, 3}, false);  // almost nothing fits
}

// With the device window full (two blocks, no host tier), the next NVMe reads are started into
// staging buffers and their loads take them: pieces are read ahead, none is dropped, and the
// disk moves the same bytes as without read ahead.
TEST(StorePolicy, ReadAheadFeedsTheLoadsAndReadsNothingTwice) {
  const Pattern p{10, 64 << 10, 2, 0, 4};
  const Moved ahead = run(p, Policy::kTrace);
  const Moved plain = run(p, Policy::kTrace, 0);
  std::printf("read ahead %llu B (dropped %llu); nvme r/w %llu/%llu, without %llu/%llu\n",
              static_cast<unsigned long long>(ahead.read_ahead),
              static_cast<unsigned long long>(ahead.read_ahead_dropped),
              static_cast<unsigned long long>(ahead.nvme_read),
              static_cast<unsigned long long>(ahead.nvme_write),
              static_cast<unsigned long long>(plain.nvme_read),
              static_cast<unsigned long long>(plain.nvme_write));
  EXPECT_GT(ahead.read_ahead, 0u);
  EXPECT_EQ(ahead.read_ahead_dropped, 0u);
  EXPECT_EQ(ahead.nvme_read, plain.nvme_read);
  EXPECT_EQ(ahead.nvme_write, plain.nvme_write);
  EXPECT_EQ(plain.read_ahead, 0u);
}

TEST(StorePolicy, ByteCountsAreDeterministic) {
  const Pattern p{12, 64 << 10, 3, 4, 3};
  const Moved a = run(p, Policy::kTrace);
  const Moved b = run(p, Policy::kTrace);
  EXPECT_EQ(a.nvme_read, b.nvme_read);
  EXPECT_EQ(a.nvme_write, b.nvme_write);
  EXPECT_EQ(a.total, b.total);
}

// NVMe reads of the backward pass's last layers start while the layers before them still come
// from the host tier: with 4 device and 8 host slots for 16 layers, the backward pass finds 11..4
// in the host and 3..0 on NVMe. When it has reached layer 8, two device slots already hold reads of
// layers 3 and 2 (the host loads keep the other two); Belady's window alone would hold 8..5 and
// start no read yet.
std::uint64_t backward_reads_by_layer_8(std::uint32_t host_prefetch_depth) {
  const Pattern p{16, 64 << 10, 4, 8, 0};
  Walk w;
  if (!w.init(p, Policy::kTrace, host_prefetch_depth)) return 0;
  for (int s = 0; s < 3; ++s) w.step();  // step 1 records, steps 2 and 3 follow
  w.forward();
  EXPECT_TRUE(w.h.store->drain().is_ok());
  const std::uint64_t before = w.h.store->stats().nvme_read_bytes();
  w.backward(8);
  EXPECT_TRUE(w.h.store->drain().is_ok());
  const std::uint64_t reads = w.h.store->stats().nvme_read_bytes() - before;
  EXPECT_TRUE(w.h.store->following_trace());
  w.h.finish();
  return reads / p.block_bytes;
}

TEST(StorePolicy, NvmeLoadsStartWhileHostLoadsComeFirst) {
  EXPECT_EQ(backward_reads_by_layer_8(StoreOptions{}.host_prefetch_depth), 2u);
  EXPECT_EQ(backward_reads_by_layer_8(std::numeric_limits<std::uint32_t>::max()), 0u);
}

// The engine's streamed update on one device: each layer's host copy is updated (a read-write host
// pin, untraced as the update worker's, which makes its device copy stale and frees that room)
// just before the forward pins it on
// the device; the backward pins the layers in reverse, then one more NVMe-homed block `x` that the
// host tier cannot hold. The forward's loads come from the host, past host_prefetch_depth only
// NVMe loads start: the walk may start x's load only into room the forward's next loads leave it,
// or that load is the farthest copy when the next one comes, evicted for it, and started again.
// Returns how many times x was loaded to the device in the two steps after the recording one.
std::uint64_t far_nvme_loads_while_updates_free_room() {
  Harness h;
  constexpr int kLayers = 8;
  constexpr std::uint64_t kBytes = 64 << 10;
  HarnessOptions o;
  o.store.device_budget_bytes = 4 * kBytes;
  o.store.host_budget_bytes = kLayers * kBytes;
  o.store.chunk_bytes = 32 << 10;
  o.swap_bytes = 16ull << 20;
  h.init(o);
  if (::testing::Test::HasFatalFailure()) return 0;
  std::vector<BlockId> layers;
  for (int i = 0; i < kLayers; ++i) {
    layers.push_back(*h.store->create_block(kBytes, Tier::kNvme, "p" + std::to_string(i)));
  }
  const BlockId x = *h.store->create_block(kBytes, Tier::kNvme, "x");
  const auto pin = [&](BlockId id, Tier t, Access a) {
    auto l = h.store->pin(id, t, a);
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    ASSERT_TRUE(l->wait().is_ok());
  };
  for (BlockId id : layers) pin(id, Tier::kHost, Access::kWrite);
  pin(x, Tier::kDevice, Access::kWrite);
  EXPECT_TRUE(h.store->flush().is_ok());
  h.store->mark_step();
  const auto step = [&] {
    for (BlockId id : layers) {
      {
        const UntracedPins untraced;  // the update worker's pins
        pin(id, Tier::kHost, Access::kReadWrite);
      }
      pin(id, Tier::kDevice, Access::kRead);
    }
    for (int i = kLayers - 1; i >= 0; --i) {
      pin(layers[static_cast<std::size_t>(i)], Tier::kDevice, Access::kRead);
    }
    pin(x, Tier::kDevice, Access::kRead);
    EXPECT_TRUE(h.store->drain().is_ok());
    h.store->mark_step();
  };
  step();  // records the trace
  const std::uint64_t before = h.store->block_stats(x)->tier_bytes_in(Tier::kDevice);
  step();
  step();
  EXPECT_TRUE(h.store->following_trace());
  const std::uint64_t loads =
      (h.store->block_stats(x)->tier_bytes_in(Tier::kDevice) - before) / kBytes;
  h.finish();
  return loads;
}

TEST(StorePolicy, AnNvmeLoadPastSkippedHostLoadsKeepsItsRoom) {
  EXPECT_EQ(far_nvme_loads_while_updates_free_room(), 2u);  // once a step
}

// A store of 64 KiB blocks with a device tier of two and a host tier of `host_blocks`, and six
// NVMe-homed blocks: the small trace walks below.
std::vector<BlockId> six_blocks(Harness& h, int host_blocks) {
  HarnessOptions o;
  o.store.device_budget_bytes = 2 * (64 << 10);
  o.store.host_budget_bytes = static_cast<std::uint64_t>(host_blocks) * (64 << 10);
  o.store.chunk_bytes = 32 << 10;
  h.init(o);
  std::vector<BlockId> ids;
  if (::testing::Test::HasFatalFailure()) return ids;
  for (int i = 0; i < 6; ++i) ids.push_back(*h.store->create_block(64 << 10, Tier::kNvme, "b"));
  return ids;
}

// The trace walk of DeviationFallsBackAndReRecords with a second thread pinning another block
// at a different point of each step (the engine's update worker does so): inside an UntracedPins
// scope its pins leave the trace alone; outside one the step leaves the trace.
std::uint64_t deviations_with_a_second_thread(bool untraced) {
  Harness h;
  const std::vector<BlockId> ids = six_blocks(h, 3);
  if (ids.empty()) return 0;
  const BlockId other = *h.store->create_block(64 << 10, Tier::kNvme, "worker");
  const auto worker_pin = [&] {
    std::thread t([&] {
      std::optional<UntracedPins> scope;
      if (untraced) scope.emplace();
      auto l = h.store->pin(other, Tier::kHost, Access::kReadWrite);
      EXPECT_TRUE(l.is_ok());
      if (l.is_ok()) {
        EXPECT_TRUE(l->wait().is_ok());
      }
    });
    t.join();
  };
  for (int step = 0; step < 4; ++step) {
    for (int i = 0; i < 6; ++i) {
      if (i == step + 1) worker_pin();  // a different point of every step
      auto l = h.store->pin(ids[static_cast<std::size_t>(i)], Tier::kDevice, Access::kRead);
      EXPECT_TRUE(l.is_ok());
      if (l.is_ok()) {
        EXPECT_TRUE(l->wait().is_ok());
      }
    }
    h.store->mark_step();
  }
  const std::uint64_t deviations = h.store->stats().trace_deviations;
  h.finish();
  return deviations;
}

TEST(StorePolicy, UntracedPinsOfAnotherThreadLeaveTheTraceAlone) {
  EXPECT_EQ(deviations_with_a_second_thread(true), 0u);
  EXPECT_EQ(deviations_with_a_second_thread(false), 3u);  // steps 2-4 each leave it
}

// One host pin, waited for; `untraced`: inside an UntracedPins scope, as the engine's update
// worker pins its states.
void pin_host(Harness& h, BlockId id, Access access, bool untraced = false) {
  std::optional<UntracedPins> scope;
  if (untraced) scope.emplace();
  auto l = h.store->pin(id, Tier::kHost, access);
  ASSERT_TRUE(l.is_ok());
  ASSERT_TRUE(l->wait().is_ok());
}

// The kept-copy tests' start: every block gets bytes on NVMe (`states` through untraced pins),
// then two traced steps read six_blocks' blocks through three host slots, so that the store
// follows a trace in which the states never appear.
void follow_a_trace_without(Harness& h, const std::vector<BlockId>& ids,
                            std::initializer_list<BlockId> states) {
  for (BlockId id : ids) ASSERT_NO_FATAL_FAILURE(pin_host(h, id, Access::kWrite));
  for (BlockId id : states) ASSERT_NO_FATAL_FAILURE(pin_host(h, id, Access::kWrite, true));
  ASSERT_TRUE(h.store->flush().is_ok());
  h.store->mark_step();
  for (int step = 0; step < 2; ++step) {
    for (BlockId id : ids) ASSERT_NO_FATAL_FAILURE(pin_host(h, id, Access::kRead));
    h.store->mark_step();
  }
  ASSERT_TRUE(h.store->following_trace());
}

// A copy Store::prefetch loaded for a block that only untraced pins use has no next use in the
// trace; it is kept until its pin, not taken first by Belady's eviction of the traced pins that
// turn the host tier over meanwhile. The prefetch makes its room from a copy the trace never uses
// again (the state the untraced thread updated before it), as the engine's update worker does.
TEST(StorePolicy, PrefetchedCopyOfAnUntracedBlockIsKeptUntilItsPin) {
  Harness h;
  const std::vector<BlockId> ids = six_blocks(h, 3);
  ASSERT_FALSE(ids.empty());
  const BlockId updated = *h.store->create_block(64 << 10, Tier::kNvme, "state 1");
  const BlockId next = *h.store->create_block(64 << 10, Tier::kNvme, "state 2");
  ASSERT_NO_FATAL_FAILURE(follow_a_trace_without(h, ids, {updated, next}));
  // its copy stays dirty, with no use in the trace
  ASSERT_NO_FATAL_FAILURE(pin_host(h, updated, Access::kReadWrite, true));
  ASSERT_TRUE(h.store->prefetch(next, Tier::kHost).is_ok());
  ASSERT_TRUE(h.store->drain().is_ok());
  const std::uint64_t loaded = h.store->block_stats(next)->tier_bytes_in(Tier::kHost);
  ASSERT_EQ(loaded, 64u << 10) << "the prefetch did not take the updated state's room";
  for (std::size_t i = 0; i < 3; ++i) {  // half the step: the host tier turns over
    ASSERT_NO_FATAL_FAILURE(pin_host(h, ids[i], Access::kRead));
  }
  ASSERT_NO_FATAL_FAILURE(pin_host(h, next, Access::kReadWrite, true));
  EXPECT_EQ(h.store->block_stats(next)->tier_bytes_in(Tier::kHost), loaded)
      << "the prefetched copy was evicted and read again at its pin";
  EXPECT_TRUE(h.store->following_trace());
  h.finish();
}

// Store::keep of an untraced block's copy current in the tier keeps it until its next pin, as a
// copy Store::prefetch loaded would be: the room another prefetch makes comes from the other
// untraced copy, not from the kept one (the lower block id, which untraced copies' equal keys
// would give up first), and traced pins that turn the tier over leave it too.
TEST(StorePolicy, KeepHoldsACurrentCopyUntilItsPin) {
  Harness h;
  const std::vector<BlockId> ids = six_blocks(h, 3);
  ASSERT_FALSE(ids.empty());
  const BlockId kept = *h.store->create_block(64 << 10, Tier::kNvme, "state kept");
  const BlockId other = *h.store->create_block(64 << 10, Tier::kNvme, "state other");
  const BlockId next = *h.store->create_block(64 << 10, Tier::kNvme, "state next");
  ASSERT_NO_FATAL_FAILURE(follow_a_trace_without(h, ids, {kept, other, next}));
  // updated: current in the host tier only
  ASSERT_NO_FATAL_FAILURE(pin_host(h, kept, Access::kReadWrite, true));
  ASSERT_TRUE(h.store->keep(kept, Tier::kHost).is_ok());
  ASSERT_NO_FATAL_FAILURE(pin_host(h, other, Access::kReadWrite, true));
  const std::uint64_t other_home = h.store->block_stats(other)->tier_bytes_in(Tier::kNvme);
  ASSERT_TRUE(h.store->prefetch(next, Tier::kHost).is_ok());
  ASSERT_TRUE(h.store->drain().is_ok());
  EXPECT_GT(h.store->block_stats(other)->tier_bytes_in(Tier::kNvme), other_home)
      << "the other untraced copy did not give the room";
  EXPECT_EQ(h.store->block_stats(next)->tier_bytes_in(Tier::kHost), 64u << 10)
      << "the prefetch found no room";
  const std::uint64_t kept_in = h.store->block_stats(kept)->tier_bytes_in(Tier::kHost);
  for (std::size_t i = 0; i < 3; ++i) {  // half a traced step
    ASSERT_NO_FATAL_FAILURE(pin_host(h, ids[i], Access::kRead));
    // The kept copies' eviction keys hold as the trace moves.
    ASSERT_TRUE(h.store->check_invariants().is_ok()) << h.store->check_invariants().to_string();
  }
  ASSERT_NO_FATAL_FAILURE(pin_host(h, kept, Access::kReadWrite, true));
  EXPECT_EQ(h.store->block_stats(kept)->tier_bytes_in(Tier::kHost), kept_in)
      << "the kept copy was evicted and read again at its pin";
  h.finish();
}

TEST(StorePolicy, DeviationFallsBackAndReRecords) {
  Harness h;
  const std::vector<BlockId> ids = six_blocks(h, 2);
  ASSERT_FALSE(ids.empty());
  auto walk = [&](const std::vector<int>& order) {
    for (int i : order) {
      auto l = h.store->pin(ids[static_cast<std::size_t>(i)], Tier::kDevice, Access::kRead);
      ASSERT_TRUE(l.is_ok());
      ASSERT_TRUE(l->wait().is_ok());
    }
    h.store->mark_step();
  };
  walk({0, 1, 2, 3, 4, 5});
  EXPECT_TRUE(h.store->following_trace());
  walk({0, 1, 2, 3, 4, 5});
  EXPECT_EQ(h.store->stats().trace_deviations, 0u);
  {
    auto l = h.store->pin(ids[5], Tier::kDevice, Access::kRead);  // not what the trace says
    ASSERT_TRUE(l.is_ok());
  }
  EXPECT_FALSE(h.store->following_trace());
  EXPECT_EQ(h.store->stats().trace_deviations, 1u);
  walk({4, 3, 2, 1, 0});
  EXPECT_TRUE(h.store->following_trace());  // the new order became the trace
  walk({5, 4, 3, 2, 1, 0});
  EXPECT_EQ(h.store->stats().trace_deviations, 1u);
  h.finish();
}

}  // namespace
}  // namespace tz::store
