// The machine's CPU topology as hwloc sees it (packages, cores, PUs, NUMA nodes with their
// memory and cpusets) and ThreadArena, a oneTBB arena whose threads are bound to cores with
// hwloc, so CPU optimizer work runs on the cores (and NUMA node) next to the memory it updates.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>
#include <oneapi/tbb/task_arena.h>

#include "core/status.h"

namespace tz::cpu {

// hwloc's view of the machine; move-only owner of an hwloc topology.
class Topology {
 public:
  // Loads the topology of this machine. kInternal with hwloc's errno when hwloc fails.
  static Result<Topology> create();

  Topology(Topology&&) noexcept;
  Topology& operator=(Topology&&) noexcept;
  ~Topology();

  int packages() const;
  int cores() const;
  int pus() const;
  int numa_nodes() const;  // at least 1
  // Cores whose PUs lie in NUMA node `node` (by logical index; -1 = all cores).
  int cores_in_node(int node) const;
  // Logical index of the NUMA node holding the pages of [addr, addr + bytes) (the first such
  // node when they are spread), for OptimizerOptions::numa_node / ArenaOptions::numa_node.
  // Pages not yet touched have no node: kNotFound. kUnavailable when the OS cannot tell.
  Result<int> numa_node_of(const void* addr, std::size_t bytes) const;
  // {"packages": P, "cores": C, "pus": U, "numa_nodes": [{"os_index", "memory_bytes",
  //  "cpuset": "0-1", "cores"}...], "process_cpuset": "0-1"}.
  nlohmann::json report() const;

  // The hwloc_topology_t, for ThreadArena (opaque here so hwloc.h stays out of this header).
  void* handle() const { return topo_; }

 private:
  explicit Topology(void* topo) : topo_(topo) {}
  void* topo_ = nullptr;
};

// topology_report() for `tierzero info`: the report of Topology::create(), or
// {"error": "..."} when hwloc cannot load the topology.
nlohmann::json topology_report();

struct ArenaOptions {
  int threads = 0;         // 0 = one per core of the chosen cores
  bool pin = true;         // bind worker slot i to core i (mod the core count) while in the arena
  int numa_node = -1;      // >= 0: use only that node's cores (logical index)
};

// A oneTBB task_arena of `threads` slots. With pinning, each thread that enters the arena is
// bound to one core (slot i -> core i mod cores) and gets its previous binding back when it
// leaves, so the caller's thread and TBB's shared workers are not left pinned. Move-only.
class ThreadArena {
 public:
  // kInvalidArgument for threads < 0 or a numa_node that does not exist; hwloc errors as
  // Topology::create. Threads beyond the hardware concurrency are allowed (oversubscribed).
  static Result<ThreadArena> create(const ArenaOptions& options);

  ThreadArena(ThreadArena&&) noexcept;
  ThreadArena& operator=(ThreadArena&&) noexcept;
  ~ThreadArena();

  int threads() const;
  // Cores the arena's threads are bound to (0 when not pinned).
  int pinned_cores() const;

  // Runs f() inside the arena (blocking); parallel algorithms called from f use its threads.
  template <class F>
  void execute(F&& f) {
    arena().execute(std::forward<F>(f));
  }
  tbb::task_arena& arena();

 private:
  struct Impl;
  explicit ThreadArena(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tz::cpu
