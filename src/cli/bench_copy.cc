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

// Single-thread memcpy bandwidth of `bytes` between two touched buffers (the in-run peer).
double memcpy_gbps(const HostBuffer& a, const HostBuffer& b, std::size_t bytes, int repeats) {
  std::vector<double> gbps;
  std::memcpy(b.data(), a.data(), bytes);  // warm-up
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    gbps.push_back(static_cast<double>(bytes) / seconds_since(t0) / 1e9);
  }
  return median(gbps);
}

struct Result1 {
  std::string direction;
  std::string memory;
  double median_gbps, min_gbps, max_gbps;
};

int run(const CopyOptions& opts) {
  auto size = parse_size(opts.size);
  if (!size.is_ok() || *size == 0) {
    return report_failure("bench copy",
                          Status::invalid_argument("--size " + opts.size + ": " +
                                                   (size.is_ok() ? std::string("must be > 0")
                                                                 : size.status().message())));
  }
  auto choice = gpu::parse_device_choice(opts.device);
  if (!choice.is_ok()) {
    return report_failure("bench copy", choice.status());
  }
  const std::size_t bytes = *size;
  gpu::DeviceOptions dopts;
  dopts.choice = *choice;
  auto device = gpu::open_device(dopts);
  if (!device.is_ok()) {
    return report_failure("bench copy", device.status());
  }
  gpu::Device& dev = **device;
  auto d_in = dev.allocate(bytes);
  auto d_out = dev.allocate(bytes);
  if (!d_in.is_ok() || !d_out.is_ok()) {
    return report_failure("bench copy", (d_in.is_ok() ? d_out.status() : d_in.status()));
  }
  // Touch the device buffers once: an untouched HostDevice page reads as the shared zero page,
  // which would make device-to-host copies look twice as fast as memory allows.
  Status init = dev.memset_async(d_in->data(), 0x5a, bytes, dev.compute_stream());
  if (init.is_ok()) init = dev.memset_async(d_out->data(), 0xa5, bytes, dev.compute_stream());
  if (init.is_ok()) init = dev.compute_stream().synchronize();
  if (!init.is_ok()) {
    return report_failure("bench copy", init);
  }
  std::vector<Result1> results;
  double peer_gbps = 0;
  for (bool pinned : {true, false}) {
    auto src = HostBuffer::create(dev, bytes, pinned);
    auto dst = HostBuffer::create(dev, bytes, pinned);
    if (!src.is_ok() || !dst.is_ok()) {
      return report_failure("bench copy", (src.is_ok() ? dst.status() : src.status()));
    }
    if (pinned) peer_gbps = memcpy_gbps(*src, *dst, bytes, opts.repeats);
    for (const char* direction : {"h2d", "d2h", "bidir"}) {
      const bool h2d = std::strcmp(direction, "d2h") != 0;
      const bool d2h = std::strcmp(direction, "h2d") != 0;
      std::vector<double> gbps;
      for (int rep = -1; rep < opts.repeats; ++rep) {  // rep -1 is the warm-up
        const auto t0 = Clock::now();
        Status st;
        if (h2d) st = dev.copy_async(d_in->data(), src->data(), bytes, gpu::CopyKind::kHostToDevice, dev.h2d_stream());
        if (st.is_ok() && d2h) st = dev.copy_async(dst->data(), d_out->data(), bytes, gpu::CopyKind::kDeviceToHost, dev.d2h_stream());
        if (st.is_ok()) st = dev.h2d_stream().synchronize();
        if (st.is_ok()) st = dev.d2h_stream().synchronize();
        if (!st.is_ok()) {
          return report_failure("bench copy", st);
        }
        const double moved = static_cast<double>(bytes) * ((h2d ? 1 : 0) + (d2h ? 1 : 0));
        if (rep >= 0) gbps.push_back(moved / seconds_since(t0) / 1e9);
      }
      results.push_back({direction, pinned ? "pinned" : "pageable", median(gbps),
                         *std::min_element(gbps.begin(), gbps.end()),
                         *std::max_element(gbps.begin(), gbps.end())});
    }
  }
  if (opts.json) {
    for (const Result1& r : results) {
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
      j["fraction_of_peer"] = peer_gbps > 0 ? r.median_gbps / peer_gbps : 0;
      j["machine"] = machine_json();
      std::printf("%s\n", j.dump().c_str());
    }
    return 0;
  }
  std::printf("bench copy: %s, %s per copy, median of %d (GB/s; bidir counts both directions)\n",
              dev.name().c_str(), format_bytes(static_cast<double>(bytes)).c_str(), opts.repeats);
  std::printf("%-6s %-9s %10s %10s %10s %10s\n", "dir", "memory", "median", "min", "max", "vs memcpy");
  for (const Result1& r : results) {
    std::printf("%-6s %-9s %10.2f %10.2f %10.2f %9.2fx\n", r.direction.c_str(), r.memory.c_str(),
                r.median_gbps, r.min_gbps, r.max_gbps, peer_gbps > 0 ? r.median_gbps / peer_gbps : 0.0);
  }
  std::printf("peer: single-thread memcpy %.2f GB/s\n", peer_gbps);
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
