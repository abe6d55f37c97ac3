// `tierzero bench nvme`: O_DIRECT throughput of the NVMe engine (IoQueue over io_uring, libaio or
// psync) on one file per --path, with CPU seconds per GB and bytes in flight, so it can be held
// against fio on the same file (bench/nvme_vs_fio.sh).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli/bench_common.h"
#include "cli/command.h"
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

double cpu_seconds() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

int run(const BenchNvmeOptions& o) {
  auto fail = [](const Status& st) { return report_failure("bench nvme", st); };
  auto bs = parse_size(o.bs);
  if (!bs.is_ok()) return fail(std::move(bs).take_status().with_context("--bs"));
  auto size = parse_size(o.size);
  if (!size.is_ok()) return fail(std::move(size).take_status().with_context("--size"));
  if (*bs == 0 || *bs % 4096 != 0 || *bs > (1ull << 30)) {
    return fail(Status::invalid_argument("--bs must be a multiple of 4 KiB and at most 1 GiB"));
  }
  if (o.qd == 0 || o.repeat < 1) return fail(Status::invalid_argument("--qd and --repeat must be >= 1"));
  const std::size_t nfiles = o.paths.size();
  const std::uint64_t chunks_per_file = *size / nfiles / *bs;
  if (chunks_per_file == 0) {
    return fail(Status::invalid_argument("--size " + o.size + " is smaller than --bs times the number of paths"));
  }
  const std::uint64_t file_bytes = chunks_per_file * *bs;

  auto choice = nvme::choose_io_engine(o.engine, o.paths);
  if (!choice.is_ok()) return fail(choice.status());
  const nvme::DirectMode direct_mode =
      choice->kind == nvme::IoEngineKind::kPsync && !choice->direct ? nvme::DirectMode::kPrefer
                                                                    : nvme::DirectMode::kRequire;

  // In-flight buffers: one per request slot, from the pinned pool (registered with io_uring).
  const std::uint64_t slots = static_cast<std::uint64_t>(o.qd) * nfiles;
  PinnedPoolOptions po;
  po.budget_bytes = slots * *bs;
  po.huge_pages = !o.no_huge_pages;
  po.slab_bytes = std::min<std::uint64_t>(1ull << 30, std::max<std::uint64_t>(*bs, po.budget_bytes));
  po.slab_bytes = std::max<std::uint64_t>(po.slab_bytes / *bs * *bs, *bs);
  auto pool = PinnedPool::create(po);
  if (!pool.is_ok()) return fail(pool.status());
  // The same warnings as `tierzero info`; --no-huge-pages asks for the 4 KiB path on purpose.
  for (const std::string& w : cpu::data_path_report().warnings) {
    if (w.find("optimizer") != std::string::npos) continue;  // not this benchmark's path
    std::fprintf(stderr, "tierzero bench nvme: warning: %s\n", w.c_str());
  }

  nvme::IoEngineOptions eo;
  eo.queue_depth = static_cast<std::uint32_t>(slots);
  eo.sqpoll = o.sqpoll;
  eo.max_files = static_cast<std::uint32_t>(nfiles);
  auto engine = nvme::make_io_engine(choice->kind, eo);
  if (!engine.is_ok()) return fail(engine.status());
  nvme::IoQueueOptions qo;
  qo.block_bytes = *bs;
  qo.depth_per_file = o.qd;
  auto queue = nvme::IoQueue::create(std::move(engine).value(), qo);
  if (!queue.is_ok()) return fail(queue.status());
  if (!o.no_register) {
    Status st = store::register_pool_with_queue(*queue, *pool);
    if (!st.is_ok()) return fail(st);
  }

  std::vector<PinnedBuffer> buffers;
  std::mt19937_64 rng(42);
  for (std::uint64_t i = 0; i < slots; ++i) {
    auto b = pool->allocate(*bs);
    if (!b.is_ok()) return fail(b.status());
    auto* words = reinterpret_cast<std::uint64_t*>(b->data());
    for (std::uint64_t w = 0; w < *bs / 8; ++w) words[w] = rng();
    buffers.push_back(std::move(b).value());
  }

  // The files: created, preallocated and written once (reads of unwritten extents never reach the
  // device), then reused across repeats and, with --keep-file, across runs and by fio.
  std::vector<nvme::IoFileHandle> files;
  std::vector<int> ids;
  std::vector<bool> created;
  // Files this run made (empty before it): removed when setting up fails, so a full or
  // unwritable disk leaves no 0-byte or partial bench file behind.
  std::vector<std::string> made;
  const auto fail_setup = [&](const Status& st) {
    files.clear();
    for (const std::string& m : made) ::unlink(m.c_str());
    return fail(st);
  };
  for (std::size_t i = 0; i < nfiles; ++i) {
    const std::string name =
        o.paths[i] + "/" + (nfiles == 1 ? o.file_name : o.file_name + "." + std::to_string(i));
    nvme::FileOpenOptions fo;
    fo.create = true;
    fo.direct = direct_mode;
    auto f = nvme::IoFileHandle::open(name, fo);
    if (!f.is_ok()) return fail(f.status());
    auto have = f->size_bytes();
    if (!have.is_ok()) return fail(have.status());
    if (*have == 0) made.push_back(name);
    created.push_back(*have < file_bytes);
    if (*have < file_bytes) {
      Status st = f->preallocate(file_bytes);
      if (!st.is_ok()) return fail_setup(st);
    }
    auto id = queue->add_file(f->io_file());
    if (!id.is_ok()) return fail_setup(id.status());
    ids.push_back(*id);
    files.push_back(std::move(f).value());
  }
  auto transfers_for = [&](bool read, bool write, const std::vector<bool>* only) {
    std::vector<nvme::Transfer> t;
    t.reserve(chunks_per_file * nfiles);
    std::uint64_t slot = 0;
    for (std::uint64_t j = 0; j < chunks_per_file; ++j) {
      for (std::size_t f = 0; f < nfiles; ++f) {
        if (only != nullptr && !(*only)[f]) continue;
        const bool is_read = read && (!write || j % 2 == 0);
        t.push_back({is_read ? nvme::IoOp::kRead : nvme::IoOp::kWrite, ids[f], j * *bs,
                     buffers[slot++ % slots].data(), *bs});
      }
    }
    return t;
  };
  if (std::find(created.begin(), created.end(), true) != created.end()) {
    // A new file is written once first: reads of a hole never reach the device, and writes
    // that allocate blocks measure the file system's allocator rather than the device.
    TZ_LOG_INFO("bench nvme: writing %s per new file once first, so the measured %s",
                format_bytes(static_cast<double>(file_bytes)).c_str(),
                o.rw == "write" ? "writes overwrite allocated blocks"
                                : "reads reach the device");
    auto fill = transfers_for(false, true, &created);
    Status st = queue->run(fill);
    if (!st.is_ok()) return fail(st);
  }

  const bool do_read = o.rw == "read" || o.rw == "readwrite";
  const bool do_write = o.rw == "write" || o.rw == "readwrite";
  const auto work = transfers_for(do_read, do_write, nullptr);
  const double bytes = static_cast<double>(file_bytes) * static_cast<double>(nfiles);
  std::vector<double> gbps, cpu_per_gb;
  for (int r = 0; r < o.repeat; ++r) {
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    Status st = queue->run(work);
    const auto t1 = std::chrono::steady_clock::now();
    const double c1 = cpu_seconds();
    if (!st.is_ok()) return fail(st);
    const double secs = std::chrono::duration<double>(t1 - t0).count();
    gbps.push_back(bytes / secs / 1e9);
    cpu_per_gb.push_back((c1 - c0) / (bytes / 1e9));
  }

  if (!o.keep_file) {
    for (const nvme::IoFileHandle& f : files) {
      if (::unlink(f.path().c_str()) != 0) {
        TZ_LOG_WARN("bench nvme: cannot remove %s: %s", f.path().c_str(), std::strerror(errno));
      }
    }
  }
  nlohmann::json j = {
      {"bench", "nvme"},
      {"engine", queue->engine().name()},
      {"engine_reason", choice->reason},
      {"rw", o.rw},
      {"bs_bytes", *bs},
      {"qd", o.qd},
      {"paths", nfiles},
      {"size_bytes", file_bytes * nfiles},
      {"repeat", o.repeat},
      {"gbps_median", median(gbps)},
      {"gbps_min", *std::min_element(gbps.begin(), gbps.end())},
      {"gbps_max", *std::max_element(gbps.begin(), gbps.end())},
      {"gbps_runs", gbps},
      {"cpu_s_per_gb", median(cpu_per_gb)},
      {"bytes_in_flight", queue->stats().max_in_flight_bytes},
      {"registered_buffers", queue->engine().buffers_registered()},
      {"fixed_files", queue->engine().files_registered()},
      {"direct", files.front().direct()},
      {"sqpoll", o.sqpoll},
      {"huge_pages", !o.no_huge_pages},
      {"staging_huge_bytes", pool->stats().huge_bytes},
      {"staging_bytes", pool->stats().mapped_bytes},
      {"machine", machine_json()},
  };
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%-9s %-9s %8s %4s %5s %10s %10s %10s %10s %12s\n", "engine", "rw", "bs", "qd",
                "paths", "median", "min", "max", "cpu s/GB", "in flight");
    std::printf("%-9s %-9s %8s %4u %5zu %10s %10s %10s %10.4f %12s\n", queue->engine().name(),
                o.rw.c_str(), format_bytes(static_cast<double>(*bs)).c_str(), o.qd, nfiles,
                format_rate(median(gbps) * 1e9).c_str(),
                format_rate(j["gbps_min"].get<double>() * 1e9).c_str(),
                format_rate(j["gbps_max"].get<double>() * 1e9).c_str(), median(cpu_per_gb),
                format_bytes(static_cast<double>(queue->stats().max_in_flight_bytes)).c_str());
  }
  return 0;
}

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
