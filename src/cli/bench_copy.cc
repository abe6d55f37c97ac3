// `tierzero bench copy`: host<->device copy bandwidth through the Device interface, from pinned
// (registered) and from pageable host memory, each direction alone and both at once on the two
// copy streams. On HostDevice this measures memcpy by worker threads; the plain single-thread
// memcpy of the same run is printed next to every result as the peer.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "core/units.h"
#include "gpu/select.h"

namespace tz::cli {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct CopyOptions {
  std::string size = "256M";
  int repeats = 5;
  std::string device = "auto";
  bool json = false;
};

// Host memory for the benchmark: page-aligned, touched once (so page faults are not timed) and,
// when `pinned`, registered with the device.
class HostBuffer {
 public:
  static Result<HostBuffer> create(gpu::Device& device, std::size_t bytes, bool pinned) {
    const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (p == nullptr) return Status::out_of_memory("bench copy: host buffer of " + format_bytes(static_cast<double>(rounded)));
    std::memset(p, 0x3c, rounded);
    HostBuffer b(device, p, rounded);
    if (pinned) {
      TZ_RETURN_IF_ERROR(device.register_host_memory(p, rounded));
      b.registered_ = true;
    }
    return b;
  }
  HostBuffer(HostBuffer&& o) noexcept
      : device_(o.device_), ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_),
        registered_(std::exchange(o.registered_, false)) {}
  HostBuffer& operator=(HostBuffer&&) = delete;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() {
    if (registered_) device_->unregister_host_memory(ptr_).ignore();
    std::free(ptr_);
  }
  void* data() const { return ptr_; }

 private:
  HostBuffer(gpu::Device& device, void* p, std::size_t bytes) : device_(&device), ptr_(p), bytes_(bytes) {}
  gpu::Device* device_;
  void* ptr_;
  std::size_t bytes_;
  bool registered_ = false;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Result1 {
  std::string direction;
  std::string memory;
  double median_gbps, min_gbps, max_gbps;
};

int fail(const Status& st) { return report_failure("bench copy", st); }

Result<std::size_t> parse(const CopyOptions& opts) {
  auto size = parse_size(opts.size);
  if (!size.is_ok() || *size == 0) {
    return Status::invalid_argument("--size " + opts.size + ": " +
                                    (size.is_ok() ? std::string("must be > 0")
                                                  : size.status().message()));
  }
  return static_cast<std::size_t>(*size);
}

// The device's two buffers, touched once: an untouched HostDevice page reads as the shared zero
// page, which would make device-to-host copies look twice as fast as memory allows.
struct DeviceBuffers {
  gpu::DeviceBuffer in;
  gpu::DeviceBuffer out;
};

Result<DeviceBuffers> device_buffers(gpu::Device& dev, std::size_t bytes) {
  auto d_in = dev.allocate(bytes);
  auto d_out = dev.allocate(bytes);
  if (!d_in.is_ok() || !d_out.is_ok()) return d_in.is_ok() ? d_out.status() : d_in.status();
  TZ_RETURN_IF_ERROR(dev.memset_async(d_in->data(), 0x5a, bytes, dev.compute_stream()));
  TZ_RETURN_IF_ERROR(dev.memset_async(d_out->data(), 0xa5, bytes, dev.compute_stream()));
  TZ_RETURN_IF_ERROR(dev.compute_stream().synchronize());
  return DeviceBuffers{std::move(d_in).value(), std::move(d_out).value()};
}

// One direction ("h2d", "d2h" or "bidir": both at once) over `repeats` timed copies after a
// warm-up; GB/s counts the bytes of both directions.
Result<Result1> time_direction(gpu::Device& dev, DeviceBuffers& d, const HostBuffer& src,
                               const HostBuffer& dst, std::size_t bytes, int repeats,
                               const char* direction, bool pinned) {
  const bool h2d = std::strcmp(direction, "d2h") != 0;
  const bool d2h = std::strcmp(direction, "h2d") != 0;
  std::vector<double> gbps;
  for (int rep = -1; rep < repeats; ++rep) {  // rep -1 is the warm-up
    const auto t0 = Clock::now();
    if (h2d) {
      TZ_RETURN_IF_ERROR(dev.copy_async(d.in.data(), src.data(), bytes,
                                        gpu::CopyKind::kHostToDevice, dev.h2d_stream()));
    }
    if (d2h) {
      TZ_RETURN_IF_ERROR(dev.copy_async(dst.data(), d.out.data(), bytes,
                                        gpu::CopyKind::kDeviceToHost, dev.d2h_stream()));
    }
    TZ_RETURN_IF_ERROR(dev.h2d_stream().synchronize());
    TZ_RETURN_IF_ERROR(dev.d2h_stream().synchronize());
    const double moved = static_cast<double>(bytes) * ((h2d ? 1 : 0) + (d2h ? 1 : 0));
    if (rep >= 0) gbps.push_back(moved / seconds_since(t0) / 1e9);
  }
  return Result1{direction, pinned ? "pinned" : "pageable", median(gbps),
                 *std::min_element(gbps.begin(), gbps.end()),
                 *std::max_element(gbps.begin(), gbps.end())};
}

// Pinned, then pageable host memory, each direction; the peer (single-thread memcpy between the
// pinned buffers, after a warm-up copy) into `peer_gbps`.
Result<std::vector<Result1>> measure(gpu::Device& dev, DeviceBuffers& d, std::size_t bytes,
                                     int repeats, double* peer_gbps) {
  std::vector<Result1> results;
  for (bool pinned : {true, false}) {
    auto src = HostBuffer::create(dev, bytes, pinned);
    auto dst = HostBuffer::create(dev, bytes, pinned);
    if (!src.is_ok() || !dst.is_ok()) return src.is_ok() ? dst.status() : src.status();
    if (pinned) {
      std::memcpy(dst->data(), src->data(), bytes);  // warm-up
      *peer_gbps = median(memcpy_gbps_samples(dst->data(), src->data(), bytes, repeats));
    }
    for (const char* direction : {"h2d", "d2h", "bidir"}) {
      TZ_ASSIGN_OR_RETURN(Result1 r,
                          time_direction(dev, d, *src, *dst, bytes, repeats, direction, pinned));
      results.push_back(std::move(r));
    }
  }
  return results;
}

void report(const CopyOptions& opts, gpu::Device& dev, std::size_t bytes,
            const std::vector<Result1>& results, double peer_gbps) {
  BenchReport out(opts.json);
  out.text(cell("bench copy: %s, %s per copy, median of %d (GB/s; bidir counts both directions)",
                dev.name().c_str(), format_bytes(static_cast<double>(bytes)).c_str(),
                opts.repeats));
  out.table({{"dir", 6, true},
             {"memory", 9, true},
             {"median", 10},
             {"min", 10},
             {"max", 10},
             {"vs memcpy", 10}});
  for (const Result1& r : results) {
    const double fraction = peer_gbps > 0 ? r.median_gbps / peer_gbps : 0;
    json j;
    j["bench"] = "copy";
    j["device"] = dev.name();
    j["direction"] = r.direction;
    j["host_memory"] = r.memory;
    j["bytes"] = bytes;
    j["repeats"] = opts.repeats;
    j["median_gbps"] = r.median_gbps;
    j["min_gbps"] = r.min_gbps;
    j["max_gbps"] = r.max_gbps;
    j["peer"] = "single-thread memcpy, pinned to pinned";
    j["peer_gbps"] = peer_gbps;
    j["fraction_of_peer"] = fraction;
    j["machine"] = machine_json();
    out.result(j, {r.direction, r.memory, cell("%.2f", r.median_gbps), cell("%.2f", r.min_gbps),
                   cell("%.2f", r.max_gbps), cell("%.2fx", fraction)});
  }
  out.text(cell("peer: single-thread memcpy %.2f GB/s", peer_gbps));
}

// parse -> build (device, its buffers) -> measure -> report.
int run(const CopyOptions& opts) {
  Result<std::size_t> bytes = parse(opts);
  if (!bytes.is_ok()) return fail(bytes.status());
  auto choice = gpu::parse_device_choice(opts.device);
  if (!choice.is_ok()) return fail(choice.status());
  gpu::DeviceOptions dopts;
  dopts.choice = *choice;
  auto device = gpu::open_device(dopts);
  if (!device.is_ok()) return fail(device.status());
  gpu::Device& dev = **device;
  Result<DeviceBuffers> d = device_buffers(dev, *bytes);
  if (!d.is_ok()) return fail(d.status());
  double peer_gbps = 0;
  Result<std::vector<Result1>> results = measure(dev, *d, *bytes, opts.repeats, &peer_gbps);
  if (!results.is_ok()) return fail(results.status());
  report(opts, dev, *bytes, *results, peer_gbps);
  return 0;
}

}  // namespace

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* bench = tree.group("bench", "Measure the offload path");
  CLI::App* cmd = bench->add_subcommand(
      "copy", "Host<->device copy bandwidth, pinned and pageable, each direction and both");
  auto opts = std::make_shared<CopyOptions>();
  cmd->add_option("--size", opts->size, "Bytes per copy (e.g. 256M, 1G)")->capture_default_str();
  cmd->add_option("--repeats", opts->repeats, "Timed repeats per case (median reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--device", opts->device, "auto, host or cuda (auto honours TZ_DEVICE)")
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "One JSON object per result");
  cmd->callback([opts] { exit_code() = run(*opts); });
});

}  // namespace tz::cli
