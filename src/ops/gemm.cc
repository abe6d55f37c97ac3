// ops/gemm.h: the CPU backend's sgemm through oneDNN, and the report of what it runs. oneDNN picks
// its JIT kernels from the CPU's cpuid feature bits (Xbyak's mayiuse), so a CPU newer than the
// library still gets the widest ISA it has; Debian's build runs on OpenMP, whose thread count is a
// per-thread setting, so every caller sets its own and no lock is needed between callers.
#include "ops/gemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "core/assert.h"
#include "ops/internal/gemm_hook.h"

namespace tz::ops {
namespace {

std::atomic<internal::SgemmEntryHook> g_entry_hook{nullptr};

// oneDNN's ISA names, lowest first (dnnl_cpu_isa_t's values are not ordered this way).
constexpr const char* kIsaOrder[] = {"sse41",       "avx",
                                     "avx2",        "avx2_vnni",
                                     "avx512_core", "avx512_core_vnni",
                                     "avx512_core_bf16", "avx512_core_amx"};

std::string isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_all: return "all";
    default: return "other (" + std::to_string(static_cast<unsigned>(isa)) + ")";
  }
}

// What cpuid and XCR0 say this CPU and OS allow, read here (independently of oneDNN's own probe).
struct CpuFeatures {
  bool sse41 = false, avx = false, avx2 = false, fma = false, avx_vnni = false;
  bool avx512f = false, avx512cd = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
  bool os_avx = false, os_avx512 = false, os_amx = false;
  bool amd = false;  // "AuthenticAMD"
  unsigned family = 0;  // base family, plus the extended family where the base is 0xf
};

CpuFeatures cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) != 0) {
    f.amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;  // "Auth" "enti" "cAMD"
  }
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return f;
  f.family = cpuid_family(a);
  f.sse41 = (c >> 19) & 1;
  f.fma = (c >> 12) & 1;
  f.avx = (c >> 28) & 1;
  const bool osxsave = (c >> 27) & 1;
  if (osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    const std::uint64_t xcr0 = (static_cast<std::uint64_t>(hi) << 32) | lo;
    f.os_avx = (xcr0 & 0x6) == 0x6;                      // SSE and AVX state
    f.os_avx512 = f.os_avx && (xcr0 & 0xe0) == 0xe0;     // opmask, ZMM_Hi256, Hi16_ZMM
    f.os_amx = (xcr0 & 0x60000) == 0x60000;              // XTILECFG, XTILEDATA
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) != 0) {
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512cd = (b >> 28) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.avx512_vnni = (c >> 11) & 1;
    f.amx_bf16 = (d >> 22) & 1;
    f.avx512_fp16 = (d >> 23) & 1;
    f.amx_tile = (d >> 24) & 1;
    f.amx_int8 = (d >> 25) & 1;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) != 0) {
      f.avx_vnni = (a >> 4) & 1;
      f.avx512_bf16 = (a >> 5) & 1;
    }
  }
#endif
  return f;
}

// The best oneDNN ISA level these features allow ("" below SSE4.1).
std::string best_isa(const CpuFeatures& f) {
  const bool avx2 = f.avx && f.os_avx && f.avx2 && f.fma;
  const bool core = avx2 && f.os_avx512 && f.avx512f && f.avx512cd && f.avx512bw && f.avx512dq &&
                    f.avx512vl;
  const bool core_vnni = core && f.avx512_vnni;
  const bool core_bf16 = core_vnni && f.avx512_bf16;
  if (core_bf16 && f.os_amx && f.amx_tile && f.amx_int8 && f.amx_bf16) return "avx512_core_amx";
  if (core_bf16) return "avx512_core_bf16";
  if (core_vnni) return "avx512_core_vnni";
  if (core) return "avx512_core";
  if (avx2 && f.avx_vnni) return "avx2_vnni";
  if (avx2) return "avx2";
  if (f.avx && f.os_avx) return "avx";
  if (f.sse41) return "sse41";
  return "";
}

// The core clock, measured: a chain of dependent register adds takes one cycle per add on every
// x86 core, so adds / seconds is the clock the core runs at now (turbo included). The fastest of
// several short runs, so a preempted run does not count.
double measured_clock_ghz() {
#if defined(__x86_64__)
  constexpr int kLoops = 1 << 16;  // x 32 adds = 2M cycles, under a millisecond
  double best_s = 1e30;
  for (int run = 0; run < 9; ++run) {
    std::uint64_t x = 0;
    const std::uint64_t one = 1;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kLoops; ++i) {
#define TZ_ADD4 "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
      __asm__ volatile(TZ_ADD4 TZ_ADD4 TZ_ADD4 TZ_ADD4 TZ_ADD4 TZ_ADD4 TZ_ADD4 TZ_ADD4
                       : "+r"(x)
                       : "r"(one));
#undef TZ_ADD4
    }
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    TZ_ASSERT(x == static_cast<std::uint64_t>(kLoops) * 32, "clock probe: add chain miscounted");
    best_s = std::min(best_s, dt.count());
  }
  return static_cast<double>(kLoops) * 32.0 / best_s / 1e9;
#else
  return 0.0;
#endif
}

double cpuinfo_mhz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return std::atof(line.c_str() + colon + 1);
    }
  }
  return 0.0;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

namespace internal {
void set_sgemm_entry_hook(SgemmEntryHook hook) { g_entry_hook.store(hook); }
}  // namespace internal

void cpu_sgemm(int threads, bool trans_a, bool trans_b, std::size_t m, std::size_t n,
               std::size_t k, const float* a, std::size_t lda, const float* b, std::size_t ldb,
               float beta, float* c, std::size_t ldc) {
  // The thread count is the calling thread's own OpenMP setting (its nthreads ICV): oneDNN sizes
  // its team from it, and other threads' settings are untouched.
  omp_set_num_threads(threads > 0 ? threads : omp_get_num_procs());
  if (internal::SgemmEntryHook hook = g_entry_hook.load(); hook != nullptr) hook();
  const dnnl_status_t st = dnnl_sgemm(
      trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', static_cast<dnnl_dim_t>(m),
      static_cast<dnnl_dim_t>(n), static_cast<dnnl_dim_t>(k), 1.0f, a,
      static_cast<dnnl_dim_t>(lda), b, static_cast<dnnl_dim_t>(ldb), beta, c,
      static_cast<dnnl_dim_t>(ldc));
  if (st != dnnl_success) {
    std::fprintf(stderr, "dnnl_sgemm: status %d for m %zu, n %zu, k %zu\n", static_cast<int>(st),
                 m, n, k);
  }
  TZ_ASSERT(st == dnnl_success, "dnnl_sgemm failed (status above)");
}

bool cpu_bf16_gemm_native() {
  static const bool native = gemm_isa_rank(isa_name(dnnl_get_effective_cpu_isa())) >=
                             gemm_isa_rank("avx512_core_bf16");
  return native;
}

namespace {

// One oneDNN matmul primitive per shape, kept by the thread that made it (no lock between ranks
// as threads); oneDNN's own cache holds the generated kernels. Bounded: a caller that runs
// through many shapes starts over rather than growing without end.
struct Bf16Gemms {
  using Key = std::tuple<std::size_t, std::size_t, std::size_t, bool, bool, std::size_t,
                         std::size_t, std::size_t, float, int>;
  struct Entry {
    dnnl::matmul primitive;
    dnnl::memory::desc a, b, c;
  };
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Entry> primitives;
};
constexpr std::size_t kMaxBf16Primitives = 256;

// The matmul's description for C (m, n) fp32 = op(A) op(B) + beta C on bf16 A and B. oneDNN
// sizes it for the calling thread's OpenMP thread count. Throws dnnl::error.
dnnl::matmul::primitive_desc bf16_matmul_desc(const dnnl::engine& engine, bool trans_a,
                                              bool trans_b, std::size_t m, std::size_t n,
                                              std::size_t k, std::size_t lda, std::size_t ldb,
                                              float beta, std::size_t ldc) {
  using dims = dnnl::memory::dims;
  using dt = dnnl::memory::data_type;
  const auto d = [](std::size_t v) { return static_cast<dnnl::memory::dim>(v); };
  const dnnl::memory::desc a_md({d(m), d(k)}, dt::bf16,
                                trans_a ? dims{1, d(lda)} : dims{d(lda), 1});
  const dnnl::memory::desc b_md({d(k), d(n)}, dt::bf16,
                                trans_b ? dims{1, d(ldb)} : dims{d(ldb), 1});
  const dnnl::memory::desc c_md({d(m), d(n)}, dt::f32, dims{d(ldc), 1});
  dnnl::primitive_attr attr;
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);  // C = A B + beta C
    attr.set_post_ops(ops);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine);
}

[[noreturn]] void bf16_failed(const dnnl::error& e, std::size_t m, std::size_t n,
                              std::size_t k) {
  std::fprintf(stderr, "oneDNN bf16 matmul: %s (status %d) for m %zu, n %zu, k %zu\n", e.what(),
               static_cast<int>(e.status), m, n, k);
  ::tz::detail::assert_fail("oneDNN bf16 matmul", __FILE__, __LINE__,
                            "oneDNN rejected or failed a bf16 matmul (message above)");
}

}  // namespace

void cpu_gemm_bf16(int threads, bool trans_a, bool trans_b, std::size_t m, std::size_t n,
                   std::size_t k, const std::uint16_t* a, std::size_t lda,
                   const std::uint16_t* b, std::size_t ldb, float beta, float* c,
                   std::size_t ldc) {
  TZ_ASSERT(cpu_bf16_gemm_native(), "cpu_gemm_bf16 without native bf16 kernels");
  const int team = threads > 0 ? threads : omp_get_num_procs();
  omp_set_num_threads(team);  // this thread's own team, as in cpu_sgemm; the primitive's too
  if (internal::SgemmEntryHook hook = g_entry_hook.load(); hook != nullptr) hook();
  try {
    thread_local Bf16Gemms gemms;
    const Bf16Gemms::Key key{m, n, k, trans_a, trans_b, lda, ldb, ldc, beta, team};
    auto it = gemms.primitives.find(key);
    if (it == gemms.primitives.end()) {
      if (gemms.primitives.size() >= kMaxBf16Primitives) gemms.primitives.clear();
      const dnnl::matmul::primitive_desc pd =
          bf16_matmul_desc(gemms.engine, trans_a, trans_b, m, n, k, lda, ldb, beta, ldc);
      it = gemms.primitives
               .emplace(key, Bf16Gemms::Entry{dnnl::matmul(pd), pd.src_desc(),
                                              pd.weights_desc(), pd.dst_desc()})
               .first;
    }
    const Bf16Gemms::Entry& mm = it->second;
    // oneDNN takes the operands as non-const handles; it only reads A and B.
    const dnnl::memory am(mm.a, gemms.engine, const_cast<std::uint16_t*>(a));
    const dnnl::memory bm(mm.b, gemms.engine, const_cast<std::uint16_t*>(b));
    const dnnl::memory cm(mm.c, gemms.engine, c);
    mm.primitive.execute(gemms.stream,
                         {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    gemms.stream.wait();
  } catch (const dnnl::error& e) {
    bf16_failed(e, m, n, k);
  }
}

int gemm_isa_rank(const std::string& isa) {
  for (int i = 0; i < static_cast<int>(std::size(kIsaOrder)); ++i) {
    if (isa == kIsaOrder[i]) return i;
  }
  return -1;
}

GemmReport cpu_gemm_report(int threads, bool measure) {
  GemmReport r;
  const dnnl_version_t* v = dnnl_version();
  r.library = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
              std::to_string(v->patch) +
              (v->cpu_runtime == DNNL_RUNTIME_OMP ? " (OpenMP)" : " (non-OpenMP runtime)");
  r.kernel_target = isa_name(dnnl_get_effective_cpu_isa());
  const CpuFeatures f = cpu_features();
  r.cpu_target = best_isa(f);
  for (const char* name : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    if (const char* val = std::getenv(name); val != nullptr && r.isa_setting.empty()) {
      r.isa_setting = std::string(name) + "=" + val;
    }
  }
  for (const char* name : {"ONEDNN_CPU_ISA_HINTS", "DNNL_CPU_ISA_HINTS", "OMP_NUM_THREADS",
                           "OMP_WAIT_POLICY", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                           "OPENBLAS_NUM_THREADS"}) {
    if (const char* val = std::getenv(name); val != nullptr) {
      std::string note = std::string(name) + "=" + val;
      if (std::string(name).rfind("OPENBLAS", 0) == 0) {
        note += " (no effect: the CPU backend's GEMM is oneDNN, not OpenBLAS)";
      } else if (std::string(name).rfind("OMP_NUM", 0) == 0) {
        note += " (no effect on ops: each backend sets its own thread count)";
      }
      r.environment.push_back(note);
    }
  }
  const int kr = gemm_isa_rank(r.kernel_target);
  const int cr = gemm_isa_rank(r.cpu_target);
  r.below_cpu = kr >= 0 && cr >= 0 && kr < cr;
  if (r.below_cpu) {
    std::string w = "the GEMM runs " + r.kernel_target + " kernels but this CPU allows " +
                    r.cpu_target + ": ";
    if (!r.isa_setting.empty()) {
      w += r.isa_setting + " in the environment caps oneDNN's ISA; unset it";
    } else {
      w += r.library + " does not enable " + r.cpu_target +
           " here (AMX needs Linux 5.16+ to grant the process its tile state); report it with "
           "this line and ONEDNN_VERBOSE=1's output";
    }
    r.warnings.push_back(w);
  }
  r.cpu_bf16 = f.avx512_bf16 || (f.amx_bf16 && f.os_amx);
  r.cpu_fp16 = f.avx512_fp16;
  r.bf16_gemm = cpu_bf16_gemm_native();
  r.half_precision =
      r.library +
      " has bf16 matmul kernels for avx512_core_bf16 and AMX and none for avx512_fp16 (its ISA "
      "list stops at AMX); this CPU has " +
      std::string(r.cpu_bf16 ? "native bf16" : "no native bf16") + " and " +
      (r.cpu_fp16 ? "native fp16" : "no native fp16") + "; tierzero's CPU backend runs " +
      (r.bf16_gemm ? "bf16 x bf16 matmuls on oneDNN's native bf16 kernels (fp32 sums) and the "
                     "rest in fp32 (fp16 widened around sgemm)"
                   : "every matmul in fp32 (16-bit tensors widened around sgemm, fp32 "
                     "accumulation)");

  r.threads = threads > 0 ? threads : omp_get_num_procs();
  const double measured = measured_clock_ghz();
  const double mhz = cpuinfo_mhz();
  if (measured > 0) {
    r.clock_ghz = measured;
    r.clock_source = "measured: dependent register adds (1 cycle each), fastest of 9 runs on one "
                     "core; /proc/cpuinfo says " + fixed(mhz, 0) + " MHz";
  } else {
    r.clock_ghz = mhz / 1000.0;
    r.clock_source = "/proc/cpuinfo cpu MHz";
  }
  r.fp32_lanes = (f.avx512f && f.os_avx512) ? 16 : (f.avx2 && f.fma && f.os_avx) ? 8 : 4;
  r.fma_units = fma_units_for(f.amd, f.family, r.fp32_lanes, &r.fma_units_source);
  r.peak_gflops = r.threads * r.clock_ghz * r.fma_units * r.fp32_lanes * 2.0;

  if (measure) {
    constexpr std::size_t m = 1024, k = 768, n = 2304;  // GPT-2-small's qkv forward
    r.sgemm_shape = "1024x768 * 768x2304";
    std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n, 0.0f);
    // GFLOP/s of `gemm` (one warm-up, the median of five), after checking it wrote c: every
    // element is k x 0.5 x 0.25 (exact in fp32 and, for the operands, in bf16).
    const auto gflops = [&](const char* what, const auto& gemm) {
      std::fill(c.begin(), c.end(), 0.0f);
      std::vector<double> times;
      for (int rep = -1; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        gemm();
        const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
        if (rep >= 0) times.push_back(dt.count());
      }
      std::sort(times.begin(), times.end());
      TZ_ASSERT(c[0] == 0.5f * 0.25f * static_cast<float>(k) && c.back() == c[0], what);
      return 2.0 * m * n * k / times[times.size() / 2] / 1e9;
    };
    r.sgemm_gflops = gflops("gemm report: wrong sgemm result", [&] {
      cpu_sgemm(r.threads, false, false, m, n, k, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    });
    if (r.bf16_gemm) {
      const std::vector<std::uint16_t> ab(m * k, 0x3f00), bb(k * n, 0x3e80);  // 0.5, 0.25
      r.bf16_gflops = gflops("gemm report: wrong bf16 result", [&] {
        cpu_gemm_bf16(r.threads, false, false, m, n, k, ab.data(), k, bb.data(), n, 0.0f,
                      c.data(), n);
      });
    }
  }
  if (r.bf16_gemm) {
    // oneDNN's name for the implementation, from a description alone (no kernel is generated).
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      r.bf16_kernel =
          bf16_matmul_desc(engine, false, false, 1024, 2304, 768, 768, 2304, 0.0f, 2304)
              .impl_info_str();
    } catch (const dnnl::error& e) {
      r.bf16_kernel = std::string("unavailable: ") + e.what();
    }
  }
  return r;
}

unsigned cpuid_family(unsigned leaf1_eax) {
  const unsigned base = (leaf1_eax >> 8) & 0xf;
  return base == 0xf ? base + ((leaf1_eax >> 20) & 0xff) : base;
}

int fma_units_for(bool amd, unsigned family, int fp32_lanes, std::string* source) {
  if (fp32_lanes == 16 && amd && family == 0x19) {
    *source = "AMD Zen 4 (family 19h): its two FMA pipes are 256 bits wide, and a 512-bit FMA "
              "takes both";
    return 1;
  }
  *source = "assumed: 2 vector FMA pipes (Intel since Haswell, AMD since Zen 2; some Xeon "
            "Bronze/Silver/Gold 5xxx have one 512-bit unit)";
  return 2;
}

std::string gemm_report_line(const GemmReport& r) {
  std::string s = "GEMM: " + r.library + ", kernels " + r.kernel_target + " (CPU allows " +
                  (r.cpu_target.empty() ? "unknown" : r.cpu_target) + ")";
  if (!r.isa_setting.empty()) s += ", " + r.isa_setting;
  if (r.sgemm_gflops > 0) {
    s += ", sgemm " + r.sgemm_shape + " on " + std::to_string(r.threads) + " threads " +
         fixed(r.sgemm_gflops, 1) + " GFLOP/s";
    if (r.peak_gflops > 0) {
      s += " = " + fixed(r.sgemm_gflops / r.peak_gflops, 2) + " of FMA peak " +
           fixed(r.peak_gflops, 1) + " (" + std::to_string(r.threads) + " x " +
           fixed(r.clock_ghz, 2) + " GHz measured x " + std::to_string(r.fma_units) + " FMA x " +
           std::to_string(r.fp32_lanes) + " lanes x 2)";
    }
  }
  if (r.bf16_gflops > 0) {
    s += ", bf16 " + fixed(r.bf16_gflops, 1) + " GFLOP/s (" + r.bf16_kernel + ")";
  }
  for (const std::string& w : r.warnings) s += "; warning: " + w;
  return s;
}

}  // namespace tz::ops
