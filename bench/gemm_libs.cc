// Side-by-side sgemm of the CPU GEMM libraries a Debian 12 machine offers, at GPT-2-small's matmul
// shapes (forward, and the transposed variants backward uses), row-major, fp32. One source built
// once per library (they export the same BLAS symbols, so they never share a binary):
//   -DLIB_OPENBLAS  OpenBLAS (libopenblas-pthread-dev), kernel chosen by its own CPU table or by
//                   OPENBLAS_CORETYPE; thread count process-global (openblas_set_num_threads)
//   -DLIB_BLIS      BLIS (libblis-dev), bli_sgemm_ex with a per-call rntm_t thread count
//   -DLIB_DNNL      oneDNN (libdnnl-dev), dnnl_sgemm; threads per calling thread (OpenMP ICV)
// Modes: "T threads" = one caller, the library's T threads; "R ranks x 1" = R caller threads at
// once, each asking the library for 1 thread (ranks as threads), aggregate GFLOP/s. OpenBLAS in
// that mode runs behind one mutex, as tierzero's backend had to (its thread count is global).
// Prints one JSON object per (shape, mode). Built and run by bench/gemm_libs.sh.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(LIB_OPENBLAS)
#include <cblas.h>
static const char* kLib = "openblas";
static std::string target() { return openblas_get_corename(); }
static std::mutex g_mu;
static void gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b,
                 int ldb, float* c, int ldc, int threads, bool concurrent) {
  std::unique_lock<std::mutex> lock(g_mu, std::defer_lock);
  if (concurrent) lock.lock();
  openblas_set_num_threads(threads);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}
#elif defined(LIB_BLIS)
#include <blis.h>
static const char* kLib = "blis";
static std::string target() { return bli_arch_string(bli_arch_query_id()); }
static void gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b,
                 int ldb, float* c, int ldc, int threads, bool /*concurrent*/) {
  rntm_t rntm = BLIS_RNTM_INITIALIZER;
  bli_rntm_set_num_threads(threads, &rntm);
  float one = 1.0f, zero = 0.0f;
  bli_sgemm_ex(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, m,
               n, k, &one, const_cast<float*>(a), lda, 1, const_cast<float*>(b), ldb, 1, &zero, c,
               ldc, 1, nullptr, &rntm);
}
#elif defined(LIB_DNNL)
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
static const char* kLib = "onednn";
static std::string target() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}
static void gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b,
                 int ldb, float* c, int ldc, int threads, bool /*concurrent*/) {
  omp_set_num_threads(threads);
  if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc) !=
      dnnl_success) {
    std::fprintf(stderr, "dnnl_sgemm failed\n");
    std::exit(1);
  }
}
#else
#error "define LIB_OPENBLAS, LIB_BLIS or LIB_DNNL"
#endif

struct Shape {
  const char* name;
  int m, n, k;
  bool ta, tb;
};

// GPT-2-small, batch 4 x seq 256 = 1024 rows, embd 768: the forward (x W), dx (dout W^T) and
// dW (x^T dout) of the qkv, fc and fc-proj matmuls, as ops' linear calls them.
constexpr Shape kShapes[] = {
    {"qkv_fwd", 1024, 2304, 768, false, false},  {"fc_fwd", 1024, 3072, 768, false, false},
    {"proj_fwd", 1024, 768, 3072, false, false}, {"qkv_dx", 1024, 768, 2304, false, true},
    {"fc_dx", 1024, 768, 3072, false, true},     {"proj_dx", 1024, 3072, 768, false, true},
    {"qkv_dw", 768, 2304, 1024, true, false},    {"fc_dw", 768, 3072, 1024, true, false},
    {"proj_dw", 3072, 768, 1024, true, false},
};

struct Buffers {
  std::vector<float> a, b, c;
};

static Buffers make(const Shape& s, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Buffers x;
  x.a.resize(static_cast<size_t>(s.m) * s.k);
  x.b.resize(static_cast<size_t>(s.k) * s.n);
  x.c.resize(static_cast<size_t>(s.m) * s.n);
  for (float& v : x.a) v = u(rng);
  for (float& v : x.b) v = u(rng);
  return x;
}

static void run(const Shape& s, Buffers& x, int threads, bool concurrent) {
  const int lda = s.ta ? s.m : s.k;
  const int ldb = s.tb ? s.k : s.n;
  gemm(s.ta, s.tb, s.m, s.n, s.k, x.a.data(), lda, x.b.data(), ldb, x.c.data(), s.n, threads,
       concurrent);
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 1;  // library threads per call
  int ranks = argc > 2 ? std::atoi(argv[2]) : 1;    // concurrent callers
  int repeat = argc > 3 ? std::atoi(argv[3]) : 5;
  using clock = std::chrono::steady_clock;
  for (const Shape& s : kShapes) {
    std::vector<Buffers> bufs;
    for (int r = 0; r < ranks; ++r) bufs.push_back(make(s, 1234 + r));
    for (int r = 0; r < ranks; ++r) run(s, bufs[r], threads, ranks > 1);  // warm-up
    std::vector<double> secs;
    for (int i = 0; i < repeat; ++i) {
      std::barrier start(ranks + 1);
      std::vector<std::thread> callers;
      for (int r = 0; r < ranks; ++r) {
        callers.emplace_back([&, r] {
          start.arrive_and_wait();
          run(s, bufs[r], threads, ranks > 1);
        });
      }
      start.arrive_and_wait();
      const auto t0 = clock::now();
      for (auto& t : callers) t.join();
      secs.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    }
    const double flops = 2.0 * s.m * s.n * s.k * ranks;
    const double med = median(secs);
    std::printf(
        "{\"lib\":\"%s\",\"target\":\"%s\",\"shape\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,"
        "\"trans_a\":%d,\"trans_b\":%d,\"threads\":%d,\"ranks\":%d,\"median_s\":%.5f,"
        "\"min_s\":%.5f,\"max_s\":%.5f,\"gflops\":%.2f}\n",
        kLib, target().c_str(), s.name, s.m, s.n, s.k, s.ta, s.tb, threads, ranks, med,
        *std::min_element(secs.begin(), secs.end()), *std::max_element(secs.begin(), secs.end()),
        flops / med * 1e-9);
    std::fflush(stdout);
  }
  return 0;
}
