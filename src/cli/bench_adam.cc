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

int run(const AdamBenchOptions& opts) {
  Result<std::uint64_t> params = parse_count(opts.params);
  if (!params.is_ok() || *params == 0) {
    return fail(params.is_ok() ? Status::invalid_argument("--params must be > 0")
                               : params.status());
  }
  Result<cpu::OptimizerSpec> spec = parse_optimizer(opts.optimizer);
  if (!spec.is_ok()) return fail(spec.status());
  const std::optional<DType> grad_dtype = parse_dtype(opts.grad_dtype);
  const std::optional<DType> state_dtype = parse_dtype(opts.state_dtype);
  if (!grad_dtype) return fail(Status::invalid_argument("--grad-dtype: fp32, bf16 or fp16"));
  if (!state_dtype) return fail(Status::invalid_argument("--state-dtype: fp32 or bf16"));
  spec->state_dtype = *state_dtype;
  const bool has_copy = opts.param_copy != "none";
  const std::optional<DType> copy_dtype =
      has_copy ? parse_dtype(opts.param_copy) : std::optional<DType>(DType::kBF16);
  if (!copy_dtype || *copy_dtype == DType::kF32) {
    return fail(Status::invalid_argument("--param-copy: none, bf16 or fp16"));
  }
  if (Status st = cpu::set_simd_target(opts.simd); !st.is_ok()) return fail(st);
  // The same warnings as `tierzero info` (a slow SIMD path, staging without huge pages).
  for (const std::string& w : cpu::data_path_report().warnings) {
    std::fprintf(stderr, "tierzero bench adam: warning: %s\n", w.c_str());
  }

  cpu::OptimizerOptions oo;
  oo.threads = opts.threads;
  oo.pin_threads = !opts.no_pin;
  Result<cpu::CpuOptimizer> opt = cpu::CpuOptimizer::create(*spec, oo);
  if (!opt.is_ok()) return fail(opt.status());
  cpu::ArenaOptions ao;
  ao.threads = opts.threads;
  ao.pin = !opts.no_pin;
  Result<cpu::ThreadArena> arena = cpu::ThreadArena::create(ao);
  if (!arena.is_ok()) return fail(arena.status());

  const std::size_t n = *params;
  const int states = cpu::state_count(*spec);
  const bool huge = !opts.no_huge_pages;
  Result<BenchBuffer> p = BenchBuffer::create(n * 4, huge);
  Result<BenchBuffer> g = BenchBuffer::create(n * dtype_size(*grad_dtype), huge);
  Result<BenchBuffer> s0 = BenchBuffer::create(states > 0 ? n * dtype_size(*state_dtype) : 0, huge);
  Result<BenchBuffer> s1 = BenchBuffer::create(states > 1 ? n * dtype_size(*state_dtype) : 0, huge);
  Result<BenchBuffer> c = BenchBuffer::create(has_copy ? n * dtype_size(*copy_dtype) : 0, huge);
  for (const auto* b : {&p, &g, &s0, &s1, &c}) {
    if (!b->is_ok()) return fail(b->status());
  }

  // First touch on the arena's pinned threads, so pages land on their NUMA node. Gradients are
  // a small positive constant so v stays positive and nothing becomes subnormal.
  const std::uint16_t g16 = *grad_dtype == DType::kF16 ? f32_to_fp16(1e-3f).bits
                                                        : f32_to_bf16(1e-3f).bits;
  arena->execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 1 << 16),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i != r.end(); ++i) {
                          p->as<float>()[i] = 0.01f * static_cast<float>(i % 1000) - 5.0f;
                          if (*grad_dtype == DType::kF32) {
                            g->as<float>()[i] = 1e-3f;
                          } else {
                            g->as<std::uint16_t>()[i] = g16;
                          }
                        }
                        const std::size_t ssize = dtype_size(*state_dtype);
                        const std::size_t len = r.size() * ssize;
                        if (states > 0) std::memset(s0->as<char>() + r.begin() * ssize, 0, len);
                        if (states > 1) std::memset(s1->as<char>() + r.begin() * ssize, 0, len);
                        if (has_copy) {
                          std::memset(c->as<char>() + r.begin() * 2, 0, r.size() * 2);
                        }
                      });
  });

  // Split into --tensors shards of (nearly) equal size: one step covers the whole group.
  std::vector<cpu::Shard> shards;
  const std::size_t tensors = static_cast<std::size_t>(std::max(1, opts.tensors));
  for (std::size_t t = 0; t < tensors; ++t) {
    const std::size_t begin = n * t / tensors, end = n * (t + 1) / tensors;
    cpu::Shard s;
    s.param = p->as<float>() + begin;
    s.grad = g->as<char>() + begin * dtype_size(*grad_dtype);
    if (states > 0) s.state[0] = s0->as<char>() + begin * dtype_size(*state_dtype);
    if (states > 1) s.state[1] = s1->as<char>() + begin * dtype_size(*state_dtype);
    if (has_copy) s.param_copy = c->as<char>() + begin * dtype_size(*copy_dtype);
    s.n = end - begin;
    shards.push_back(s);
  }

  const std::size_t bytes_per_param =
      cpu::traffic_bytes_per_element(*spec, *grad_dtype, has_copy, *copy_dtype);
  const double bytes = static_cast<double>(n) * static_cast<double>(bytes_per_param);
  std::vector<double> step_s, ceil_s;
  std::int64_t step_count = 0;
  auto time_step = [&]() -> Result<double> {
    cpu::StepArgs a;
    a.step = ++step_count;
    a.grad_dtype = *grad_dtype;
    a.copy_dtype = *copy_dtype;
    a.grad_multiplier = 1.0f / 1024.0f;  // loss unscaling folded into the pass
    const auto t0 = Clock::now();
    TZ_RETURN_IF_ERROR(opt->step(shards, a));
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto time_ceiling = [&]() -> Result<double> {
    cpu::StepArgs a;
    a.grad_dtype = *grad_dtype;
    a.copy_dtype = *copy_dtype;
    const auto t0 = Clock::now();
    TZ_RETURN_IF_ERROR(opt->stream(shards, a));
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // One warm-up of each, then alternate (ceiling first on even repeats, update first on odd).
  for (int rep = -1; rep < opts.repeat; ++rep) {
    for (int k = 0; k < 2; ++k) {
      const bool ceiling_now = (k == 0) == (rep % 2 == 0);
      Result<double> t = ceiling_now ? time_ceiling() : time_step();
      if (!t.is_ok()) return fail(t.status());
      if (rep >= 0) (ceiling_now ? ceil_s : step_s).push_back(*t);
    }
  }

  const double t_med = median(step_s);
  const double c_med = median(ceil_s);
  const double params_per_s = static_cast<double>(n) / t_med;
  const double gbps = bytes / t_med / 1e9;
  const double ceiling_gbps = bytes / c_med / 1e9;
  const std::string copy_name = has_copy ? std::string(dtype_name(*copy_dtype)) : "none";
  std::string opt_name = opts.optimizer;
  if (opts.json) {
    json j;
    j["bench"] = "adam";
    j["optimizer"] = opt_name;
    j["params"] = n;
    j["tensors"] = tensors;
    j["threads"] = opt->threads();
    j["grad_dtype"] = std::string(dtype_name(*grad_dtype));
    j["param_copy"] = copy_name;
    j["state_dtype"] = std::string(dtype_name(*state_dtype));
    j["simd"] = cpu::simd_dispatch_target();
    j["pinned"] = !opts.no_pin;
    j["huge_pages"] = huge;
    j["repeat"] = opts.repeat;
    j["bytes_per_param"] = bytes_per_param;
    j["params_per_s"] = params_per_s;
    j["gbps"] = gbps;
    j["ceiling_gbps"] = ceiling_gbps;
    j["fraction_of_ceiling"] = gbps / ceiling_gbps;
    j["step_s_median"] = t_med;
    j["step_s_min"] = *std::min_element(step_s.begin(), step_s.end());
    j["step_s_max"] = *std::max_element(step_s.begin(), step_s.end());
    j["ceiling_s_median"] = c_med;
    j["ceiling"] = "stream kernel, same loads/stores/tiling/threads, x += g per stream";
    j["machine"] = machine_json();
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("bench adam: %s, %s params in %zu tensor(s), %d thread(s)%s, SIMD %s, "
              "grad %s, copy %s, states %s, %zu B/param, median of %d\n",
              opt_name.c_str(), opts.params.c_str(), tensors, opt->threads(),
              opts.no_pin ? "" : " pinned", cpu::simd_dispatch_target().c_str(),
              std::string(dtype_name(*grad_dtype)).c_str(), copy_name.c_str(),
              std::string(dtype_name(*state_dtype)).c_str(), bytes_per_param, opts.repeat);
  std::printf("%-10s %12s %12s %10s %10s\n", "kernel", "Gparams/s", "GB/s", "median s",
              "of ceiling");
  std::printf("%-10s %12.3f %12.2f %10.4f %9.1f%%\n", "update", params_per_s / 1e9, gbps, t_med,
              100.0 * gbps / ceiling_gbps);
  std::printf("%-10s %12.3f %12.2f %10.4f %9.1f%%\n", "ceiling", static_cast<double>(n) / c_med / 1e9,
              ceiling_gbps, c_med, 100.0);
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
