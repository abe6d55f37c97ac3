// `tierzero bench nvme`: O_DIRECT throughput of the NVMe engine (IoQueue over io_uring, libaio or
// psync) on one file per --path, with CPU seconds per GB and bytes in flight, so it can be held
// against fio on the same file (bench/nvme_vs_fio.sh).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "core/host_probe.h"
#include "core/log.h"
#include "core/units.h"
#include "cpu/data_path.h"
#include "cpu/pinned_pool.h"
#include "nvme/file.h"
#include "nvme/io_queue.h"
#include "nvme/probe.h"
#include "store/pool_registration.h"

namespace tz::cli {
namespace {

struct BenchNvmeOptions {
  std::vector<std::string> paths;
  std::string engine = "auto";
  std::string rw = "read";
  std::string bs = "8M";
  std::uint32_t qd = 32;
  std::string size = "1G";
  int repeat = 5;
  bool json = false;
  bool keep_file = false;
  bool sqpoll = false;
  bool no_register = false;
  bool no_huge_pages = false;
  std::string file_name = "tierzero-bench.dat";
};

int fail(const Status& st) { return report_failure("bench nvme", st); }

// The options in numbers: the request size, and the whole requests each file holds.
struct NvmeSizes {
  std::uint64_t bs = 0;
  std::size_t nfiles = 0;
  std::uint64_t chunks_per_file = 0;
  std::uint64_t file_bytes = 0;
  std::uint64_t slots = 0;  // requests in flight at most: --qd per file
};

Result<NvmeSizes> parse(const BenchNvmeOptions& o) {
  NvmeSizes z;
  Result<std::uint64_t> bs = parse_size(o.bs);
  if (!bs.is_ok()) return std::move(bs).take_status().with_context("--bs");
  Result<std::uint64_t> size = parse_size(o.size);
  if (!size.is_ok()) return std::move(size).take_status().with_context("--size");
  z.bs = *bs;
  if (z.bs == 0 || z.bs % 4096 != 0 || z.bs > (1ull << 30)) {
    return Status::invalid_argument("--bs must be a multiple of 4 KiB and at most 1 GiB");
  }
  if (o.qd == 0 || o.repeat < 1) return Status::invalid_argument("--qd and --repeat must be >= 1");
  z.nfiles = o.paths.size();
  z.chunks_per_file = *size / z.nfiles / z.bs;
  if (z.chunks_per_file == 0) {
    return Status::invalid_argument("--size " + o.size +
                                    " is smaller than --bs times the number of paths");
  }
  z.file_bytes = z.chunks_per_file * z.bs;
  z.slots = static_cast<std::uint64_t>(o.qd) * z.nfiles;
  return z;
}

// What the timed passes run on: the I/O engine under the store's swap space, alone (no swap
// space, no store: the bench measures the engine on files fio can read too). Members are
// destroyed files first, then the buffers, the queue, the pool.
struct NvmeRig {
  nvme::EngineChoice choice;
  std::optional<PinnedPool> pool;
  std::optional<nvme::IoQueue> queue;
  std::vector<PinnedBuffer> buffers;  // one per request slot, random bytes
  std::vector<nvme::IoFileHandle> files;
  std::vector<int> ids;        // the files' ids in the queue
  std::vector<bool> created;   // the file was shorter than needed: written once before timing
};

// The staging pool (registered with the queue unless --no-register), the engine and its queue,
// one random buffer per request slot.
Status build_queue(const BenchNvmeOptions& o, const NvmeSizes& z, NvmeRig& rig) {
  TZ_ASSIGN_OR_RETURN(rig.choice, nvme::choose_io_engine(o.engine, o.paths));
  PinnedPoolOptions po;
  po.budget_bytes = z.slots * z.bs;
  po.huge_pages = !o.no_huge_pages;
  po.slab_bytes = std::min<std::uint64_t>(1ull << 30, std::max<std::uint64_t>(z.bs, po.budget_bytes));
  po.slab_bytes = std::max<std::uint64_t>(po.slab_bytes / z.bs * z.bs, z.bs);
  TZ_ASSIGN_OR_RETURN(rig.pool, PinnedPool::create(po));
  // The same warnings as `tierzero info`; --no-huge-pages asks for the 4 KiB path on purpose.
  for (const std::string& w : cpu::data_path_report().warnings) {
    if (w.find("optimizer") != std::string::npos) continue;  // not this benchmark's path
    std::fprintf(stderr, "tierzero bench nvme: warning: %s\n", w.c_str());
  }
  nvme::IoEngineOptions eo;
  eo.queue_depth = static_cast<std::uint32_t>(z.slots);
  eo.sqpoll = o.sqpoll;
  eo.max_files = static_cast<std::uint32_t>(z.nfiles);
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<nvme::IoEngine> engine,
                      nvme::make_io_engine(rig.choice.kind, eo));
  nvme::IoQueueOptions qo;
  qo.block_bytes = z.bs;
  qo.depth_per_file = o.qd;
  TZ_ASSIGN_OR_RETURN(rig.queue, nvme::IoQueue::create(std::move(engine), qo));
  if (!o.no_register) TZ_RETURN_IF_ERROR(store::register_pool_with_queue(*rig.queue, *rig.pool));
  std::mt19937_64 rng(42);
  for (std::uint64_t i = 0; i < z.slots; ++i) {
    TZ_ASSIGN_OR_RETURN(PinnedBuffer b, rig.pool->allocate(z.bs));
    auto* words = reinterpret_cast<std::uint64_t*>(b.data());
    for (std::uint64_t w = 0; w < z.bs / 8; ++w) words[w] = rng();
    rig.buffers.push_back(std::move(b));
  }
  return Status::ok();
}

// The files: created, preallocated and added to the queue, then reused across repeats and, with
// --keep-file, across runs and by fio. Files this run made (empty before it) are removed when
// setting up fails, so a full or unwritable disk leaves no 0-byte or partial bench file behind.
Status open_files(const BenchNvmeOptions& o, const NvmeSizes& z, NvmeRig& rig) {
  const nvme::DirectMode direct_mode =
      rig.choice.kind == nvme::IoEngineKind::kPsync && !rig.choice.direct
          ? nvme::DirectMode::kPrefer
          : nvme::DirectMode::kRequire;
  std::vector<std::string> made;
  const auto fail_setup = [&](Status st) {
    rig.files.clear();
    for (const std::string& m : made) ::unlink(m.c_str());
    return st;
  };
  for (std::size_t i = 0; i < z.nfiles; ++i) {
    const std::string name =
        o.paths[i] + "/" + (z.nfiles == 1 ? o.file_name : o.file_name + "." + std::to_string(i));
    nvme::FileOpenOptions fo;
    fo.create = true;
    fo.direct = direct_mode;
    TZ_ASSIGN_OR_RETURN(nvme::IoFileHandle f, nvme::IoFileHandle::open(name, fo));
    TZ_ASSIGN_OR_RETURN(std::uint64_t have, f.size_bytes());
    if (have == 0) made.push_back(name);
    rig.created.push_back(have < z.file_bytes);
    if (have < z.file_bytes) {
      if (Status st = f.preallocate(z.file_bytes); !st.is_ok()) return fail_setup(st);
    }
    Result<int> id = rig.queue->add_file(f.io_file());
    if (!id.is_ok()) return fail_setup(id.status());
    rig.ids.push_back(*id);
    rig.files.push_back(std::move(f));
  }
  return Status::ok();
}

// The requests of one pass: chunk j of every file (of the files in `only`, when given), reads,
// writes, or both alternating by chunk; the buffers cycle over the slots.
std::vector<nvme::Transfer> transfers_for(const NvmeSizes& z, const NvmeRig& rig, bool read,
                                          bool write, const std::vector<bool>* only) {
  std::vector<nvme::Transfer> t;
  t.reserve(z.chunks_per_file * z.nfiles);
  std::uint64_t slot = 0;
  for (std::uint64_t j = 0; j < z.chunks_per_file; ++j) {
    for (std::size_t f = 0; f < z.nfiles; ++f) {
      if (only != nullptr && !(*only)[f]) continue;
      const bool is_read = read && (!write || j % 2 == 0);
      t.push_back({is_read ? nvme::IoOp::kRead : nvme::IoOp::kWrite, rig.ids[f], j * z.bs,
                   rig.buffers[slot++ % z.slots].data(), z.bs});
    }
  }
  return t;
}

// A new file is written once first: reads of a hole never reach the device, and writes that
// allocate blocks measure the file system's allocator rather than the device.
Status fill_new_files(const BenchNvmeOptions& o, const NvmeSizes& z, NvmeRig& rig) {
  if (std::find(rig.created.begin(), rig.created.end(), true) == rig.created.end()) {
    return Status::ok();
  }
  TZ_LOG_INFO("bench nvme: writing %s per new file once first, so the measured %s",
              format_bytes(static_cast<double>(z.file_bytes)).c_str(),
              o.rw == "write" ? "writes overwrite allocated blocks" : "reads reach the device");
  return rig.queue->run(transfers_for(z, rig, false, true, &rig.created));
}

// The timed passes: GB/s and CPU seconds per GB of each.
struct NvmeRuns {
  std::vector<double> gbps;
  std::vector<double> cpu_per_gb;
};

Result<NvmeRuns> measure(const BenchNvmeOptions& o, const NvmeSizes& z, NvmeRig& rig) {
  const bool do_read = o.rw == "read" || o.rw == "readwrite";
  const bool do_write = o.rw == "write" || o.rw == "readwrite";
  const auto work = transfers_for(z, rig, do_read, do_write, nullptr);
  const double bytes = static_cast<double>(z.file_bytes) * static_cast<double>(z.nfiles);
  NvmeRuns runs;
  for (int r = 0; r < o.repeat; ++r) {
    const double c0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    Status st = rig.queue->run(work);
    const auto t1 = std::chrono::steady_clock::now();
    const double c1 = process_cpu_seconds();
    TZ_RETURN_IF_ERROR(st);
    const double secs = std::chrono::duration<double>(t1 - t0).count();
    runs.gbps.push_back(bytes / secs / 1e9);
    runs.cpu_per_gb.push_back((c1 - c0) / (bytes / 1e9));
  }
  return runs;
}

void remove_files(const NvmeRig& rig) {
  for (const nvme::IoFileHandle& f : rig.files) {
    if (::unlink(f.path().c_str()) != 0) {
      TZ_LOG_WARN("bench nvme: cannot remove %s: %s", f.path().c_str(), std::strerror(errno));
    }
  }
}

void report(const BenchNvmeOptions& o, const NvmeSizes& z, NvmeRig& rig,
            const NvmeRuns& runs) {
  const std::vector<double>& gbps = runs.gbps;
  const double gbps_min = *std::min_element(gbps.begin(), gbps.end());
  const double gbps_max = *std::max_element(gbps.begin(), gbps.end());
  nvme::IoQueue& queue = *rig.queue;
  nlohmann::json j = {
      {"bench", "nvme"},
      {"engine", queue.engine().name()},
      {"engine_reason", rig.choice.reason},
      {"rw", o.rw},
      {"bs_bytes", z.bs},
      {"qd", o.qd},
      {"paths", z.nfiles},
      {"size_bytes", z.file_bytes * z.nfiles},
      {"repeat", o.repeat},
      {"gbps_median", median(gbps)},
      {"gbps_min", gbps_min},
      {"gbps_max", gbps_max},
      {"gbps_runs", gbps},
      {"cpu_s_per_gb", median(runs.cpu_per_gb)},
      {"bytes_in_flight", queue.stats().max_in_flight_bytes},
      {"registered_buffers", queue.engine().buffers_registered()},
      {"fixed_files", queue.engine().files_registered()},
      {"direct", rig.files.front().direct()},
      {"sqpoll", o.sqpoll},
      {"huge_pages", !o.no_huge_pages},
      {"staging_huge_bytes", rig.pool->stats().huge_bytes},
      {"staging_bytes", rig.pool->stats().mapped_bytes},
      {"machine", machine_json()},
  };
  BenchReport out(o.json);
  out.table({{"engine", 9, true},
             {"rw", 9, true},
             {"bs", 8},
             {"qd", 4},
             {"paths", 5},
             {"median", 10},
             {"min", 10},
             {"max", 10},
             {"cpu s/GB", 10},
             {"in flight", 12}});
  out.result(j, {queue.engine().name(), o.rw, format_bytes(static_cast<double>(z.bs)),
                 cell("%u", o.qd), cell("%zu", z.nfiles), format_rate(median(gbps) * 1e9),
                 format_rate(gbps_min * 1e9), format_rate(gbps_max * 1e9),
                 cell("%.4f", median(runs.cpu_per_gb)),
                 format_bytes(static_cast<double>(queue.stats().max_in_flight_bytes))});
}

// parse -> build (pool, engine, queue, files) -> measure -> report.
int run(const BenchNvmeOptions& o) {
  Result<NvmeSizes> z = parse(o);
  if (!z.is_ok()) return fail(z.status());
  NvmeRig rig;
  if (Status st = build_queue(o, *z, rig); !st.is_ok()) return fail(st);
  if (Status st = open_files(o, *z, rig); !st.is_ok()) return fail(st);
  if (Status st = fill_new_files(o, *z, rig); !st.is_ok()) return fail(st);
  Result<NvmeRuns> runs = measure(o, *z, rig);
  if (!runs.is_ok()) return fail(runs.status());
  if (!o.keep_file) remove_files(rig);
  report(o, *z, rig, *runs);
  return 0;
}

// measure_engine_disk's rig: bench nvme's, with 1 MiB requests (32 MiB of pinned buffers in
// flight per path, not bench nvme's 256).
constexpr std::uint64_t kProbeRequestBytes = 1u << 20;

BenchNvmeOptions engine_probe_options(const std::vector<std::string>& paths,
                                      std::uint64_t bytes_per_path, const std::string& what) {
  BenchNvmeOptions o;
  o.paths = paths;
  o.bs = std::to_string(kProbeRequestBytes);
  o.size = std::to_string(bytes_per_path * paths.size());
  o.file_name = "tierzero-" + what + "-probe." + std::to_string(::getpid());
  std::replace(o.file_name.begin(), o.file_name.end(), ' ', '-');
  return o;
}

}  // namespace

// bench_common.h: one staging buffer per request slot, --qd slots per file (parse()).
std::uint64_t engine_disk_probe_host_bytes(std::size_t paths) {
  return paths * BenchNvmeOptions{}.qd * kProbeRequestBytes;
}

// bench_common.h: the engine's sequential writes then reads over one file per path, as `bench
// nvme --rw write` then `--rw read` measure them (the same rig), files removed.
Result<DiskCeiling> measure_engine_disk(const std::vector<std::string>& paths,
                                        std::uint64_t bytes_per_path, const std::string& what) {
  const BenchNvmeOptions o = engine_probe_options(paths, bytes_per_path, what);
  TZ_ASSIGN_OR_RETURN(const NvmeSizes z, parse(o));
  NvmeRig rig;
  Status st = build_queue(o, z, rig);
  if (st.is_ok()) st = open_files(o, z, rig);
  if (!st.is_ok()) return std::move(st).with_context(what + ": disk probe");
  const double bytes = static_cast<double>(z.file_bytes) * static_cast<double>(z.nfiles);
  const auto pass_gbps = [&](bool read) {
    const auto t0 = std::chrono::steady_clock::now();
    st = rig.queue->run(transfers_for(z, rig, read, !read, nullptr));
    const auto t1 = std::chrono::steady_clock::now();
    return bytes / 1e9 / std::chrono::duration<double>(t1 - t0).count();
  };
  // The best of three passes each way: a virtio disk's speed moves from second to second (a
  // probe right after a run's writes saw 0.2 GB/s, the next second 2.7), and a ceiling is the
  // best the disk did.
  DiskCeiling c;
  for (int pass = 0; pass < 3 && st.is_ok(); ++pass) {
    c.write_gbps = std::max(c.write_gbps, pass_gbps(false));
  }
  for (int pass = 0; pass < 3 && st.is_ok(); ++pass) {
    c.read_gbps = std::max(c.read_gbps, pass_gbps(true));
  }
  remove_files(rig);
  if (!st.is_ok()) return std::move(st).with_context(what + ": disk probe");
  return c;
}

namespace {

TZ_REGISTER_COMMAND([](tz::cli::CommandTree& tree) {
  CLI::App* bench = tree.group("bench", "Measure the offload path");
  CLI::App* cmd = bench->add_subcommand(
      "nvme", "O_DIRECT throughput of the NVMe engine on one file per --path (compare with fio)");
  auto opts = std::make_shared<BenchNvmeOptions>();
  cmd->add_option("--path", opts->paths, "Directory for the bench file (repeat to stripe)")
      ->required();
  cmd->add_option("--engine", opts->engine, "auto, io_uring, libaio or psync")
      ->check(CLI::IsMember({"auto", "io_uring", "libaio", "psync"}))
      ->capture_default_str();
  cmd->add_option("--rw", opts->rw, "read, write or readwrite (alternating requests)")
      ->check(CLI::IsMember({"read", "write", "readwrite"}))
      ->capture_default_str();
  cmd->add_option("--bs", opts->bs, "Request size (4 KiB multiple)")->capture_default_str();
  cmd->add_option("--qd", opts->qd, "Requests in flight per file")->capture_default_str();
  cmd->add_option("--size", opts->size, "Bytes moved per repeat, split over the paths")
      ->capture_default_str();
  cmd->add_option("--repeat", opts->repeat, "Timed passes over the file")->capture_default_str();
  cmd->add_option("--file-name", opts->file_name, "Bench file name in each path")
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "One JSON object per result");
  cmd->add_flag("--keep-file", opts->keep_file, "Keep the bench file for later runs (and fio)");
  cmd->add_flag("--sqpoll", opts->sqpoll, "io_uring: kernel submission polling thread");
  cmd->add_flag("--no-register", opts->no_register, "Do not register buffers with the engine");
  cmd->add_flag("--no-huge-pages", opts->no_huge_pages,
                 "Stage in 4 KiB pages (as fio's malloc buffers) instead of 2 MiB huge pages");
  cmd->callback([opts] { tz::cli::exit_code() = run(*opts); });
});

}  // namespace
}  // namespace tz::cli
