// The CPU backend's GEMM: the calls every CPU matmul goes through (oneDNN's sgemm, and its bf16
// matmul where the CPU has native bf16; their JIT kernels follow the ISA the CPU's cpuid features
// allow, never a table of CPU models), and the
// report of what it runs here: library, kernel target against the best this CPU allows, a quick
// sgemm against the cores' FMA peak. `tierzero info`, `bench ops` and `bench model` print it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tz::ops {

// C (m, n) = op(A) op(B) + beta C, row-major fp32 (op = transpose when trans_*; lda, ldb, ldc in
// elements), on `threads` threads (0 = every logical CPU) of the calling thread's own OpenMP team.
// No process-wide state is touched: calls from several threads run at once, each with its own
// thread count (ranks as threads). TZ_ASSERTs oneDNN's success (it fails only on arguments it
// rejects, a programmer error, or when it cannot allocate its packing buffers).
void cpu_sgemm(int threads, bool trans_a, bool trans_b, std::size_t m, std::size_t n,
               std::size_t k, const float* a, std::size_t lda, const float* b, std::size_t ldb,
               float beta, float* c, std::size_t ldc);

// Whether cpu_gemm_bf16 runs here: oneDNN's kernels (after ONEDNN_MAX_CPU_ISA) reach
// avx512_core_bf16, whose dot products take bf16 natively (vdpbf16ps; AMX tiles on
// avx512_core_amx). Decided once per process.
bool cpu_bf16_gemm_native();
// C (m, n) fp32 = op(A) op(B) + beta C with A and B bf16 (raw bits, row-major; lda, ldb, ldc in
// elements) on oneDNN's native bf16 matmul, on `threads` threads of the calling thread's OpenMP
// team like cpu_sgemm. Each product of two bf16 values is exact in fp32 and the sums are fp32, so
// the result differs from cpu_sgemm on the widened operands by the order of the sums, and where
// values are tiny: the native dot products read subnormal inputs as zero and flush subnormal
// results.
// Requires cpu_bf16_gemm_native(). The primitives are kept per calling thread, by shape.
void cpu_gemm_bf16(int threads, bool trans_a, bool trans_b, std::size_t m, std::size_t n,
                   std::size_t k, const std::uint16_t* a, std::size_t lda,
                   const std::uint16_t* b, std::size_t ldb, float beta, float* c,
                   std::size_t ldc);

struct GemmReport {
  std::string library;        // "oneDNN 2.6.3 (OpenMP)"
  std::string kernel_target;  // the ISA oneDNN's kernels use now: "avx2", "avx512_core", ...
  std::string cpu_target;     // the best of those ISAs this CPU's features (and the OS) allow
  bool below_cpu = false;     // kernel_target is below cpu_target
  std::string isa_setting;    // "ONEDNN_MAX_CPU_ISA=AVX2" when the environment caps the ISA
  std::vector<std::string> environment;  // other GEMM-related variables that are set, "NAME=V"
  bool cpu_bf16 = false;      // avx512_bf16 or AMX-BF16: native bf16 dot products
  bool cpu_fp16 = false;      // avx512_fp16
  std::string half_precision;  // what 16-bit GEMM the library offers and what tierzero runs
  bool bf16_gemm = false;      // cpu_bf16_gemm_native(): bf16 x bf16 matmuls run natively
  std::string bf16_kernel;     // oneDNN's implementation of them, "brg:avx512_core_amx_bf16"
  int threads = 0;
  // The FMA peak: threads x clock x fma_units x fp32_lanes x 2.
  double clock_ghz = 0;
  std::string clock_source;  // how clock_ghz was obtained
  int fma_units = 0;
  std::string fma_units_source;
  int fp32_lanes = 0;  // 16 with AVX-512F, 8 with AVX2+FMA, 4 otherwise
  double peak_gflops = 0;
  // The quick measurement (0 when not measured).
  std::string sgemm_shape;  // "1024x768 * 768x2304"
  double sgemm_gflops = 0;
  double bf16_gflops = 0;  // the same shape through cpu_gemm_bf16 (0 without bf16_gemm)
  std::vector<std::string> warnings;  // one sentence per slow path, naming what to change
};

// Probes the library and the CPU, measures the clock, and with `measure` times the model-shaped
// sgemm on `threads` threads (0 = every logical CPU; a few tenths of a second). Never fails.
GemmReport cpu_gemm_report(int threads, bool measure);

// One line for headers: "GEMM: oneDNN 2.6.3 (OpenMP), kernels avx2 (CPU allows avx2), sgemm
// 1024x768 * 768x2304 on 2 threads 150.2 GFLOP/s = 0.81 of FMA peak 185.6 (...)", then each
// warning ("; warning: ...").
std::string gemm_report_line(const GemmReport& r);

// The CPU family from CPUID leaf 1's eax: the base family, plus the extended family where the
// base is 0xf (AMD Zen 4's 0x00a10f11 gives 0x19, an Intel Xeon's 0x000806f8 gives 6).
unsigned cpuid_family(unsigned leaf1_eax);
// The vector FMA units a core of this vendor (`amd`: "AuthenticAMD") and family retires per cycle
// at `fp32_lanes` (16: AVX-512), as the peak counts them, and in `source` why: 1 on AMD family 19h
// with AVX-512 (Zen 4's two FMA pipes are 256 bits wide and a 512-bit FMA takes both), else 2.
int fma_units_for(bool amd, unsigned family, int fp32_lanes, std::string* source);

// Rank of a oneDNN ISA name in the order sse41 < avx < avx2 < avx2_vnni < avx512_core <
// avx512_core_vnni < avx512_core_bf16 < avx512_core_amx; -1 for a name not in that list.
int gemm_isa_rank(const std::string& isa);

}  // namespace tz::ops
