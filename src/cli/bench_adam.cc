// `tierzero bench adam`: throughput of the fused CPU optimizer update (params/s and GB/s of real
// memory traffic) next to the machine's own ceiling, measured in the same run by a streaming
// kernel with the same loads and stores, the same tiling and the same pinned threads. Repeats
// alternate the ceiling and the update so both see the same machine state.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <oneapi/tbb/parallel_for.h>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "core/dtype.h"
#include "core/units.h"
#include "cpu/data_path.h"
#include "cpu/optimizer.h"
#include "cpu/simd.h"
#include "cpu/topology.h"

namespace tz::cli {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct AdamBenchOptions {
  std::string params = "256M";
  int threads = 0;
  std::string optimizer = "adamw";
  std::string grad_dtype = "fp32";
  std::string param_copy = "none";
  std::string state_dtype = "fp32";
  int repeat = 7;
  int tensors = 1;
  std::string simd = "auto";
  bool no_pin = false;
  bool no_huge_pages = false;
  bool json = false;
};

// One page-aligned host allocation, advised to use transparent huge pages (as a pinned pool's
// slabs are) unless disabled; move-only.
class BenchBuffer {
 public:
  static Result<BenchBuffer> create(std::size_t bytes, bool huge_pages) {
    constexpr std::size_t kAlign = 2u << 20;
    const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      return Status::out_of_memory("bench adam: cannot allocate " +
                                   format_bytes(static_cast<double>(rounded)) +
                                   "; lower --params");
    }
    // Advice only: without huge pages the benchmark still runs, with more TLB misses.
    if (huge_pages && madvise(p, rounded, MADV_HUGEPAGE) != 0) huge_pages = false;
    return BenchBuffer(p);
  }
  BenchBuffer(BenchBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)) {}
  BenchBuffer& operator=(BenchBuffer&&) = delete;
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;
  ~BenchBuffer() { std::free(ptr_); }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  explicit BenchBuffer(void* p) : ptr_(p) {}
  void* ptr_;
};

Result<cpu::OptimizerSpec> parse_optimizer(const std::string& name) {
  if (name == "adamw") return cpu::OptimizerSpec::adamw(1e-3, 0.01);
  if (name == "adam") return cpu::OptimizerSpec::adam(1e-3, 0.0);
  if (name == "sgd") return cpu::OptimizerSpec::sgd(1e-2, 0.9);
  if (name == "lion") return cpu::OptimizerSpec::lion(1e-4, 0.01);
  if (name == "adagrad") return cpu::OptimizerSpec::adagrad(1e-2);
  return Status::invalid_argument("--optimizer " + name +
                                  ": accepted adamw, adam, sgd, lion, adagrad");
}

int fail(const Status& st) { return report_failure("bench adam", st); }

// The options resolved: the update, its dtypes and the shape of the work.
struct AdamSetup {
  std::size_t n = 0;  // parameters
  cpu::OptimizerSpec spec;
  DType grad_dtype = DType::kF32;
  DType state_dtype = DType::kF32;
  bool has_copy = false;
  DType copy_dtype = DType::kBF16;  // the 16-bit copy's type (bf16 when there is none)
  std::size_t tensors = 1;
  bool huge = true;
};

Result<AdamSetup> parse(const AdamBenchOptions& opts) {
  AdamSetup a;
  Result<std::uint64_t> params = parse_count(opts.params);
  if (!params.is_ok()) return params.status();
  if (*params == 0) return Status::invalid_argument("--params must be > 0");
  a.n = *params;
  TZ_ASSIGN_OR_RETURN(a.spec, parse_optimizer(opts.optimizer));
  const std::optional<DType> grad_dtype = parse_dtype(opts.grad_dtype);
  const std::optional<DType> state_dtype = parse_dtype(opts.state_dtype);
  if (!grad_dtype) return Status::invalid_argument("--grad-dtype: fp32, bf16 or fp16");
  if (!state_dtype) return Status::invalid_argument("--state-dtype: fp32 or bf16");
  a.grad_dtype = *grad_dtype;
  a.state_dtype = *state_dtype;
  a.spec.state_dtype = *state_dtype;
  a.has_copy = opts.param_copy != "none";
  const std::optional<DType> copy_dtype =
      a.has_copy ? parse_dtype(opts.param_copy) : std::optional<DType>(DType::kBF16);
  if (!copy_dtype || *copy_dtype == DType::kF32) {
    return Status::invalid_argument("--param-copy: none, bf16 or fp16");
  }
  a.copy_dtype = *copy_dtype;
  a.tensors = static_cast<std::size_t>(std::max(1, opts.tensors));
  a.huge = !opts.no_huge_pages;
  return a;
}

// The update's memory: fp32 parameters, gradients, up to two states and the 16-bit copy, first
// touched on the arena's pinned threads, and the shards that split it into --tensors.
struct AdamBuffers {
  std::optional<BenchBuffer> p, g, s0, s1, c;
  std::vector<cpu::Shard> shards;
};

Status allocate(const AdamSetup& a, AdamBuffers& b) {
  const std::size_t n = a.n;
  const int states = cpu::state_count(a.spec);
  const std::size_t state_bytes = n * dtype_size(a.state_dtype);
  const auto make = [&](std::optional<BenchBuffer>& out, std::size_t bytes) -> Status {
    TZ_ASSIGN_OR_RETURN(BenchBuffer buffer, BenchBuffer::create(bytes, a.huge));
    out.emplace(std::move(buffer));
    return Status::ok();
  };
  TZ_RETURN_IF_ERROR(make(b.p, n * 4));
  TZ_RETURN_IF_ERROR(make(b.g, n * dtype_size(a.grad_dtype)));
  TZ_RETURN_IF_ERROR(make(b.s0, states > 0 ? state_bytes : 0));
  TZ_RETURN_IF_ERROR(make(b.s1, states > 1 ? state_bytes : 0));
  return make(b.c, a.has_copy ? n * dtype_size(a.copy_dtype) : 0);
}

// First touch on the arena's pinned threads, so pages land on their NUMA node. Gradients are a
// small positive constant so v stays positive and nothing becomes subnormal.
void first_touch(const AdamSetup& a, cpu::ThreadArena& arena, const AdamBuffers& b) {
  const int states = cpu::state_count(a.spec);
  const std::uint16_t g16 =
      a.grad_dtype == DType::kF16 ? f32_to_fp16(1e-3f).bits : f32_to_bf16(1e-3f).bits;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, a.n, 1 << 16),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i != r.end(); ++i) {
                          b.p->as<float>()[i] = 0.01f * static_cast<float>(i % 1000) - 5.0f;
                          if (a.grad_dtype == DType::kF32) {
                            b.g->as<float>()[i] = 1e-3f;
                          } else {
                            b.g->as<std::uint16_t>()[i] = g16;
                          }
                        }
                        const std::size_t ssize = dtype_size(a.state_dtype);
                        const std::size_t len = r.size() * ssize;
                        if (states > 0) std::memset(b.s0->as<char>() + r.begin() * ssize, 0, len);
                        if (states > 1) std::memset(b.s1->as<char>() + r.begin() * ssize, 0, len);
                        if (a.has_copy) {
                          std::memset(b.c->as<char>() + r.begin() * 2, 0, r.size() * 2);
                        }
                      });
  });
}

// Split into --tensors shards of (nearly) equal size: one step covers the whole group.
void split(const AdamSetup& a, AdamBuffers& b) {
  const int states = cpu::state_count(a.spec);
  for (std::size_t t = 0; t < a.tensors; ++t) {
    const std::size_t begin = a.n * t / a.tensors, end = a.n * (t + 1) / a.tensors;
    cpu::Shard s;
    s.param = b.p->as<float>() + begin;
    s.grad = b.g->as<char>() + begin * dtype_size(a.grad_dtype);
    if (states > 0) s.state[0] = b.s0->as<char>() + begin * dtype_size(a.state_dtype);
    if (states > 1) s.state[1] = b.s1->as<char>() + begin * dtype_size(a.state_dtype);
    if (a.has_copy) s.param_copy = b.c->as<char>() + begin * dtype_size(a.copy_dtype);
    s.n = end - begin;
    b.shards.push_back(s);
  }
}

// Seconds of each timed update and of each pass of the ceiling's streaming kernel.
struct AdamTimes {
  std::vector<double> step_s;
  std::vector<double> ceiling_s;
};

// One warm-up of each, then alternate (ceiling first on even repeats, update first on odd), so
// both see the same machine state.
Result<AdamTimes> measure(const AdamSetup& a, int repeat, cpu::CpuOptimizer& opt,
                          const std::vector<cpu::Shard>& shards) {
  std::int64_t step_count = 0;
  auto time_step = [&]() -> Result<double> {
    cpu::StepArgs args;
    args.step = ++step_count;
    args.grad_dtype = a.grad_dtype;
    args.copy_dtype = a.copy_dtype;
    args.grad_multiplier = 1.0f / 1024.0f;  // loss unscaling folded into the pass
    const auto t0 = Clock::now();
    TZ_RETURN_IF_ERROR(opt.step(shards, args));
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto time_ceiling = [&]() -> Result<double> {
    cpu::StepArgs args;
    args.grad_dtype = a.grad_dtype;
    args.copy_dtype = a.copy_dtype;
    const auto t0 = Clock::now();
    TZ_RETURN_IF_ERROR(opt.stream(shards, args));
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  AdamTimes times;
  for (int rep = -1; rep < repeat; ++rep) {
    for (int k = 0; k < 2; ++k) {
      const bool ceiling_now = (k == 0) == (rep % 2 == 0);
      TZ_ASSIGN_OR_RETURN(double t, ceiling_now ? time_ceiling() : time_step());
      if (rep >= 0) (ceiling_now ? times.ceiling_s : times.step_s).push_back(t);
    }
  }
  return times;
}

void report(const AdamBenchOptions& opts, const AdamSetup& a, int threads, const AdamTimes& t) {
  const std::size_t bytes_per_param =
      cpu::traffic_bytes_per_element(a.spec, a.grad_dtype, a.has_copy, a.copy_dtype);
  const double bytes = static_cast<double>(a.n) * static_cast<double>(bytes_per_param);
  const double t_med = median(t.step_s);
  const double c_med = median(t.ceiling_s);
  const double params_per_s = static_cast<double>(a.n) / t_med;
  const double gbps = bytes / t_med / 1e9;
  const double ceiling_gbps = bytes / c_med / 1e9;
  const std::string copy_name = a.has_copy ? std::string(dtype_name(a.copy_dtype)) : "none";
  json j;
  j["bench"] = "adam";
  j["optimizer"] = opts.optimizer;
  j["params"] = a.n;
  j["tensors"] = a.tensors;
  j["threads"] = threads;
  j["grad_dtype"] = std::string(dtype_name(a.grad_dtype));
  j["param_copy"] = copy_name;
  j["state_dtype"] = std::string(dtype_name(a.state_dtype));
  j["simd"] = cpu::simd_dispatch_target();
  j["pinned"] = !opts.no_pin;
  j["huge_pages"] = a.huge;
  j["repeat"] = opts.repeat;
  j["bytes_per_param"] = bytes_per_param;
  j["params_per_s"] = params_per_s;
  j["gbps"] = gbps;
  j["ceiling_gbps"] = ceiling_gbps;
  j["fraction_of_ceiling"] = gbps / ceiling_gbps;
  j["step_s_median"] = t_med;
  j["step_s_min"] = *std::min_element(t.step_s.begin(), t.step_s.end());
  j["step_s_max"] = *std::max_element(t.step_s.begin(), t.step_s.end());
  j["ceiling_s_median"] = c_med;
  j["ceiling"] = "stream kernel, same loads/stores/tiling/threads, x += g per stream";
  j["machine"] = machine_json();
  BenchReport out(opts.json);
  out.text(cell("bench adam: %s, %s params in %zu tensor(s), %d thread(s)%s, SIMD %s, grad %s, "
                "copy %s, states %s, %zu B/param, median of %d",
                opts.optimizer.c_str(), opts.params.c_str(), a.tensors, threads,
                opts.no_pin ? "" : " pinned", cpu::simd_dispatch_target().c_str(),
                std::string(dtype_name(a.grad_dtype)).c_str(), copy_name.c_str(),
                std::string(dtype_name(a.state_dtype)).c_str(), bytes_per_param, opts.repeat));
  out.table({{"kernel", 10, true},
             {"Gparams/s", 12},
             {"GB/s", 12},
             {"median s", 10},
             {"of ceiling", 10}});
  out.result(j, {"update", cell("%.3f", params_per_s / 1e9), cell("%.2f", gbps),
                 cell("%.4f", t_med), cell("%.1f%%", 100.0 * gbps / ceiling_gbps)});
  out.row({"ceiling", cell("%.3f", static_cast<double>(a.n) / c_med / 1e9),
           cell("%.2f", ceiling_gbps), cell("%.4f", c_med), cell("%.1f%%", 100.0)});
}

// parse -> build (optimizer, arena, buffers) -> measure -> report.
int run(const AdamBenchOptions& opts) {
  Result<AdamSetup> a = parse(opts);
  if (!a.is_ok()) return fail(a.status());
  if (Status st = cpu::set_simd_target(opts.simd); !st.is_ok()) return fail(st);
  // The same warnings as `tierzero info` (a slow SIMD path, staging without huge pages).
  for (const std::string& w : cpu::data_path_report().warnings) {
    std::fprintf(stderr, "tierzero bench adam: warning: %s\n", w.c_str());
  }
  cpu::OptimizerOptions oo;
  oo.threads = opts.threads;
  oo.pin_threads = !opts.no_pin;
  Result<cpu::CpuOptimizer> opt = cpu::CpuOptimizer::create(a->spec, oo);
  if (!opt.is_ok()) return fail(opt.status());
  cpu::ArenaOptions ao;
  ao.threads = opts.threads;
  ao.pin = !opts.no_pin;
  Result<cpu::ThreadArena> arena = cpu::ThreadArena::create(ao);
  if (!arena.is_ok()) return fail(arena.status());
  AdamBuffers buffers;
  if (Status st = allocate(*a, buffers); !st.is_ok()) return fail(st);
  first_touch(*a, *arena, buffers);
  split(*a, buffers);
  Result<AdamTimes> times = measure(*a, opts.repeat, *opt, buffers.shards);
  if (!times.is_ok()) return fail(times.status());
  report(opts, *a, opt->threads(), *times);
  return 0;
}

}  // namespace

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* bench = tree.group("bench", "Measure the offload path");
  CLI::App* cmd = bench->add_subcommand(
      "adam", "Fused CPU optimizer update vs the machine's streaming ceiling (same run)");
  auto opts = std::make_shared<AdamBenchOptions>();
  cmd->add_option("--params", opts->params, "Parameters to update (e.g. 256M, 1e6)")
      ->capture_default_str();
  cmd->add_option("--threads", opts->threads, "Worker threads (0 = one per core)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_option("--optimizer", opts->optimizer, "adamw, adam, sgd, lion or adagrad")
      ->capture_default_str();
  cmd->add_option("--grad-dtype", opts->grad_dtype, "Gradient type: fp32, bf16 or fp16")
      ->capture_default_str();
  cmd->add_option("--param-copy", opts->param_copy,
                  "16-bit parameter copy written in the same pass: none, bf16 or fp16")
      ->capture_default_str();
  cmd->add_option("--state-dtype", opts->state_dtype, "Optimizer state type: fp32 or bf16 (Adam)")
      ->capture_default_str();
  cmd->add_option("--repeat", opts->repeat, "Timed repeats (median reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--tensors", opts->tensors, "Split the parameters into this many shards")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  cmd->add_option("--simd", opts->simd, "SIMD target: auto, reference or a Highway target name")
      ->capture_default_str();
  cmd->add_flag("--no-pin", opts->no_pin, "Do not bind worker threads to cores");
  cmd->add_flag("--no-huge-pages", opts->no_huge_pages, "Do not advise transparent huge pages");
  cmd->add_flag("--json", opts->json, "One JSON object per result");
  cmd->callback([opts] { exit_code() = run(*opts); });
});

}  // namespace tz::cli
