// The CPU backend's GEMM (ops/gemm.h): its kernel target is not below what this CPU supports
// (judged here from the compiler's own cpuid probe, not the library's), and two backends on two
// threads run their matmuls at the same time (both inside the sgemm path at once, observed by a
// rendezvous that a process-wide lock would never let the second caller reach), with results
// equal to a float64 reference; and the native bf16 GEMM against sgemm and float64.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu/host_device.h"
#include "ops/gemm.h"
#include "ops/internal/gemm_hook.h"
#include "ops/ops.h"
#include "ops_harness.h"

namespace tz::ops {
namespace {

using testing::DeviceArrays;
using testing::expect_close;
using testing::random_vector;
using testing::tolerance_for;
using Vec = std::vector<double>;

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// What this CPU supports, from GCC's cpuid probe (which also checks that the OS saves the wider
// registers): AVX-512 F/BW/DQ/VL calls for AVX-512 kernels, AVX2+FMA for AVX2 (or wider) kernels.
TEST(GemmKernelTarget, IsNotBelowWhatTheCpuSupports) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!avx512 && !avx2) {
    GTEST_SKIP() << "this CPU has neither AVX-512 F/BW/DQ/VL nor AVX2+FMA: no kernel target to "
                    "judge against";
  }
  const GemmReport r = cpu_gemm_report(1, /*measure=*/false);
  std::cout << "[ gemm ] " << gemm_report_line(r) << "\n";
  const std::string& k = r.kernel_target;
  const std::string how = r.isa_setting.empty() ? "" : " (" + r.isa_setting + " is set)";
  if (avx512) {
    EXPECT_TRUE(starts_with(k, "avx512"))
        << "this CPU supports AVX-512 but the GEMM runs " << k << " kernels" << how;
  } else {
    EXPECT_TRUE(starts_with(k, "avx2") || starts_with(k, "avx512"))
        << "this CPU supports AVX2+FMA but the GEMM runs " << k << " kernels" << how;
  }
  // The report's own judgment (over the whole ISA ladder) agrees, and warns when below.
  EXPECT_FALSE(r.below_cpu) << r.kernel_target << " below " << r.cpu_target;
  EXPECT_EQ(r.warnings.empty(), !r.below_cpu);
  EXPECT_GE(gemm_isa_rank(r.cpu_target), gemm_isa_rank(avx512 ? "avx512_core" : "avx2"))
      << "the report's CPU probe says " << r.cpu_target;
  EXPECT_EQ(r.fp32_lanes, avx512 ? 16 : 8);
}

// The peak's FMA units from CPUID values written out by hand: Zen 4 (family 19h) counts one
// 512-bit unit with AVX-512 and two 256-bit ones without it; Zen 5 (1ah), Zen 3 (19h without
// AVX-512) and Intel two.
TEST(GemmReport, FmaUnitsFollowTheCpuFamily) {
  EXPECT_EQ(cpuid_family(0x00a10f11u), 0x19u);  // AMD EPYC 9004 (Zen 4)
  EXPECT_EQ(cpuid_family(0x00b00f21u), 0x1au);  // Zen 5
  EXPECT_EQ(cpuid_family(0x000806f8u), 6u);     // Intel Xeon (Sapphire Rapids)
  std::string why;
  EXPECT_EQ(fma_units_for(true, 0x19, 16, &why), 1);
  EXPECT_NE(why.find("Zen 4"), std::string::npos) << why;
  EXPECT_EQ(fma_units_for(true, 0x19, 8, &why), 2);
  EXPECT_EQ(fma_units_for(true, 0x1a, 16, &why), 2);
  EXPECT_EQ(fma_units_for(false, 6, 16, &why), 2);
  EXPECT_EQ(fma_units_for(false, 0x19, 16, &why), 2);
}

TEST(GemmReport, PeakFollowsItsFormulaAndTheQuickSgemmIsReal) {
  const GemmReport r = cpu_gemm_report(1, /*measure=*/true);
  std::cout << "[ gemm ] " << gemm_report_line(r) << "\n";
  ASSERT_GT(r.clock_ghz, 0.2);
  EXPECT_LT(r.clock_ghz, 10.0);
  EXPECT_DOUBLE_EQ(r.peak_gflops, 1 * r.clock_ghz * r.fma_units * r.fp32_lanes * 2.0);
  EXPECT_GT(r.sgemm_gflops, 0.0);
  EXPECT_FALSE(r.library.empty());
  EXPECT_NE(gemm_isa_rank(r.kernel_target), -1) << r.kernel_target;
}

// Both callers must be inside the sgemm path at once: each waits here for the other, up to a
// deadline far past any sgemm of this test. A lock anywhere on the path (the old process-wide BLAS
// mutex) would keep the second caller out while the first waits, and the deadline would pass.
struct Rendezvous {
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int timed_out = 0;
  std::vector<std::thread::id> threads;
};
Rendezvous* g_rendezvous = nullptr;

void meet_the_other_caller() {
  Rendezvous& rv = *g_rendezvous;
  std::unique_lock<std::mutex> lock(rv.mu);
  ++rv.arrived;
  rv.threads.push_back(std::this_thread::get_id());
  rv.cv.notify_all();
  if (!rv.cv.wait_for(lock, std::chrono::seconds(30), [&] { return rv.arrived >= 2; })) {
    ++rv.timed_out;
  }
}

// One backend on its own HostDevice (its own stream worker thread), as a rank as a thread has.
struct Rank {
  std::unique_ptr<gpu::HostDevice> device;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<DeviceArrays> arrays;
  Tensor x, w, out;
  Vec xv, wv;
};

Rank make_rank(int threads, std::uint64_t seed, int rows, int in, int out) {
  Rank r;
  auto d = gpu::HostDevice::create(256ull << 20);
  TZ_ASSERT(d.is_ok(), "HostDevice");
  r.device = std::move(*d);
  auto o = Ops::create(*r.device, OpsOptions{threads});
  TZ_ASSERT(o.is_ok(), "Ops::create");
  r.ops = std::move(*o);
  r.arrays = std::make_unique<DeviceArrays>(*r.device, r.device->compute_stream());
  std::cout << "[ seed ] " << seed << "\n";
  std::mt19937_64 rng(seed);
  r.xv = random_vector(rng, static_cast<std::size_t>(rows) * in, -1, 1);
  r.wv = random_vector(rng, static_cast<std::size_t>(in) * out, -1, 1);
  r.x = r.arrays->upload(r.xv, DType::kF32);
  r.w = r.arrays->upload(r.wv, DType::kF32);
  r.out = r.arrays->zeros(static_cast<std::size_t>(rows) * out, DType::kF32);
  return r;
}

// out (rows, out) = x (rows, in) W (in, out), in float64.
Vec matmul_ref(const Vec& x, const Vec& w, int rows, int in, int out) {
  Vec y(static_cast<std::size_t>(rows) * out, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < in; ++k) {
      for (int c = 0; c < out; ++c) y[r * out + c] += x[r * in + k] * w[k * out + c];
    }
  }
  return y;
}

void run_two_ranks_at_once(int threads, int rows, int in, int out) {
  std::vector<Rank> ranks;
  ranks.push_back(make_rank(threads, 20261203, rows, in, out));
  ranks.push_back(make_rank(threads, 20261204, rows, in, out));
  std::vector<std::thread> callers;
  for (Rank& r : ranks) {
    callers.emplace_back([&r, rows, in, out] {
      gpu::Stream& s = r.device->compute_stream();
      EXPECT_TRUE(r.ops->matmul_forward(r.out, r.x, r.w, WeightLayout::kInOut, Tensor{}, rows, in,
                                        out, s)
                      .is_ok());
      EXPECT_TRUE(s.synchronize().is_ok());
    });
  }
  for (std::thread& t : callers) t.join();
  for (Rank& r : ranks) {
    expect_close(r.arrays->download(r.out, static_cast<std::size_t>(rows) * out),
                 matmul_ref(r.xv, r.wv, rows, in, out), tolerance_for(DType::kF32),
                 "matmul forward on one of two concurrent ranks");
  }
}

TEST(GemmConcurrency, TwoBackendsOnTwoThreadsAreInsideSgemmAtOnce) {
  Rendezvous rv;
  g_rendezvous = &rv;
  internal::set_sgemm_entry_hook(&meet_the_other_caller);
  run_two_ranks_at_once(/*threads=*/1, 37, 29, 41);
  internal::set_sgemm_entry_hook(nullptr);
  g_rendezvous = nullptr;
  EXPECT_EQ(rv.arrived, 2);
  EXPECT_EQ(rv.timed_out, 0) << "one sgemm waited 30 s for the other to enter: something on the "
                                "path serialises backends";
  ASSERT_EQ(rv.threads.size(), 2u);
  EXPECT_NE(rv.threads[0], rv.threads[1]);
}

// Without the seam: two backends of two threads each, at GPT-2-like widths, at once; both exact.
TEST(GemmConcurrency, TwoMultiThreadedBackendsAtOnceStayCorrect) {
  run_two_ranks_at_once(/*threads=*/2, 256, 192, 320);
}

// Native bf16 GEMM (cpu_gemm_bf16) against sgemm on the same operands widened to fp32. Products
// of two bf16 values are exact in fp32, so the two differ only by the order of the fp32 sums: per
// element, at most a few units of 2^-24 times k times the sum of |a b| (plus |beta c|).
TEST(GemmBf16, MatchesSgemmOnTheWidenedOperands) {
  if (!cpu_bf16_gemm_native()) {
    GTEST_SKIP() << "oneDNN has no native bf16 kernels on this CPU (kernel target "
                 << cpu_gemm_report(1, false).kernel_target
                 << " is below avx512_core_bf16): cpu_gemm_bf16 is not used here";
  }
  std::mt19937_64 rng(20261207);
  struct Shape {
    std::size_t m, n, k;
  };
  for (const Shape sh : {Shape{37, 41, 29}, Shape{64, 96, 256}, Shape{256, 320, 192}}) {
    for (int trans = 0; trans < 4; ++trans) {
      for (const float beta : {0.0f, 1.0f, 0.5f}) {
        const bool ta = (trans & 1) != 0;
        const bool tb = (trans & 2) != 0;
        // Row strides past the rows' lengths, so a stride taken for a length shows.
        const std::size_t lda = (ta ? sh.m : sh.k) + 3;
        const std::size_t ldb = (tb ? sh.k : sh.n) + 5;
        const std::size_t ldc = sh.n + 2;
        const std::size_t a_rows = ta ? sh.k : sh.m;
        const std::size_t b_rows = tb ? sh.n : sh.k;
        Vec av = random_vector(rng, a_rows * lda, -2, 2);
        Vec bv = random_vector(rng, b_rows * ldb, -2, 2);
        const Vec c0 = random_vector(rng, sh.m * ldc, -1, 1);
        std::vector<std::uint16_t> a16(av.size()), b16(bv.size());
        std::vector<float> a32(av.size()), b32(bv.size());
        for (std::size_t i = 0; i < av.size(); ++i) {
          a16[i] = f32_to_bf16(static_cast<float>(av[i])).bits;
          a32[i] = bf16_to_f32(bf16{a16[i]});
        }
        for (std::size_t i = 0; i < bv.size(); ++i) {
          b16[i] = f32_to_bf16(static_cast<float>(bv[i])).bits;
          b32[i] = bf16_to_f32(bf16{b16[i]});
        }
        std::vector<float> native(c0.begin(), c0.end()), widened(c0.begin(), c0.end());
        cpu_gemm_bf16(2, ta, tb, sh.m, sh.n, sh.k, a16.data(), lda, b16.data(), ldb, beta,
                      native.data(), ldc);
        cpu_sgemm(2, ta, tb, sh.m, sh.n, sh.k, a32.data(), lda, b32.data(), ldb, beta,
                  widened.data(), ldc);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < sh.m; ++i) {
          for (std::size_t j = 0; j < ldc; ++j) {
            const std::size_t at = i * ldc + j;
            if (j >= sh.n) {  // past the row: untouched
              bad += native[at] != static_cast<float>(c0[at]);
              continue;
            }
            double abs_sum = std::abs(beta * c0[at]);
            double exact = beta * static_cast<double>(static_cast<float>(c0[at]));
            for (std::size_t p = 0; p < sh.k; ++p) {
              const double x = a32[ta ? p * lda + i : i * lda + p];
              const double y = b32[tb ? j * ldb + p : p * ldb + j];
              abs_sum += std::abs(x * y);
              exact += x * y;
            }
            const double lim = 4.0 * static_cast<double>(sh.k + 2) * 0x1p-24 * abs_sum;
            const bool ok = std::abs(native[at] - widened[at]) <= 2 * lim &&
                            std::abs(native[at] - exact) <= lim;
            if (!ok && bad == 0) {
              ADD_FAILURE() << "m " << sh.m << " n " << sh.n << " k " << sh.k << " trans_a " << ta
                            << " trans_b " << tb << " beta " << beta << " at (" << i << ", " << j
                            << "): native " << native[at] << ", sgemm " << widened[at]
                            << ", float64 " << exact << " (bound " << lim << ")";
            }
            bad += !ok;
          }
        }
        EXPECT_EQ(bad, 0u) << "m " << sh.m << " n " << sh.n << " k " << sh.k << " trans_a " << ta
                           << " trans_b " << tb << " beta " << beta;
      }
    }
  }
}

// The CPU backend's matmul forward and backward on bf16 tensors: on the native kernels (the
// default) and widened to fp32 (OpsOptions::native_bf16_gemm false), each against float64. Where
// the CPU has no native bf16 kernels both backends widen, and the test checks the option is
// harmless there.
TEST(GemmBf16, BackendMatmulOnBf16TensorsBothWays) {
  auto dev = gpu::HostDevice::create(256ull << 20);
  ASSERT_TRUE(dev.is_ok());
  gpu::Stream& s = (*dev)->compute_stream();
  DeviceArrays arrays(**dev, s);
  constexpr int rows = 48, in = 160, out = 96;
  std::mt19937_64 rng(7);
  Vec xv = random_vector(rng, rows * in, -1, 1);
  Vec wv = random_vector(rng, in * out, -1, 1);
  Vec bv = random_vector(rng, out, -1, 1);
  Vec gv = random_vector(rng, rows * out, -1, 1);
  const Tensor x = arrays.upload(xv, DType::kBF16);
  const Tensor w = arrays.upload(wv, DType::kBF16);
  const Tensor b = arrays.upload(bv, DType::kBF16);
  const Tensor g = arrays.upload(gv, DType::kBF16);
  // float64 references on the rounded values: y = x W + b, dx = g W^T, dW = x^T g, db = sum g.
  Vec y_ref = matmul_ref(xv, wv, rows, in, out);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < out; ++c) y_ref[r * out + c] += bv[c];
  }
  Vec dx_ref(rows * in, 0.0), dw_ref(in * out, 0.0), db_ref(out, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < out; ++c) {
      db_ref[c] += gv[r * out + c];
      for (int k = 0; k < in; ++k) {
        dx_ref[r * in + k] += gv[r * out + c] * wv[k * out + c];
        dw_ref[k * out + c] += xv[r * in + k] * gv[r * out + c];
      }
    }
  }
  for (const bool native : {true, false}) {
    auto o = Ops::create(**dev, OpsOptions{2, native});
    ASSERT_TRUE(o.is_ok());
    const std::string how = native ? "native bf16 kernels" : "widened to fp32";
    std::cout << "[ ops ] " << (*o)->name() << " (" << how << ")\n";
    // The backend's name says when it runs the native kernels.
    EXPECT_EQ(std::string((*o)->name()).find(", bf16 ") != std::string::npos,
              native && cpu_bf16_gemm_native())
        << (*o)->name();
    const Tensor y = arrays.zeros(rows * out, DType::kBF16);
    const Tensor dx = arrays.zeros(rows * in, DType::kBF16);
    const Tensor dw = arrays.zeros(in * out, DType::kBF16);
    const Tensor db = arrays.zeros(out, DType::kBF16);
    ASSERT_TRUE(
        (*o)->matmul_forward(y, x, w, WeightLayout::kInOut, b, rows, in, out, s).is_ok());
    ASSERT_TRUE((*o)->matmul_backward(dx, Accumulate::kOverwrite, dw, db, g, x, w,
                                      WeightLayout::kInOut, rows, in, out, s)
                    .is_ok());
    expect_close(arrays.download(y, rows * out), y_ref, tolerance_for(DType::kBF16),
                 "forward, " + how);
    expect_close(arrays.download(dx, rows * in), dx_ref, tolerance_for(DType::kBF16),
                 "dx, " + how);
    expect_close(arrays.download(dw, in * out), dw_ref, tolerance_for(DType::kBF16), "dW, " + how);
    expect_close(arrays.download(db, out), db_ref, tolerance_for(DType::kBF16), "db, " + how);
  }
}

}  // namespace
}  // namespace tz::ops
