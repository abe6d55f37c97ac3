// `tierzero info [--path DIR]... [--json]`: what this machine offers the engine, in the spirit of
// DeepSpeed's ds_report. Every probe reports failure as data ("no GPU: <reason>"), never a crash.
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "comm/probe.h"
#include "core/host_probe.h"
#include "core/units.h"
#include "cpu/data_path.h"
#include "cpu/simd.h"
#include "cpu/topology.h"
#include "gpu/probe.h"
#include "nvme/probe.h"
#include "ops/gemm.h"

namespace tz::cli {
namespace {

using nlohmann::json;

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

json cpu_report() {
  json j;
  j["model"] = cpu_model_name();
  j["logical_cpus"] = sysconf(_SC_NPROCESSORS_ONLN);
  json flags = json::array();
  __builtin_cpu_init();
#define TZ_FLAG(name) \
  if (__builtin_cpu_supports(name)) flags.push_back(name);
  TZ_FLAG("sse4.2") TZ_FLAG("avx") TZ_FLAG("avx2") TZ_FLAG("fma") TZ_FLAG("f16c")
  TZ_FLAG("avx512f") TZ_FLAG("avx512bw") TZ_FLAG("avx512vl") TZ_FLAG("avx512dq")
  TZ_FLAG("avx512bf16") TZ_FLAG("avx512fp16") TZ_FLAG("avx512vnni")
#undef TZ_FLAG
  j["simd_flags"] = flags;
  json targets = json::array();
  for (const auto& t : cpu::simd_targets_supported()) targets.push_back(t);
  j["simd_targets_supported"] = targets;
  j["optimizer_dispatch_target"] = cpu::simd_dispatch_target();
  return j;
}

json memory_report() {
  json j;
  const HostMemory mem = host_memory();
  j["total_bytes"] = mem.total_bytes;
  j["available_bytes"] = mem.available_bytes;
  const MemlockLimit memlock = memlock_limit();
  if (memlock.known) {
    j["memlock_limit_bytes"] = memlock.unlimited ? json("unlimited") : json(memlock.bytes);
  }
  j["can_lock_any_amount"] = geteuid() == 0;  // root holds CAP_IPC_LOCK in the usual setups
  j["hugepages_total"] = mem.hugepages_total;
  j["hugepages_free"] = mem.hugepages_free;
  j["hugepage_bytes"] = mem.hugepage_bytes;
  j["transparent_hugepages"] = read_first_line("/sys/kernel/mm/transparent_hugepage/enabled");
  return j;
}

json kernel_report() {
  utsname u{};
  json j;
  if (uname(&u) == 0) {
    j["release"] = u.release;
    j["machine"] = u.machine;
  }
  j["io_uring_disabled"] = read_first_line("/proc/sys/kernel/io_uring_disabled");
  return j;
}

// The CPU backend's GEMM (ops/gemm.h): library, kernel target against what the CPU allows, a quick
// sgemm on every core against the cores' FMA peak, 16-bit support, and warnings naming the setting.
json gemm_report() {
  const ops::GemmReport r = ops::cpu_gemm_report(0, /*measure=*/true);
  json j;
  j["library"] = r.library;
  j["kernel_target"] = r.kernel_target;
  j["cpu_target"] = r.cpu_target;
  j["below_cpu"] = r.below_cpu;
  j["isa_setting"] = r.isa_setting;
  j["environment"] = r.environment;
  j["threads"] = r.threads;
  j["sgemm_shape"] = r.sgemm_shape;
  j["sgemm_gflops"] = r.sgemm_gflops;
  j["peak_gflops"] = r.peak_gflops;
  j["fraction_of_peak"] = r.peak_gflops > 0 ? r.sgemm_gflops / r.peak_gflops : 0.0;
  j["peak_formula"] = "threads x clock_ghz x fma_units x fp32_lanes x 2";
  j["clock_ghz"] = r.clock_ghz;
  j["clock_source"] = r.clock_source;
  j["fma_units"] = r.fma_units;
  j["fma_units_source"] = r.fma_units_source;
  j["fp32_lanes"] = r.fp32_lanes;
  j["cpu_native_bf16"] = r.cpu_bf16;
  j["cpu_native_fp16"] = r.cpu_fp16;
  j["half_precision"] = r.half_precision;
  j["bf16_gemm"] = r.bf16_gemm;
  j["bf16_kernel"] = r.bf16_kernel;
  j["bf16_gflops"] = r.bf16_gflops;
  j["summary"] = ops::gemm_report_line(r);
  j["warnings"] = r.warnings;
  return j;
}

struct InfoOptions {
  std::vector<std::string> paths;
  bool as_json = false;
};

json collect(const InfoOptions& o) {
  json j;
  j["tierzero_version"] = "0.1.0";
  j["cpu"] = cpu_report();
  j["topology"] = cpu::topology_report();
  j["memory"] = memory_report();
  j["kernel"] = kernel_report();
  j["gpu"] = gpu::probe_gpus();
  j["comm"] = comm::probe_comm();
  json paths = json::array();
  for (const auto& p : o.paths) paths.push_back(nvme::probe_path(p));
  j["paths"] = paths;
  const cpu::DataPathReport dp = cpu::data_path_report();
  json d;
  d["optimizer_simd_target"] = dp.simd_target;
  d["optimizer_best_simd_target"] = dp.best_simd_target;
  d["staging_huge_pages"] = dp.staging_huge_pages;
  d["staging_page_source"] = dp.staging_source;
  d["thp_mode"] = dp.thp_mode;
  d["thp_defrag"] = dp.thp_defrag;
  d["reserved_hugepages_free"] = dp.hugepages_free;
  d["memlock"] = dp.memlock_unlimited || dp.cap_ipc_lock
                     ? json("unlimited")
                     : json(format_bytes(static_cast<double>(dp.memlock_limit_bytes)));
  json warnings = json::array();
  for (const std::string& w : dp.warnings) warnings.push_back(w);
  d["warnings"] = warnings;
  j["data_path"] = d;
  j["gemm"] = gemm_report();
  return j;
}

std::string scalar(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// Human form: one "section.key: value" line per leaf, bytes shown with units.
void print_human(const json& j, const std::string& prefix) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = j.is_array() ? prefix + "[" + std::to_string(std::distance(j.begin(), it)) + "]"
                                         : (prefix.empty() ? it.key() : prefix + "." + it.key());
    const json& v = it.value();
    if (v.is_object() || (v.is_array() && !v.empty() && v[0].is_object())) {
      print_human(v, key);
    } else if (v.is_array()) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : " ") + scalar(x);
      std::printf("%-40s %s\n", key.c_str(), s.c_str());
    } else if (v.is_number_unsigned() && key.find("bytes") != std::string::npos) {
      std::printf("%-40s %s\n", key.c_str(), format_bytes(static_cast<double>(v.get<std::uint64_t>())).c_str());
    } else {
      std::printf("%-40s %s\n", key.c_str(), scalar(v).c_str());
    }
  }
}

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  auto opts = std::make_shared<InfoOptions>();
  CLI::App* info = tree.root->add_subcommand(
      "info", "Report CPU SIMD, NUMA, memory and memlock, GPUs, NCCL/MPI, per --path: "
              "filesystem, free space, O_DIRECT, io_uring and libaio support, and the data path "
              "this host takes (optimizer SIMD target, huge pages for staging), the GEMM library, its "
              "kernel target and a quick sgemm against the FMA peak, with warnings");
  info->add_option("--path", opts->paths, "Directory to probe for swap files (repeatable)");
  info->add_flag("--json", opts->as_json, "Print one JSON object");
  info->callback([opts] {
    const json j = collect(*opts);
    if (opts->as_json) {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      print_human(j, "");
      for (const char* section : {"data_path", "gemm"}) {
        for (const auto& w : j[section]["warnings"]) {
          std::fprintf(stderr, "tierzero info: warning: %s\n", w.get<std::string>().c_str());
        }
      }
    }
    exit_code() = 0;
  });
});

}  // namespace
}  // namespace tz::cli
