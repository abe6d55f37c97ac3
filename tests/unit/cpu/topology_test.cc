// hwloc topology report and the pinned arena: workers run on the arena's cores, and the thread
// that called execute() gets its own CPU affinity back afterwards.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <oneapi/tbb/parallel_for.h>

#include "cpu/topology.h"

namespace tz::cpu {
namespace {

TEST(Topology, ReportIsConsistent) {
  Result<Topology> topo = Topology::create();
  ASSERT_TRUE(topo.is_ok()) << topo.status().to_string();
  const nlohmann::json r = topo->report();
  std::printf("%s\n", r.dump().c_str());
  EXPECT_GE(r["packages"].get<int>(), 1);
  EXPECT_GE(r["cores"].get<int>(), 1);
  EXPECT_GE(r["pus"].get<int>(), r["cores"].get<int>());
  ASSERT_TRUE(r["numa_nodes"].is_array());
  ASSERT_GE(r["numa_nodes"].size(), 1u);
  int cores_in_nodes = 0;
  for (const auto& node : r["numa_nodes"]) {
    EXPECT_GT(node["memory_bytes"].get<std::uint64_t>(), 0u);
    EXPECT_FALSE(node["cpuset"].get<std::string>().empty());
    cores_in_nodes += node["cores"].get<int>();
  }
  EXPECT_EQ(cores_in_nodes, r["cores"].get<int>());
  EXPECT_EQ(topology_report()["cores"], r["cores"]);
}

TEST(Topology, NumaNodeOfTouchedMemory) {
  Result<Topology> topo = Topology::create();
  ASSERT_TRUE(topo.is_ok());
  std::vector<char> buf(1 << 20, 1);  // touched, so every page has a node
  Result<int> node = topo->numa_node_of(buf.data(), buf.size());
  if (!node.is_ok() && node.status().code() == ErrorCode::kUnavailable) {
    GTEST_SKIP() << "the OS cannot report page locations: " << node.status().to_string();
  }
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  EXPECT_GE(*node, 0);
  EXPECT_LT(*node, topo->numa_nodes());
  // The node reported is one the arena accepts.
  ArenaOptions o;
  o.numa_node = *node;
  EXPECT_TRUE(ThreadArena::create(o).is_ok());
}

bool same_affinity(const cpu_set_t& a, const cpu_set_t& b) { return CPU_EQUAL(&a, &b) != 0; }

TEST(ThreadArena, PinsWorkersAndRestoresTheCaller) {
  cpu_set_t before;
  ASSERT_EQ(0, sched_getaffinity(0, sizeof(before), &before));
  Result<ThreadArena> arena = ThreadArena::create({});
  ASSERT_TRUE(arena.is_ok()) << arena.status().to_string();
  EXPECT_GE(arena->threads(), 1);
  std::mutex mu;
  std::set<int> single_cpu_threads;
  std::atomic<int> unpinned{0};
  arena->execute([&] {
    tbb::parallel_for(0, 64, [&](int) {
      cpu_set_t mine;
      if (sched_getaffinity(0, sizeof(mine), &mine) != 0) return;
      if (arena->pinned_cores() > 0 && CPU_COUNT(&mine) > CPU_COUNT(&before)) ++unpinned;
      std::lock_guard<std::mutex> lock(mu);
      if (CPU_COUNT(&mine) == 1) single_cpu_threads.insert(sched_getcpu());
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    });
  });
  EXPECT_EQ(unpinned.load(), 0);
  std::printf("pinned cores: %d, threads: %d, distinct single-cpu placements seen: %zu\n",
              arena->pinned_cores(), arena->threads(), single_cpu_threads.size());
  cpu_set_t after;
  ASSERT_EQ(0, sched_getaffinity(0, sizeof(after), &after));
  EXPECT_TRUE(same_affinity(before, after)) << "the caller's affinity was not restored";
}

TEST(ThreadArena, RejectsBadOptions) {
  ArenaOptions bad;
  bad.threads = -1;
  EXPECT_EQ(ThreadArena::create(bad).status().code(), ErrorCode::kInvalidArgument);
  ArenaOptions node;
  node.numa_node = 4096;
  EXPECT_EQ(ThreadArena::create(node).status().code(), ErrorCode::kInvalidArgument);
  ArenaOptions seven;
  seven.threads = 7;  // more than this machine's cores: allowed, oversubscribed
  Result<ThreadArena> a = ThreadArena::create(seven);
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->threads(), 7);
}

}  // namespace
}  // namespace tz::cpu
