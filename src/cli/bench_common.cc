// The bench harness (bench_common.h): reporting, medians, the machine, and the ceilings.
#include "cli/bench_common.h"

#include <fcntl.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/assert.h"
#include "nvme/io_queue.h"
#include "store/pool_registration.h"
#include "zero/plan.h"

namespace tz::cli {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

double median(std::vector<double> samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

zero::BoundTerms median_bound_terms(const std::vector<zero::BoundTerms>& steps) {
  zero::BoundTerms m;
  if (steps.empty()) return m;
  auto term = [&](double zero::BoundTerms::*field) {
    std::vector<double> v;
    for (const zero::BoundTerms& t : steps) {
      if (t.*field < 0) return -1.0;
      v.push_back(t.*field);
    }
    return median(std::move(v));
  };
  m.compute_s = term(&zero::BoundTerms::compute_s);
  m.optimizer_s = term(&zero::BoundTerms::optimizer_s);
  m.shared_busy_s = term(&zero::BoundTerms::shared_busy_s);
  m.nvme_s = term(&zero::BoundTerms::nvme_s);
  m.copy_s = term(&zero::BoundTerms::copy_s);
  m.shared_cores = steps.back().shared_cores;
  return m;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    std::string model = line.substr(colon + 1);
    model.erase(0, model.find_first_not_of(" \t"));
    return model;
  }
  return "unknown";
}

nlohmann::ordered_json machine_json() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  utsname u{};
  const bool have_uname = uname(&u) == 0;
  return {{"host", host[0] ? host : "unknown"},
          {"cpu", cpu_model_name()},
          {"cpus", sysconf(_SC_NPROCESSORS_ONLN)},
          {"kernel", have_uname ? u.release : "unknown"}};
}

std::string cell(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string out(static_cast<std::size_t>(n > 0 ? n : 0), '\0');
  std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  va_end(again);
  return out;
}

// ---- BenchReport ----

void BenchReport::text(const std::string& line) const {
  if (!json_) std::printf("%s\n", line.c_str());
}

void BenchReport::table(std::vector<Column> columns) {
  TZ_ASSERT(!columns.empty());
  columns_ = std::move(columns);
  std::vector<std::string> names;
  for (const Column& c : columns_) names.push_back(c.name);
  if (!json_) print_row(names);
}

void BenchReport::row(const std::vector<std::string>& cells) const {
  if (!json_) print_row(cells);
}

void BenchReport::print_row(const std::vector<std::string>& cells) const {
  TZ_ASSERT(cells.size() == columns_.size());
  std::string line;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const Column& c = columns_[i];
    if (i > 0) line += ' ';
    const std::size_t pad =
        cells[i].size() < static_cast<std::size_t>(c.width) ? c.width - cells[i].size() : 0;
    if (!c.left) line.append(pad, ' ');
    line += cells[i];
    if (c.left) line.append(pad, ' ');
  }
  std::printf("%s\n", line.c_str());
}

void BenchReport::json_line(const std::string& dumped) const {
  if (json_) std::printf("%s\n", dumped.c_str());
}

void BenchReport::result(const nlohmann::ordered_json& record,
                         const std::vector<std::string>& cells) const {
  if (json_) return json_line(record.dump());
  if (!cells.empty()) print_row(cells);
}

void BenchReport::result(const nlohmann::json& record,
                         const std::vector<std::string>& cells) const {
  if (json_) return json_line(record.dump());
  if (!cells.empty()) print_row(cells);
}

void BenchReport::record(const nlohmann::ordered_json& record) const { json_line(record.dump()); }
void BenchReport::record(const nlohmann::json& record) const { json_line(record.dump()); }

// ---- Ceilings ----

namespace {

// Sequential passes over one extent of `swap`, the chunks cycling over `bufs`.
Result<DiskCeiling> disk_passes(nvme::SwapSpace& swap, std::vector<PinnedBuffer>& bufs,
                                std::uint64_t bytes, std::uint64_t chunk) {
  TZ_ASSIGN_OR_RETURN(nvme::SwapExtent ext, swap.allocate(bytes));
  nvme::IoQueue& q = swap.queue();
  auto pass = [&](std::vector<nvme::IoOp> dirs, std::uint64_t len) -> Result<double> {
    // dirs[i % dirs.size()] is the direction of chunk i; chunks cycle over the buffers.
    std::vector<nvme::IoOpId> ids(bufs.size(), 0);
    const double t0 = now_s();
    const std::uint64_t count = len / chunk;
    for (std::uint64_t i = 0; i < count; ++i) {
      const std::size_t slot = i % bufs.size();
      if (ids[slot] != 0) TZ_RETURN_IF_ERROR(q.wait(ids[slot]));
      const nvme::IoOp dir = dirs[i % dirs.size()];
      // Mixed passes read the first half of the extent and write the second.
      const std::uint64_t off = dirs.size() > 1
                                    ? (dir == nvme::IoOp::kRead ? 0 : len / 2) + (i / 2) * chunk
                                    : i * chunk;
      auto tr = swap.transfers(dir, ext, off, bufs[slot].data(), chunk);
      TZ_ASSIGN_OR_RETURN(ids[slot], q.start(tr));
    }
    for (nvme::IoOpId id : ids) {
      if (id != 0) TZ_RETURN_IF_ERROR(q.wait(id));
    }
    return static_cast<double>(count * chunk) / (now_s() - t0) / 1e9;
  };
  DiskCeiling out;
  const std::uint64_t len = bytes / chunk * chunk;
  TZ_ASSIGN_OR_RETURN(out.write_gbps, pass({nvme::IoOp::kWrite}, len));
  TZ_ASSIGN_OR_RETURN(out.read_gbps, pass({nvme::IoOp::kRead}, len));
  const std::uint64_t mixed = std::min<std::uint64_t>(len, 4ull << 30) / (2 * chunk) * (2 * chunk);
  if (mixed >= 2 * chunk) {
    TZ_ASSIGN_OR_RETURN(out.mixed_gbps, pass({nvme::IoOp::kRead, nvme::IoOp::kWrite}, mixed));
  }
  swap.free(ext);
  return out;
}

}  // namespace

Result<DiskCeiling> measure_stack_disk(store::TieredStack& stack, std::uint64_t bytes,
                                       std::uint64_t chunk_bytes, std::uint64_t in_flight_bytes) {
  TZ_ASSERT(stack.pool != nullptr && stack.make_swap && chunk_bytes > 0);
  TZ_ASSERT(stack.store == nullptr);  // the store's swap space would share the disk
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<nvme::SwapSpace> swap, stack.make_swap());
  // Unregistered buffers work too (slower on io_uring); the store logs the same refusal.
  store::register_pool_with_queue(swap->queue(), *stack.pool).ignore();
  const std::uint64_t n_bufs = std::max<std::uint64_t>(1, in_flight_bytes / chunk_bytes);
  std::vector<PinnedBuffer> bufs;
  for (std::uint64_t i = 0; i < n_bufs; ++i) {
    TZ_ASSIGN_OR_RETURN(PinnedBuffer b, stack.pool->allocate(chunk_bytes));
    std::memset(b.data(), static_cast<int>(0x5a + i), chunk_bytes);
    bufs.push_back(std::move(b));
  }
  return disk_passes(*swap, bufs, bytes, chunk_bytes);
}

Result<CopyCeiling> measure_stack_copies(store::TieredStack& stack, gpu::Device& device,
                                         std::uint64_t bytes) {
  TZ_ASSERT(stack.pool != nullptr && bytes > 0);
  TZ_ASSIGN_OR_RETURN(PinnedBuffer host, stack.pool->allocate(bytes));
  TZ_ASSIGN_OR_RETURN(gpu::DeviceBuffer dev, device.allocate(bytes));
  std::memset(host.data(), 1, bytes);
  CopyCeiling out;
  for (int dir = 0; dir < 2; ++dir) {
    gpu::Stream& s = dir == 0 ? device.h2d_stream() : device.d2h_stream();
    double best = 0;
    for (int r = 0; r < 3; ++r) {
      const double t0 = now_s();
      if (dir == 0) {
        TZ_RETURN_IF_ERROR(device.copy_async(dev.data(), host.data(), bytes,
                                             gpu::CopyKind::kHostToDevice, s));
      } else {
        TZ_RETURN_IF_ERROR(device.copy_async(host.data(), dev.data(), bytes,
                                             gpu::CopyKind::kDeviceToHost, s));
      }
      TZ_RETURN_IF_ERROR(s.synchronize());
      best = std::max(best, static_cast<double>(bytes) / (now_s() - t0) / 1e9);
    }
    (dir == 0 ? out.h2d_gbps : out.d2h_gbps) = best;
  }
  return out;
}

std::vector<double> memcpy_gbps_samples(void* dst, const void* src, std::size_t bytes,
                                        int repeats) {
  std::vector<double> gbps;
  for (int i = 0; i < repeats; ++i) {
    const double t0 = now_s();
    std::memcpy(dst, src, bytes);
    gbps.push_back(static_cast<double>(bytes) / (now_s() - t0) / 1e9);
  }
  return gbps;
}

std::vector<double> memcpy_gbps_samples(std::size_t bytes, int repeats) {
  std::vector<char> a(bytes, 1);
  std::vector<char> b(bytes, 2);
  return memcpy_gbps_samples(b.data(), a.data(), bytes, repeats);
}

namespace {
constexpr std::size_t kCopyProbeBytes = 64u << 20;  // each of the memcpy probe's two buffers

bool any_tier_on_nvme(const zero::EngineOptions& eo) {
  const ZeroConfig& z = eo.config.zero;
  return z.offload_optimizer.device == "nvme" || z.offload_param.device == "nvme";
}
}  // namespace

std::uint64_t engine_ceilings_host_bytes(bool device_is_host_memory,
                                         const zero::EngineOptions& eo) {
  const std::uint64_t copy = device_is_host_memory ? 2 * kCopyProbeBytes : 0;
  const std::size_t paths = any_tier_on_nvme(eo) ? zero::swap_paths(eo).size() : 0;
  return std::max(copy, paths > 0 ? engine_disk_probe_host_bytes(paths) : 0);
}

void count_probe_in_plan(zero::EngineOptions& eo) {
  eo.probe_host_bytes = [probed = eo](bool device_is_host_memory) {
    return engine_ceilings_host_bytes(device_is_host_memory, probed);
  };
}

Status measure_engine_ceilings(const std::string& what, bool device_is_host_memory,
                               std::uint64_t disk_bytes, zero::EngineOptions& eo) {
  if (device_is_host_memory) {
    const std::vector<double> copy_gbps = memcpy_gbps_samples(kCopyProbeBytes, 3);
    eo.copy_bytes_per_s = *std::max_element(copy_gbps.begin(), copy_gbps.end()) * 1e9;
  }
  if (!any_tier_on_nvme(eo)) return Status::ok();
  const std::vector<std::string> paths = zero::swap_paths(eo);
  if (paths.empty()) return Status::ok();  // the engine refuses the config, naming the key
  TZ_ASSIGN_OR_RETURN(const DiskCeiling disk, measure_engine_disk(paths, disk_bytes, what));
  eo.nvme_write_bytes_per_s = disk.write_gbps * 1e9;
  eo.nvme_read_bytes_per_s = disk.read_gbps * 1e9;
  return Status::ok();
}

Status SharedCeilings::measure(bool device_is_host_memory, zero::EngineOptions& eo) {
  std::call_once(once_, [&] {
    measured_ = eo;
    status_ = measure_engine_ceilings(what_, device_is_host_memory, 256u << 20, measured_);
  });
  TZ_RETURN_IF_ERROR(status_);
  eo.nvme_read_bytes_per_s = measured_.nvme_read_bytes_per_s;
  eo.nvme_write_bytes_per_s = measured_.nvme_write_bytes_per_s;
  eo.copy_bytes_per_s = measured_.copy_bytes_per_s;
  return Status::ok();
}

}  // namespace tz::cli
