// HostDevice: streams as ordered worker threads, events as generation counters, the budgeted
// pool as aligned host memory, typed operations as loops over gpu/elementwise.h.
#include "gpu/host_device.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "core/thread_name.h"
#include "core/trace.h"
#include "cpu/span_update.h"
#include "gpu/elementwise.h"

namespace tz::gpu {
namespace {

constexpr std::size_t kAlignment = 256;
constexpr int kPoisonByte = 0xa5;
// The most freed-buffer bytes a HostDevice keeps for reuse (besides its budget, at most the budget).
constexpr std::uint64_t kCacheMax = 1ull << 30;
// Buffers from this size on are mapped and unmapped directly: glibc would keep a freed one in its
// heap once its mmap threshold has risen past it (up to 32 MiB), resident and counted nowhere.
constexpr std::size_t kMapMin = 1u << 20;

void* map_or_alloc(std::size_t rounded) {
  if (rounded < kMapMin) return std::aligned_alloc(kAlignment, rounded);
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void unmap_or_free(void* ptr, std::size_t rounded) {
  if (rounded < kMapMin) {
    std::free(ptr);
  } else {
    munmap(ptr, rounded);
  }
}

// What a HostEvent shares with the tasks that complete and wait on it, so that the event may be
// destroyed while they are still queued.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0;   // generation of the most recent record()
  std::uint64_t completed = 0;  // highest generation whose work has completed
};

class HostEvent final : public Event {
 public:
  explicit HostEvent(HostDevice* device) : device_(device), state_(std::make_shared<EventState>()) {}

  Status record(Stream& stream) override {
    TZ_ASSERT(&stream.device() == device_, "event recorded on a stream of another device");
    TZ_RETURN_IF_ERROR(device_->check_fault(HostDevice::kFaultRecord, "event record"));
    std::uint64_t generation;
    {
      std::lock_guard lock(state_->mu);
      generation = ++state_->recorded;
    }
    static_cast<HostStream&>(stream).enqueue(
        "event",
        [state = state_, generation] {
          std::lock_guard lock(state->mu);
          state->completed = std::max(state->completed, generation);
          state->cv.notify_all();
        },
        HostStream::TaskKind::kSync);
    return Status::ok();
  }

  Result<bool> query() override {
    std::lock_guard lock(state_->mu);
    return state_->completed >= state_->recorded;
  }

  Status synchronize() override {
    device_->observe_call("event synchronize");
    std::unique_lock lock(state_->mu);
    const std::uint64_t target = state_->recorded;
    state_->cv.wait(lock, [&] { return state_->completed >= target; });
    return Status::ok();
  }

  // The generation a waiter must see completed (the most recent record so far).
  std::shared_ptr<EventState> state() const { return state_; }
  HostDevice* device() const { return device_; }

 private:
  HostDevice* device_;
  std::shared_ptr<EventState> state_;
};

}  // namespace

// ---- HostStream --------------------------------------------------------------------------------

Result<std::unique_ptr<HostStream>> HostStream::create(HostDevice* device, std::string name,
                                                      BusyUnion* cores) {
  std::unique_ptr<HostStream> stream(new HostStream(device, std::move(name), cores));
  try {
    stream->worker_ = std::thread([s = stream.get()] {
      // "tz-compute", "tz-store ~s h2d": the stream's name without HostDevice's "host:".
      std::string_view n = s->name_;
      if (n.starts_with("host:")) n.remove_prefix(5);
      set_thread_name("tz-" + std::string(n));
      s->run();
    });
  } catch (const std::system_error& e) {
    return Status::unavailable("host stream '" + stream->name_ +
                               "': cannot start its worker thread: " + e.what());
  }
  device->add_stream(stream.get());
  return stream;
}

HostStream::~HostStream() {
  device_->remove_stream(this);
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    work_cv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
}

Device& HostStream::device() { return *device_; }

void HostStream::enqueue(const char* op, std::function<void()> task, TaskKind kind) {
  std::unique_lock lock(mu_);
  space_cv_.wait(lock, [&] { return queue_.size() < kMaxQueued; });
  TZ_ASSERT(!stopping_, "work enqueued on a stream being destroyed");
  queue_.push_back(Task{op, std::move(task), kind});
  ++enqueued_;
  work_cv_.notify_one();
}

void HostStream::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    // Drain before stopping: the destructor's contract is to wait for enqueued work.
    work_cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    space_cv_.notify_one();
    lock.unlock();
    {
      Trace& trace = Trace::global();
      const bool traced = trace.enabled();
      const double start_us = traced ? trace.now_us() : 0;
      // A sync task may block until another stream catches up: that is not this stream's work.
      const bool work = task.kind == TaskKind::kWork;
      const auto t0 = std::chrono::steady_clock::now();
      if (work && cores_ != nullptr) cores_->enter();
      task.fn();
      if (work && cores_ != nullptr) cores_->leave();
      if (work) {
        busy_ns_ += static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                 t0)
                .count());
      }
      if (traced) trace.span(name_, task.op, start_us, trace.now_us());
    }
    task.fn = nullptr;  // destroy captured state outside the lock, before signalling completion
    lock.lock();
    ++completed_;
    done_cv_.notify_all();
  }
}

Status HostStream::synchronize() {
  device_->observe_call("stream synchronize");
  std::unique_lock lock(mu_);
  const std::uint64_t target = enqueued_;
  done_cv_.wait(lock, [&] { return completed_ >= target; });
  return Status::ok();
}

Status HostStream::wait(const Event& event) {
  const auto& host_event = static_cast<const HostEvent&>(event);
  TZ_ASSERT(host_event.device() == device_, "stream waits on an event of another device");
  TZ_RETURN_IF_ERROR(device_->check_fault(HostDevice::kFaultWait, "stream wait"));
  std::shared_ptr<EventState> state = host_event.state();
  std::uint64_t target;
  {
    std::lock_guard lock(state->mu);
    target = state->recorded;
    if (state->completed >= target) return Status::ok();  // nothing to wait for
  }
  enqueue(
      "wait",
      [state = std::move(state), target] {
        std::unique_lock lock(state->mu);
        state->cv.wait(lock, [&] { return state->completed >= target; });
      },
      TaskKind::kSync);
  return Status::ok();
}

// ---- HostDevice --------------------------------------------------------------------------------

namespace {

// Step 1 of the fixed order (gpu/elementwise.h) over elements [begin, end) of one chunk. A full
// chunk runs lane-inner (element j * kNormLanes + l goes to lane l, j in order), so the lanes add
// in the same order as the element loop and the compiler can vectorize across them.
template <typename T>
double chunk_sum_squares(const T* src, std::size_t begin, std::size_t end,
                         std::uint64_t& nonfinite) {
  const SumSquaresOp<T> op;
  double lanes[kNormLanes] = {};
  if (end - begin == kNormChunk) {
    const T* c = src + begin;
    for (std::size_t j = 0; j < kNormChunk / kNormLanes; ++j) {
      for (std::size_t l = 0; l < kNormLanes; ++l) op(c, j * kNormLanes + l, lanes[l], nonfinite);
    }
  } else {
    for (std::size_t i = begin; i < end; ++i) {
      op(src, i, lanes[(i - begin) % kNormLanes], nonfinite);
    }
  }
  return norm_lane_tree(lanes);
}

}  // namespace

// Step 1 (each chunk's sum) runs over the calling thread's OpenMP team; step 2 adds the chunk
// sums to the lanes in chunk order on one thread, so the bits do not depend on the team.
void sum_squares_fixed_order(const void* src, DType dtype, std::size_t n, NormAccumulator& acc) {
  if (n == 0) return;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto* s = static_cast<const T*>(src);
    const std::size_t chunks = (n + kNormChunk - 1) / kNormChunk;
    std::vector<double> sums(chunks);
    std::uint64_t nonfinite = 0;
#pragma omp parallel for schedule(static) reduction(+ : nonfinite) if (chunks > 1)
    for (std::int64_t c = 0; c < static_cast<std::int64_t>(chunks); ++c) {
      const std::size_t begin = static_cast<std::size_t>(c) * kNormChunk;
      const std::size_t end = begin + kNormChunk < n ? begin + kNormChunk : n;
      sums[static_cast<std::size_t>(c)] = chunk_sum_squares(s, begin, end, nonfinite);
    }
    double lanes[kNormLanes] = {};  // step 2: chunk c goes to lane c % kNormLanes, in order
    for (std::size_t c = 0; c < chunks; ++c) lanes[c % kNormLanes] += sums[c];
    acc.sum_squares += norm_lane_tree(lanes);
    acc.nonfinite_count += nonfinite;
  });
}

Result<std::unique_ptr<HostDevice>> HostDevice::create(std::uint64_t budget_bytes) {
  std::unique_ptr<HostDevice> device(new HostDevice(budget_bytes));
#if !defined(__SANITIZE_ADDRESS__)  // under ASan every free is a real one, so it sees reuse
  device->cache_limit_ = static_cast<std::size_t>(std::min<std::uint64_t>(budget_bytes, kCacheMax));
#endif
#if !defined(NDEBUG)
  device->poison_ = true;
#endif
  if (const char* env = std::getenv("TZ_DEVICE_POISON"); env != nullptr && *env != '\0') {
    device->poison_ = std::strcmp(env, "0") != 0;
  }
  TZ_ASSIGN_OR_RETURN(auto compute, HostStream::create(device.get(), "host:compute",
                                                           &BusyUnion::host_cores()));
  TZ_ASSIGN_OR_RETURN(auto h2d, HostStream::create(device.get(), "host:h2d"));
  TZ_ASSIGN_OR_RETURN(auto d2h, HostStream::create(device.get(), "host:d2h"));
  device->set_default_streams(std::move(compute), std::move(h2d), std::move(d2h));
  return device;
}

HostDevice::~HostDevice() {
  release_default_streams();  // joins their threads while this object is still whole
  const MemoryStats stats = memory_stats();
  TZ_ASSERT(stats.live_allocations == 0, "HostDevice destroyed while buffers are alive");
  release_cache();
  std::lock_guard lock(mu_);
  TZ_ASSERT(streams_.empty(), "HostDevice destroyed while streams created on it are alive");
}

Result<void*> HostDevice::allocate_raw(std::size_t bytes) {
  observe_call("allocate");
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* ptr = nullptr;
  {
    std::lock_guard lock(cache_mu_);
    if (auto it = cache_.find(rounded); it != cache_.end()) {
      ptr = it->second;
      cache_.erase(it);
      cache_bytes_ -= rounded;
    }
  }
  if (ptr == nullptr) {
    // The freed buffers kept plus the live ones stay within the largest live total so far (this
    // allocation counted), which the engine's plan bounds: the free lists are never memory the
    // plan does not count. The largest go first.
    const MemoryStats stats = memory_stats();
    std::lock_guard lock(cache_mu_);
    while (!cache_.empty() && stats.in_use_bytes + cache_bytes_ > stats.peak_bytes) {
      const auto last = std::prev(cache_.end());
      unmap_or_free(last->second, last->first);
      cache_bytes_ -= last->first;
      cache_.erase(last);
    }
  }
  if (ptr == nullptr) ptr = map_or_alloc(rounded);
  if (ptr == nullptr) {
    release_cache();  // buffers of other sizes, held for nothing now
    ptr = map_or_alloc(rounded);
  }
  if (ptr == nullptr) {
    return Status::out_of_memory("HostDevice: allocating " + std::to_string(rounded) +
                                 " B failed (host memory exhausted)");
  }
  if (poison_) std::memset(ptr, kPoisonByte, rounded);
  return ptr;
}

void HostDevice::free_raw(void* ptr, std::size_t bytes) {
  observe_call("free");
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (poison_) std::memset(ptr, kPoisonByte, rounded);
  {
    std::lock_guard lock(cache_mu_);
    if (cache_bytes_ + rounded <= cache_limit_) {
      cache_.emplace(rounded, ptr);
      cache_bytes_ += rounded;
      return;
    }
  }
  unmap_or_free(ptr, rounded);
}

void HostDevice::release_cache() {
  std::lock_guard lock(cache_mu_);
  for (const auto& [size, ptr] : cache_) unmap_or_free(ptr, size);
  cache_.clear();
  cache_bytes_ = 0;
}

void HostDevice::add_stream(HostStream* stream) {
  std::lock_guard lock(mu_);
  streams_.push_back(stream);
}

void HostDevice::remove_stream(HostStream* stream) {
  std::lock_guard lock(mu_);
  streams_.erase(std::remove(streams_.begin(), streams_.end(), stream), streams_.end());
}

HostStream& HostDevice::host_stream(Stream& stream) {
  TZ_ASSERT(&stream.device() == this, "operation enqueued on a stream of another device");
  return static_cast<HostStream&>(stream);
}

Result<std::unique_ptr<Stream>> HostDevice::create_stream(std::string name) {
  TZ_ASSIGN_OR_RETURN(auto stream, HostStream::create(this, "host:" + name));
  return std::unique_ptr<Stream>(std::move(stream));
}

Result<std::unique_ptr<Event>> HostDevice::create_event() {
  observe_call("create event");
  return std::unique_ptr<Event>(std::make_unique<HostEvent>(this));
}

Status HostDevice::synchronize() {
  observe_call("device synchronize");
  std::lock_guard lock(mu_);
  for (HostStream* stream : streams_) TZ_RETURN_IF_ERROR(stream->synchronize());
  return Status::ok();
}

Status HostDevice::register_host_memory(void* ptr, std::size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    return Status::invalid_argument("register_host_memory: empty range");
  }
  std::lock_guard lock(mu_);
  auto next = registered_.lower_bound(ptr);
  const auto* begin = static_cast<const char*>(ptr);
  const bool overlaps_next = next != registered_.end() && static_cast<char*>(next->first) < begin + bytes;
  bool overlaps_prev = false;
  if (next != registered_.begin()) {
    auto prev = std::prev(next);
    overlaps_prev = static_cast<char*>(prev->first) + prev->second > begin;
  }
  if (overlaps_next || overlaps_prev) {
    return Status::invalid_argument("register_host_memory: range overlaps one already registered");
  }
  registered_.emplace(ptr, bytes);
  return Status::ok();
}

Status HostDevice::unregister_host_memory(void* ptr) {
  std::lock_guard lock(mu_);
  if (registered_.erase(ptr) == 0) {
    return Status::invalid_argument("unregister_host_memory: pointer was not registered");
  }
  return Status::ok();
}

void HostDevice::inject_failures(unsigned ops, std::uint64_t after, std::uint64_t count) {
  std::lock_guard lock(fault_mu_);
  fault_ops_ = ops;
  fault_after_ = after;
  fault_count_ = count;
}

std::uint64_t HostDevice::injected_failures() const {
  std::lock_guard lock(fault_mu_);
  return fault_injected_;
}

Status HostDevice::check_fault(DeviceFault op, const char* what) {
  observe_call(what);
  std::lock_guard lock(fault_mu_);
  if ((fault_ops_ & op) == 0 || fault_count_ == 0) return Status::ok();
  if (fault_after_ > 0) {
    --fault_after_;
    return Status::ok();
  }
  --fault_count_;
  ++fault_injected_;
  return Status::internal(std::string("HostDevice: injected failure of ") + what);
}

std::size_t HostDevice::registered_host_ranges() const {
  std::lock_guard lock(mu_);
  return registered_.size();
}

Status HostDevice::copy_async(void* dst, const void* src, std::size_t bytes, CopyKind /*kind*/,
                              Stream& stream) {
  TZ_RETURN_IF_ERROR(check_fault(kFaultCopy, "copy_async"));
  if (bytes == 0) return Status::ok();
  host_stream(stream).enqueue("copy", [dst, src, bytes] { std::memcpy(dst, src, bytes); });
  return Status::ok();
}

Status HostDevice::memset_async(void* dst, int value, std::size_t bytes, Stream& stream) {
  TZ_RETURN_IF_ERROR(check_fault(kFaultMemset, "memset_async"));
  if (bytes == 0) return Status::ok();
  host_stream(stream).enqueue("memset", [dst, value, bytes] { std::memset(dst, value, bytes); });
  return Status::ok();
}

Status HostDevice::host_callback(Stream& stream, std::function<void()> fn) {
  TZ_RETURN_IF_ERROR(check_fault(kFaultCallback, "host_callback"));
  host_stream(stream).enqueue("host_callback", std::move(fn));
  return Status::ok();
}

Status HostDevice::fill(void* dst, DType dtype, std::size_t n, float value, Stream& stream) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    host_stream(stream).enqueue("fill", [p = static_cast<T*>(dst), n, value] {
      const FillOp<T> op(value);
      for (std::size_t i = 0; i < n; ++i) op(p, i);
    });
  });
  return Status::ok();
}

Status HostDevice::cast(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                        std::size_t n, Stream& stream) {
  dispatch_dtype(src_dtype, [&](auto src_tag) {
    dispatch_dtype(dst_dtype, [&](auto dst_tag) {
      using S = decltype(src_tag);
      using D = decltype(dst_tag);
      host_stream(stream).enqueue(
          "cast", [s = static_cast<const S*>(src), d = static_cast<D*>(dst), n] {
            const CastOp<S, D> op;
            for (std::size_t i = 0; i < n; ++i) op(s, d, i);
          });
    });
  });
  return Status::ok();
}

Status HostDevice::scale(void* data, DType dtype, std::size_t n, float factor, Stream& stream) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    host_stream(stream).enqueue("scale", [p = static_cast<T*>(data), n, factor] {
      const ScaleOp<T> op{factor};
      for (std::size_t i = 0; i < n; ++i) op(p, i);
    });
  });
  return Status::ok();
}

Status HostDevice::sum_squares(const void* src, DType dtype, std::size_t n, NormAccumulator* acc,
                               Stream& stream) {
  TZ_ASSERT(acc != nullptr);
  host_stream(stream).enqueue("sum_squares", [src, dtype, n, acc] {
    sum_squares_fixed_order(src, dtype, n, *acc);
  });
  return Status::ok();
}

Status HostDevice::optimizer_step(const OptimizerStepArgs& args, Stream& stream) {
  TZ_RETURN_IF_ERROR(validate_optimizer_step(args));
  if (args.n == 0) return Status::ok();
  // Element-wise, so chunks on the OpenMP team of the stream's thread (as many threads as its
  // matmuls use) give the same bits as one loop. Each chunk goes through the CPU optimizer's SIMD
  // kernels (cpu/span_update.h), which give optimizer_element's bits: a scalar loop was bound by
  // the divider (three IEEE divisions and square roots an element).
  host_stream(stream).enqueue("optimizer_step", [args] {
    constexpr std::size_t kChunk = std::size_t{1} << 16;
    const std::size_t grad_size = dtype_size(args.grad_dtype);
    const std::size_t copy_size = dtype_size(args.copy_dtype);
    const auto chunks = static_cast<std::int64_t>((args.n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::size_t begin = static_cast<std::size_t>(c) * kChunk;
      cpu::SpanUpdate u = args;
      u.param = args.param + begin;
      u.grad = static_cast<const std::byte*>(args.grad) + begin * grad_size;
      for (int s = 0; s < 2; ++s) {
        u.state[s] = args.state[s] != nullptr ? args.state[s] + begin : nullptr;
      }
      if (args.param_copy != nullptr) {
        u.param_copy = static_cast<std::byte*>(args.param_copy) + begin * copy_size;
      }
      u.n = std::min(args.n, begin + kChunk) - begin;
      cpu::update_span(u);
    }
  });
  return Status::ok();
}

}  // namespace tz::gpu
