// hwloc topology queries and the pinned oneTBB arena (topology.h).
#include "cpu/topology.h"

#include <hwloc.h>

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include "core/log.h"

namespace tz::cpu {
namespace {

hwloc_topology_t as_topo(void* p) { return static_cast<hwloc_topology_t>(p); }

std::string cpuset_string(hwloc_const_bitmap_t set) {
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || text == nullptr) return "?";
  std::string out(text);
  std::free(text);  // NOLINT(cppcoreguidelines-no-malloc): hwloc allocates with malloc
  return out;
}

int count_of(hwloc_topology_t topo, hwloc_obj_type_t type) {
  const int n = hwloc_get_nbobjs_by_type(topo, type);
  return n < 0 ? 0 : n;
}

}  // namespace

Result<Topology> Topology::create() {
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) {
    return Status(ErrorCode::kInternal, errno, "hwloc_topology_init failed");
  }
  if (hwloc_topology_load(topo) != 0) {
    const int err = errno;
    hwloc_topology_destroy(topo);
    return Status(ErrorCode::kInternal, err, "hwloc_topology_load failed");
  }
  return Topology(topo);
}

Topology::Topology(Topology&& other) noexcept : topo_(std::exchange(other.topo_, nullptr)) {}
Topology& Topology::operator=(Topology&& other) noexcept {
  if (this != &other) {
    if (topo_ != nullptr) hwloc_topology_destroy(as_topo(topo_));
    topo_ = std::exchange(other.topo_, nullptr);
  }
  return *this;
}
Topology::~Topology() {
  if (topo_ != nullptr) hwloc_topology_destroy(as_topo(topo_));
}

int Topology::packages() const { return count_of(as_topo(topo_), HWLOC_OBJ_PACKAGE); }
int Topology::cores() const { return count_of(as_topo(topo_), HWLOC_OBJ_CORE); }
int Topology::pus() const { return count_of(as_topo(topo_), HWLOC_OBJ_PU); }
int Topology::numa_nodes() const {
  const int n = count_of(as_topo(topo_), HWLOC_OBJ_NUMANODE);
  return n > 0 ? n : 1;
}

int Topology::cores_in_node(int node) const {
  hwloc_topology_t topo = as_topo(topo_);
  if (node < 0) return cores();
  hwloc_obj_t numa = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(node));
  if (numa == nullptr) return 0;
  return hwloc_get_nbobjs_inside_cpuset_by_type(topo, numa->cpuset, HWLOC_OBJ_CORE);
}

Result<int> Topology::numa_node_of(const void* addr, std::size_t bytes) const {
  hwloc_topology_t topo = as_topo(topo_);
  hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
  if (nodes == nullptr) return Status::out_of_memory("hwloc_bitmap_alloc");
  const int rc = hwloc_get_area_memlocation(topo, addr, bytes, nodes, HWLOC_MEMBIND_BYNODESET);
  const int err = errno;
  int node = -1;
  if (rc == 0) {
    const int os_index = hwloc_bitmap_first(nodes);
    hwloc_obj_t obj = os_index >= 0 ? hwloc_get_numanode_obj_by_os_index(
                                          topo, static_cast<unsigned>(os_index))
                                    : nullptr;
    if (obj != nullptr) node = static_cast<int>(obj->logical_index);
  }
  hwloc_bitmap_free(nodes);
  if (rc != 0) {
    return Status(ErrorCode::kUnavailable, err, "hwloc_get_area_memlocation failed");
  }
  if (node < 0) return Status::not_found("no NUMA node holds these pages (not touched yet?)");
  return node;
}

nlohmann::json Topology::report() const {
  hwloc_topology_t topo = as_topo(topo_);
  nlohmann::json out;
  out["packages"] = packages();
  out["cores"] = cores();
  out["pus"] = pus();
  nlohmann::json nodes = nlohmann::json::array();
  const int n = count_of(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t numa = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    if (numa == nullptr) continue;
    nodes.push_back({{"os_index", numa->os_index},
                     {"memory_bytes", numa->attr != nullptr ? numa->attr->numanode.local_memory : 0},
                     {"cpuset", cpuset_string(numa->cpuset)},
                     {"cores", cores_in_node(i)}});
  }
  out["numa_nodes"] = nodes;
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  if (set != nullptr) {
    if (hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0) {
      out["process_cpuset"] = cpuset_string(set);
    }
    hwloc_bitmap_free(set);
  }
  return out;
}

nlohmann::json topology_report() {
  Result<Topology> topo = Topology::create();
  if (!topo.is_ok()) return {{"error", topo.status().to_string()}};
  return topo->report();
}

// ---- ThreadArena ----

namespace {

// Binds each thread entering the arena to one core and restores its previous binding on exit.
class PinningObserver final : public tbb::task_scheduler_observer {
 public:
  PinningObserver(tbb::task_arena& arena, hwloc_topology_t topo,
                  std::vector<hwloc_bitmap_t> core_sets)
      : tbb::task_scheduler_observer(arena), topo_(topo), core_sets_(std::move(core_sets)) {}
  PinningObserver(const PinningObserver&) = delete;
  PinningObserver& operator=(const PinningObserver&) = delete;

  void on_scheduler_entry(bool /*is_worker*/) override {
    const int slot = tbb::this_task_arena::current_thread_index();
    if (slot < 0 || core_sets_.empty()) return;
    SavedBinding& saved = saved_binding();
    if (saved.set == nullptr) saved.set = hwloc_bitmap_alloc();
    saved.valid = saved.set != nullptr &&
                  hwloc_get_cpubind(topo_, saved.set, HWLOC_CPUBIND_THREAD) == 0;
    const hwloc_bitmap_t core = core_sets_[static_cast<std::size_t>(slot) % core_sets_.size()];
    if (hwloc_set_cpubind(topo_, core, HWLOC_CPUBIND_THREAD) != 0) {
      // Pinning is a placement hint: the update is correct on any core, so report and go on.
      TZ_LOG_DEBUG("hwloc_set_cpubind(slot %d) failed: errno %d", slot, errno);
    }
  }

  void on_scheduler_exit(bool /*is_worker*/) override {
    SavedBinding& saved = saved_binding();
    if (saved.valid && hwloc_set_cpubind(topo_, saved.set, HWLOC_CPUBIND_THREAD) != 0) {
      TZ_LOG_DEBUG("hwloc_set_cpubind(restore) failed: errno %d", errno);
    }
    saved.valid = false;
  }

 private:
  struct SavedBinding {
    hwloc_bitmap_t set = nullptr;
    bool valid = false;
    SavedBinding() = default;
    SavedBinding(const SavedBinding&) = delete;
    SavedBinding& operator=(const SavedBinding&) = delete;
    ~SavedBinding() {
      if (set != nullptr) hwloc_bitmap_free(set);
    }
  };
  static SavedBinding& saved_binding() {
    thread_local SavedBinding saved;
    return saved;
  }

  hwloc_topology_t topo_;
  std::vector<hwloc_bitmap_t> core_sets_;  // owned by the topology
};

}  // namespace

struct ThreadArena::Impl {
  Topology topology;
  int threads = 1;
  int pinned_cores = 0;
  std::unique_ptr<tbb::global_control> parallelism;  // only when oversubscribing
  tbb::task_arena arena;
  std::unique_ptr<PinningObserver> observer;

  explicit Impl(Topology t) : topology(std::move(t)) {}
  ~Impl() {
    if (observer) observer->observe(false);
  }
};

Result<ThreadArena> ThreadArena::create(const ArenaOptions& options) {
  if (options.threads < 0) {
    return Status::invalid_argument("threads must be >= 0 (0 = one per core), got " +
                                    std::to_string(options.threads));
  }
  TZ_ASSIGN_OR_RETURN(Topology topo, Topology::create());
  hwloc_topology_t t = as_topo(topo.handle());
  if (options.numa_node >= topo.numa_nodes()) {
    return Status::invalid_argument("numa_node " + std::to_string(options.numa_node) +
                                    " does not exist; this machine has " +
                                    std::to_string(topo.numa_nodes()) + " node(s)");
  }
  // The cores the arena may use, in logical order.
  std::vector<hwloc_bitmap_t> core_sets;
  hwloc_const_bitmap_t allowed = hwloc_topology_get_allowed_cpuset(t);
  hwloc_obj_t numa = options.numa_node >= 0
                         ? hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE,
                                                 static_cast<unsigned>(options.numa_node))
                         : nullptr;
  const int ncores = topo.cores();
  for (int i = 0; i < ncores; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(t, HWLOC_OBJ_CORE, static_cast<unsigned>(i));
    if (core == nullptr || !hwloc_bitmap_intersects(core->cpuset, allowed)) continue;
    if (numa != nullptr && !hwloc_bitmap_isincluded(core->cpuset, numa->cpuset)) continue;
    core_sets.push_back(core->cpuset);
  }
  const int usable = core_sets.empty() ? static_cast<int>(std::thread::hardware_concurrency())
                                       : static_cast<int>(core_sets.size());
  auto impl = std::make_unique<Impl>(std::move(topo));
  impl->threads = options.threads > 0 ? options.threads : (usable > 0 ? usable : 1);
  if (impl->threads > tbb::this_task_arena::max_concurrency()) {
    impl->parallelism = std::make_unique<tbb::global_control>(
        tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(impl->threads));
  }
  impl->arena.initialize(impl->threads);
  if (options.pin && !core_sets.empty()) {
    impl->pinned_cores = static_cast<int>(core_sets.size());
    impl->observer = std::make_unique<PinningObserver>(impl->arena, t, std::move(core_sets));
    impl->observer->observe(true);
  }
  return ThreadArena(std::move(impl));
}

ThreadArena::ThreadArena(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ThreadArena::ThreadArena(ThreadArena&&) noexcept = default;
ThreadArena& ThreadArena::operator=(ThreadArena&&) noexcept = default;
ThreadArena::~ThreadArena() = default;

int ThreadArena::threads() const { return impl_->threads; }
int ThreadArena::pinned_cores() const { return impl_->pinned_cores; }
tbb::task_arena& ThreadArena::arena() { return impl_->arena; }

}  // namespace tz::cpu
