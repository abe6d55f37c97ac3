// The CPU backend of ops/ops.h: matmuls through ops/gemm.h (oneDNN), the rest from the Highway
// primitives of cpu_kernels.cc, parallel with one oneTBB arena. Each op is one host_callback on
// the caller's HostDevice stream; it takes the backend's run lock (ops of one backend run one at
// a time, each using every thread) and converts 16-bit tensors to fp32 on the way in and out,
// except bf16 x bf16 matmuls on CPUs with native bf16 kernels, which take the tensors as they are.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "core/assert.h"
#include "cpu/simd.h"
#include "ops/gemm.h"
#include "ops/internal/backends.h"
#include "ops/internal/cpu_kernels.h"
#include "ops/ops_math.h"

namespace tz::ops::internal {
namespace {

namespace ck = cpu_kernels;
using std::size_t;

constexpr size_t kAttnBlock = 64;        // query and key rows per attention block
constexpr size_t kRowsPerChunk = 32;     // layernorm backward's fixed row chunks (determinism)
constexpr size_t kElemsPerTask = 16384;  // grain of element-wise loops

// Per-thread fp32 scratch: slot `slot` with room for `n` floats (grows, never shrinks).
float* tls_scratch(int slot, size_t n) {
  thread_local std::vector<float> buffers[6];
  std::vector<float>& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// n elements of `t` from element `offset` as fp32: a pointer into t when it is fp32, else the
// converted copy in `buf`.
const float* load(ConstTensor t, size_t offset, size_t n, float* buf) {
  if (t.dtype == DType::kF32) return static_cast<const float*>(t.data) + offset;
  cpu::convert_16_to_f32(static_cast<const std::uint16_t*>(t.data) + offset, t.dtype, buf, n);
  return buf;
}

// As load, but always into `dst`.
void load_into(ConstTensor t, size_t offset, size_t n, float* dst) {
  if (t.dtype == DType::kF32) {
    std::memcpy(dst, static_cast<const float*>(t.data) + offset, n * sizeof(float));
  } else {
    cpu::convert_16_to_f32(static_cast<const std::uint16_t*>(t.data) + offset, t.dtype, dst, n);
  }
}

// t[offset, offset+n) = src (add: += src), rounding once to t's dtype. `buf` holds n floats
// (used for 16-bit accumulation only).
void store(Tensor t, size_t offset, const float* src, size_t n, bool add, float* buf) {
  if (t.dtype == DType::kF32) {
    float* dst = static_cast<float*>(t.data) + offset;
    if (add) {
      ck::axpy(1.0f, src, dst, n);
    } else if (dst != src) {
      std::memcpy(dst, src, n * sizeof(float));
    }
    return;
  }
  std::uint16_t* dst = static_cast<std::uint16_t*>(t.data) + offset;
  if (add) {
    cpu::convert_16_to_f32(dst, t.dtype, buf, n);
    ck::add(buf, src, buf, n);
    cpu::convert_f32_to_16(buf, dst, t.dtype, n);
  } else {
    cpu::convert_f32_to_16(src, dst, t.dtype, n);
  }
}

size_t sz(std::int64_t v) { return static_cast<size_t>(v); }

class CpuOps final : public Ops {
 public:
  CpuOps(gpu::Device& device, int threads, bool native_bf16_gemm)
      : device_(device), threads_(threads), bf16_gemm_(native_bf16_gemm && cpu_bf16_gemm_native()) {
    const GemmReport gemm = cpu_gemm_report(threads, /*measure=*/false);
    name_ = "cpu (" + gemm.library + " sgemm " + gemm.kernel_target +
            (bf16_gemm_ ? ", bf16 " + gemm.bf16_kernel : std::string()) + "; " +
            std::to_string(threads) + " threads; " + cpu::simd_dispatch_target() + ")";
  }

  gpu::Device& device() override { return device_; }
  std::string_view name() const override { return name_; }

 protected:
  // The ops of ops.h, their arguments already checked by the public methods (ops.cc).
  Limits limits() const override { return Limits{}; }

  Status embedding_forward_impl(Tensor out, const std::int32_t* tokens, ConstTensor wte,
                                ConstTensor wpe, std::int64_t batch, std::int64_t seq,
                                std::int64_t embd, std::int64_t vocab, std::int64_t first_row,
                                std::int64_t table_rows, gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t rows = sz(batch * seq);
      const size_t c = sz(embd);
      parallel(rows, 1, [&](size_t r) {
        const std::int32_t tok = tokens[r];
        TZ_ASSERT(tok >= 0 && tok < vocab, "embedding_forward: token out of [0, vocab)");
        if (tok < first_row || tok >= first_row + table_rows) return;  // another slice's
        const float* w = load(wte, sz(tok - first_row) * c, c, tls_scratch(0, c));
        if (wpe.data == nullptr) {  // no learned positions
          store(out, r * c, w, c, false, nullptr);
          return;
        }
        const float* p = load(wpe, (r % sz(seq)) * c, c, tls_scratch(1, c));
        float* o = out.dtype == DType::kF32 ? static_cast<float*>(out.data) + r * c
                                            : tls_scratch(2, c);
        ck::add(w, p, o, c);
        store(out, r * c, o, c, false, nullptr);
      });
    });
  }

  Status embedding_backward_impl(Tensor dwte, Tensor dwpe, ConstTensor dout,
                                 const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                                 std::int64_t embd, std::int64_t vocab, std::int64_t first_row,
                                 std::int64_t table_rows, gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t rows = sz(batch * seq);
      const size_t c = sz(embd);
      if (dwte.data != nullptr) {
        // Rows grouped by token (stable, so each token's rows add in row order): one fp32 sum per
        // distinct token, rounded into the table once, with no two tasks touching one row.
        std::vector<std::uint32_t> order(rows);
        std::iota(order.begin(), order.end(), 0u);
        std::stable_sort(order.begin(), order.end(),
                         [&](std::uint32_t a, std::uint32_t b) { return tokens[a] < tokens[b]; });
        std::vector<size_t> starts;
        for (size_t i = 0; i < rows; ++i) {
          if (i == 0 || tokens[order[i]] != tokens[order[i - 1]]) starts.push_back(i);
        }
        starts.push_back(rows);
        parallel(starts.size() - 1, 1, [&](size_t g) {
          const std::int32_t tok = tokens[order[starts[g]]];
          TZ_ASSERT(tok >= 0 && tok < vocab, "embedding_backward: token out of [0, vocab)");
          if (tok < first_row || tok >= first_row + table_rows) return;  // another slice's
          float* acc = tls_scratch(0, c);
          std::fill(acc, acc + c, 0.0f);
          for (size_t i = starts[g]; i < starts[g + 1]; ++i) {
            ck::axpy(1.0f, load(dout, order[i] * c, c, tls_scratch(1, c)), acc, c);
          }
          store(dwte, sz(tok - first_row) * c, acc, c, true, tls_scratch(2, c));
        });
      }
      if (dwpe.data != nullptr) {
        parallel(sz(seq), 1, [&](size_t t) {
          float* acc = tls_scratch(0, c);
          std::fill(acc, acc + c, 0.0f);
          for (size_t b = 0; b < sz(batch); ++b) {
            ck::axpy(1.0f, load(dout, (b * sz(seq) + t) * c, c, tls_scratch(1, c)), acc, c);
          }
          store(dwpe, t * c, acc, c, true, tls_scratch(2, c));
        });
      }
    });
  }

  Status copy_block_impl(Tensor dst, std::int64_t dst_stride, ConstTensor src,
                         std::int64_t src_stride, std::int64_t rows, std::int64_t cols,
                         gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t es = dtype_size(dst.dtype);
      const size_t bytes = sz(cols) * es;
      parallel(sz(rows), 16, [&](size_t r) {
        std::memcpy(static_cast<std::byte*>(dst.data) + r * sz(dst_stride) * es,
                    static_cast<const std::byte*>(src.data) + r * sz(src_stride) * es, bytes);
      });
    });
  }

  Status layernorm_forward_impl(Tensor out, float* mean, float* rstd, ConstTensor x,
                                ConstTensor weight, ConstTensor bias, std::int64_t rows,
                                std::int64_t dim, gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t c = sz(dim);
      const float* w = whole(kSlotW, weight, c);
      const float* b = whole(kSlotB, bias, c);
      parallel(sz(rows), 4, [&](size_t r) {
        const float* xr = load(x, r * c, c, tls_scratch(0, c));
        float* o = out.dtype == DType::kF32 ? static_cast<float*>(out.data) + r * c
                                            : tls_scratch(1, c);
        ck::layernorm_row(xr, w, b, o, c, mean + r, rstd + r);
        store(out, r * c, o, c, false, nullptr);
      });
    });
  }

  Status layernorm_backward_impl(Tensor dx, Accumulate dx_mode, Tensor dweight, Tensor dbias,
                                 ConstTensor dout, ConstTensor x, ConstTensor weight,
                                 const float* mean, const float* rstd, std::int64_t rows,
                                 std::int64_t dim, gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t c = sz(dim);
      const size_t n = sz(rows);
      const float* w = whole(kSlotW, weight, c);
      // Fixed chunks of rows, each with its own partial dweight/dbias, summed in chunk order: the
      // bits do not depend on the thread count.
      const size_t chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
      float* part_w = scratch(kSlotX, chunks * c);
      float* part_b = scratch(kSlotY, chunks * c);
      std::fill(part_w, part_w + chunks * c, 0.0f);
      std::fill(part_b, part_b + chunks * c, 0.0f);
      const bool add = dx_mode == Accumulate::kAdd;
      parallel(chunks, 1, [&](size_t k) {
        for (size_t r = k * kRowsPerChunk; r < std::min(n, (k + 1) * kRowsPerChunk); ++r) {
          const float* xr = load(x, r * c, c, tls_scratch(0, c));
          const float* gr = load(dout, r * c, c, tls_scratch(1, c));
          const bool direct = dx.dtype == DType::kF32;
          float* d = direct ? static_cast<float*>(dx.data) + r * c : tls_scratch(2, c);
          ck::layernorm_row_backward(xr, w, gr, mean[r], rstd[r], d, direct && add,
                                     part_w + k * c, part_b + k * c, c);
          if (!direct) store(dx, r * c, d, c, add, tls_scratch(3, c));
        }
      });
      reduce_partials(dweight, part_w, chunks, c);
      reduce_partials(dbias, part_b, chunks, c);
    });
  }

  Status matmul_forward_impl(Tensor out, ConstTensor x, ConstTensor weight, WeightLayout layout,
                             ConstTensor bias, std::int64_t rows, std::int64_t in_dim,
                             std::int64_t out_dim, gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t m = sz(rows);
      const size_t k = sz(in_dim);
      const size_t n = sz(out_dim);
      float* y = out.dtype == DType::kF32 ? static_cast<float*>(out.data) : scratch(kSlotY, m * n);
      float beta = 0.0f;
      if (bias.data != nullptr) {
        const float* b = whole(kSlotB, bias, n);
        parallel(m, 16, [&](size_t r) { std::memcpy(y + r * n, b, n * sizeof(float)); });
        beta = 1.0f;
      }
      const bool in_out = layout == WeightLayout::kInOut;
      if (native_bf16(x, weight)) {
        gemm_bf16(false, !in_out, m, n, k, x, k, weight, in_out ? n : k, beta, y, n);
      } else {
        sgemm(false, !in_out, m, n, k, whole(kSlotX, x, m * k), k, whole(kSlotW, weight, k * n),
              in_out ? n : k, beta, y, n);
      }
      if (out.dtype != DType::kF32) store_whole(out, y, m * n, false);
    });
  }

  Status matmul_backward_impl(Tensor dx, Accumulate dx_mode, Tensor dweight, Tensor dbias,
                              ConstTensor dout, ConstTensor x, ConstTensor weight,
                              WeightLayout layout, std::int64_t rows, std::int64_t in_dim,
                              std::int64_t out_dim, gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t m = sz(rows);
      const size_t k = sz(in_dim);
      const size_t n = sz(out_dim);
      const bool in_out = layout == WeightLayout::kInOut;
      const bool native_dx = dx.data != nullptr && native_bf16(dout, weight);
      const bool native_dw = dweight.data != nullptr && native_bf16(x, dout);
      // dout in fp32, for every use that does not take the bf16 tensor itself.
      const bool widen_g = dbias.data != nullptr || (dx.data != nullptr && !native_dx) ||
                           (dweight.data != nullptr && !native_dw);
      const float* g = widen_g ? whole(kSlotY, dout, m * n) : nullptr;
      if (dx.data != nullptr) {
        const bool direct = dx.dtype == DType::kF32;
        const bool add = dx_mode == Accumulate::kAdd;
        float* d = direct ? static_cast<float*>(dx.data) : scratch(kSlotX, m * k);
        const float beta = direct && add ? 1.0f : 0.0f;
        // kInOut: dx = dout W^T with W (k, n); kOutIn: dx = dout W with W (n, k).
        if (native_dx) {
          gemm_bf16(false, in_out, m, k, n, dout, n, weight, in_out ? n : k, beta, d, k);
        } else {
          sgemm(false, in_out, m, k, n, g, n, whole(kSlotW, weight, k * n), in_out ? n : k, beta,
                d, k);
        }
        if (!direct) store_whole(dx, d, m * k, add);
      }
      if (dweight.data != nullptr) {
        const bool direct = dweight.dtype == DType::kF32;
        float* dw = direct ? static_cast<float*>(dweight.data) : scratch(kSlotW, k * n);
        const float beta = direct ? 1.0f : 0.0f;
        if (native_dw && in_out) {
          gemm_bf16(true, false, k, n, m, x, k, dout, n, beta, dw, n);  // (k, n) += x^T dout
        } else if (native_dw) {
          gemm_bf16(true, false, n, k, m, dout, n, x, k, beta, dw, k);  // (n, k) += dout^T x
        } else if (in_out) {
          sgemm(true, false, k, n, m, whole(kSlotX, x, m * k), k, g, n, beta, dw, n);
        } else {
          sgemm(true, false, n, k, m, g, n, whole(kSlotX, x, m * k), k, beta, dw, k);
        }
        if (!direct) store_whole(dweight, dw, k * n, true);
      }
      if (dbias.data != nullptr) {
        // Column sums in row order over column slices: deterministic, no shared writes.
        constexpr size_t kCols = 256;
        parallel((n + kCols - 1) / kCols, 1, [&](size_t s) {
          const size_t c0 = s * kCols;
          const size_t cn = std::min(kCols, n - c0);
          float* acc = tls_scratch(0, cn);
          std::fill(acc, acc + cn, 0.0f);
          for (size_t r = 0; r < m; ++r) ck::axpy(1.0f, g + r * n + c0, acc, cn);
          store(dbias, c0, acc, cn, true, tls_scratch(1, cn));
        });
      }
    });
  }

  Status gelu_forward_impl(Tensor out, ConstTensor x, std::int64_t n,
                           gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      chunks(sz(n), [&](size_t off, size_t len) {
        const float* xi = load(x, off, len, tls_scratch(0, len));
        float* o =
            out.dtype == DType::kF32 ? static_cast<float*>(out.data) + off : tls_scratch(1, len);
        ck::gelu_forward(xi, o, len);
        store(out, off, o, len, false, nullptr);
      });
    });
  }

  Status gelu_backward_impl(Tensor dx, Accumulate dx_mode, ConstTensor dout, ConstTensor x,
                            std::int64_t n, gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const bool add = dx_mode == Accumulate::kAdd;
      chunks(sz(n), [&](size_t off, size_t len) {
        const float* xi = load(x, off, len, tls_scratch(0, len));
        const float* gi = load(dout, off, len, tls_scratch(1, len));
        const bool direct = dx.dtype == DType::kF32;
        float* d = direct ? static_cast<float*>(dx.data) + off : tls_scratch(2, len);
        ck::gelu_backward(xi, gi, d, len, direct && add);
        if (!direct) store(dx, off, d, len, add, tls_scratch(3, len));
      });
    });
  }

  Status residual_forward_impl(Tensor out, ConstTensor a, ConstTensor b, std::int64_t n,
                               gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      chunks(sz(n), [&](size_t off, size_t len) {
        const float* ai = load(a, off, len, tls_scratch(0, len));
        const float* bi = load(b, off, len, tls_scratch(1, len));
        float* o = out.dtype == DType::kF32 ? static_cast<float*>(out.data) + off
                                            : tls_scratch(2, len);
        ck::add(ai, bi, o, len);
        store(out, off, o, len, false, nullptr);
      });
    });
  }

  Status residual_backward_impl(Tensor da, Accumulate da_mode, Tensor db, Accumulate db_mode,
                                ConstTensor dout, std::int64_t n, gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      chunks(sz(n), [&](size_t off, size_t len) {
        const float* g = load(dout, off, len, tls_scratch(0, len));
        if (da.data != nullptr)
          store(da, off, g, len, da_mode == Accumulate::kAdd, tls_scratch(1, len));
        if (db.data != nullptr)
          store(db, off, g, len, db_mode == Accumulate::kAdd, tls_scratch(1, len));
      });
    });
  }

  Status scale_impl(Tensor out, Accumulate mode, ConstTensor x, const std::uint8_t* keep,
                    float alpha, std::int64_t n, gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      chunks(sz(n), [&](size_t off, size_t len) {
        float* o = tls_scratch(2, len);
        load_into(x, off, len, o);
        for (size_t i = 0; i < len; ++i) {
          o[i] *= keep != nullptr && keep[off + i] == 0 ? 0.0f : alpha;
        }
        store(out, off, o, len, mode == Accumulate::kAdd, tls_scratch(3, len));
      });
    });
  }

  Status cross_entropy_forward_impl(float* losses, ConstTensor logits, const std::int32_t* targets,
                                    std::int64_t rows, std::int64_t vocab,
                                    gpu::Stream& stream) override {
    return cross_entropy(Tensor{}, losses, logits, targets, rows, vocab, 0.0f, stream);
  }

  Status cross_entropy_backward_impl(Tensor dlogits, float* losses, ConstTensor logits,
                                     const std::int32_t* targets, std::int64_t rows,
                                     std::int64_t vocab, float grad_scale,
                                     gpu::Stream& stream) override {
    return cross_entropy(dlogits, losses, logits, targets, rows, vocab, grad_scale, stream);
  }

  Result<double> gemm_seconds_impl(std::int64_t m, std::int64_t n, std::int64_t k, DType /*dtype*/,
                                   int repeats, gpu::Stream& stream) override {
    TZ_RETURN_IF_ERROR(stream.synchronize());
    std::vector<float> a(sz(m * k), 0.5f);
    std::vector<float> b(sz(k * n), 0.25f);
    std::vector<float> c(sz(m * n), 0.0f);
    std::vector<double> times;
    std::lock_guard<std::mutex> lock(run_mu_);  // no op of this backend runs meanwhile
    for (int rep = -1; rep < repeats; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      sgemm(false, false, sz(m), sz(n), sz(k), a.data(), sz(k), b.data(), sz(n), 0.0f, c.data(),
            sz(n));
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      if (rep >= 0) times.push_back(dt.count());
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  Status rmsnorm_forward_impl(Tensor out, float* rstd, ConstTensor x, ConstTensor weight,
                              float eps, std::int64_t rows, std::int64_t dim,
                              gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t c = sz(dim);
      const float* w = whole(kSlotW, weight, c);
      parallel(sz(rows), 4, [&](size_t r) {
        const float* xr = load(x, r * c, c, tls_scratch(0, c));
        float* o = out.dtype == DType::kF32 ? static_cast<float*>(out.data) + r * c
                                            : tls_scratch(1, c);
        rstd[r] = ck::rmsnorm_row(xr, w, o, c, eps);
        store(out, r * c, o, c, false, nullptr);
      });
    });
  }

  Status rmsnorm_backward_impl(Tensor dx, Accumulate dx_mode, Tensor dweight, ConstTensor dout,
                               ConstTensor x, ConstTensor weight, const float* rstd,
                               std::int64_t rows, std::int64_t dim,
                               gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t c = sz(dim);
      const size_t n = sz(rows);
      const float* w = whole(kSlotW, weight, c);
      // Fixed chunks of rows with their own partial dweight, summed in chunk order (as
      // layernorm_backward): the bits do not depend on the thread count.
      const size_t chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
      const bool want_dw = dweight.data != nullptr;
      float* part_w = want_dw ? scratch(kSlotX, chunks * c) : nullptr;
      if (want_dw) std::fill(part_w, part_w + chunks * c, 0.0f);
      const bool add = dx_mode == Accumulate::kAdd;
      parallel(chunks, 1, [&](size_t k) {
        for (size_t r = k * kRowsPerChunk; r < std::min(n, (k + 1) * kRowsPerChunk); ++r) {
          const float* xr = load(x, r * c, c, tls_scratch(0, c));
          const float* gr = load(dout, r * c, c, tls_scratch(1, c));
          const bool direct = dx.dtype == DType::kF32;
          float* d = direct ? static_cast<float*>(dx.data) + r * c : tls_scratch(2, c);
          ck::rmsnorm_row_backward(xr, w, gr, rstd[r], d, direct && add,
                                   want_dw ? part_w + k * c : nullptr, c);
          if (!direct) store(dx, r * c, d, c, add, tls_scratch(3, c));
        }
      });
      reduce_partials(dweight, part_w, chunks, c);
    });
  }

  Status rope_impl(Tensor x, const float* inv_freq, std::int64_t batch, std::int64_t seq,
                   std::int64_t heads, std::int64_t head_dim, std::int64_t row_stride,
                   std::int64_t pos_offset, bool inverse, gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t hd = sz(head_dim);
      const size_t half = hd / 2;
      parallel(sz(batch * seq), 4, [&](size_t r) {
        // The row's angles once, shared by its heads.
        const long long pos = pos_offset + static_cast<long long>(r % sz(seq));
        float* cs = tls_scratch(0, hd);
        for (size_t i = 0; i < half; ++i) {
          const float a = math::rope_angle(pos, inv_freq[i]);
          cs[i] = std::cos(a);
          cs[half + i] = std::sin(a);
        }
        for (size_t h = 0; h < sz(heads); ++h) {
          const size_t off = r * sz(row_stride) + h * hd;
          float* xh = x.dtype == DType::kF32 ? static_cast<float*>(x.data) + off
                                             : tls_scratch(1, hd);
          if (x.dtype != DType::kF32) load_into(x, off, hd, xh);
          ck::rope_rotate(xh, cs, cs + half, half, inverse);
          store(x, off, xh, hd, false, nullptr);
        }
      });
    });
  }

  Status swiglu_forward_impl(Tensor out, ConstTensor gate, ConstTensor up, std::int64_t rows,
                             std::int64_t dim, std::int64_t in_stride,
                             gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t c = sz(dim);
      const size_t stride = sz(in_stride);
      parallel(sz(rows), 4, [&](size_t r) {
        const float* g = load(gate, r * stride, c, tls_scratch(0, c));
        const float* u = load(up, r * stride, c, tls_scratch(1, c));
        float* o = out.dtype == DType::kF32 ? static_cast<float*>(out.data) + r * c
                                            : tls_scratch(2, c);
        ck::swiglu_forward(g, u, o, c);
        store(out, r * c, o, c, false, nullptr);
      });
    });
  }

  Status swiglu_backward_impl(Tensor dgate, Tensor dup, ConstTensor dout, ConstTensor gate,
                              ConstTensor up, std::int64_t rows, std::int64_t dim,
                              std::int64_t in_stride, gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t c = sz(dim);
      const size_t stride = sz(in_stride);
      parallel(sz(rows), 4, [&](size_t r) {
        const float* g = load(gate, r * stride, c, tls_scratch(0, c));
        const float* u = load(up, r * stride, c, tls_scratch(1, c));
        const float* go = load(dout, r * c, c, tls_scratch(2, c));
        const bool direct = dgate.dtype == DType::kF32;
        float* dg = direct ? static_cast<float*>(dgate.data) + r * stride : tls_scratch(3, c);
        float* du = direct ? static_cast<float*>(dup.data) + r * stride : tls_scratch(4, c);
        ck::swiglu_backward(g, u, go, dg, du, c);
        if (!direct) {
          store(dgate, r * stride, dg, c, false, nullptr);
          store(dup, r * stride, du, c, false, nullptr);
        }
      });
    });
  }

  Status gqa_attention_forward_impl(Tensor out, float* lse, ConstTensor q, ConstTensor k,
                                    ConstTensor v, std::int64_t batch, std::int64_t q_len,
                                    std::int64_t kv_len, std::int64_t q_heads,
                                    std::int64_t kv_heads, std::int64_t head_dim,
                                    std::int64_t q_stride, std::int64_t kv_stride, float scale,
                                    gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t tq = sz(q_len);
      const size_t tk = sz(kv_len);
      const size_t off = tk - tq;  // absolute position of query 0
      const size_t hd = sz(head_dim);
      const size_t group = sz(q_heads / kv_heads);
      const size_t c_out = sz(q_heads) * hd;
      const size_t q_blocks = (tq + kAttnBlock - 1) / kAttnBlock;
      parallel(sz(batch * q_heads) * q_blocks, 1, [&](size_t task) {
        const size_t qb = task % q_blocks;
        const size_t bh = task / q_blocks;
        const size_t b = bh / sz(q_heads);
        const size_t h = bh % sz(q_heads);
        const size_t kvh = h / group;
        const size_t q0 = qb * kAttnBlock;
        const size_t qn = std::min(kAttnBlock, tq - q0);
        auto q_row = [&](size_t t) { return (b * tq + t) * sz(q_stride) + h * hd; };
        auto kv_row = [&](size_t j) { return (b * tk + j) * sz(kv_stride) + kvh * hd; };
        float* qs = tls_scratch(0, kAttnBlock * hd);
        float* kt = tls_scratch(1, hd * kAttnBlock);
        float* vs = tls_scratch(2, kAttnBlock * hd);
        float* acc = tls_scratch(3, kAttnBlock * hd);
        float* s = tls_scratch(4, kAttnBlock * kAttnBlock);  // scores, then probabilities
        math::OnlineSoftmax norm[kAttnBlock];
        for (size_t i = 0; i < qn; ++i) {
          load_into(q, q_row(q0 + i), hd, qs + i * hd);
          ck::scale(scale, qs + i * hd, hd);
        }
        std::fill(acc, acc + qn * hd, 0.0f);
        const size_t keys = off + q0 + qn;  // the last query of the block sees keys < keys
        for (size_t k0 = 0; k0 < keys; k0 += kAttnBlock) {
          const size_t kn = std::min(kAttnBlock, keys - k0);
          load_kv_block(k, v, kv_row, k0, kn, hd, kt, vs);
          ck::matmul_acc(qs, hd, kt, kAttnBlock, s, kAttnBlock, qn, hd, kn, 0.0f);
          for (size_t i = 0; i < qn; ++i) {
            float* si = s + i * kAttnBlock;
            const size_t seen = off + q0 + i + 1;  // keys this query sees
            const size_t valid = std::min(kn, seen - std::min(seen, k0));
            std::fill(si + valid, si + kn, 0.0f);  // causal: probability 0 past the query
            if (valid == 0) continue;
            const float new_max = std::max(norm[i].max, ck::max(si, valid));
            const float corr = norm[i].rescale(new_max);
            const float block_sum = ck::exp_shifted(si, 1.0f, new_max, si, valid);
            norm[i].sum = norm[i].sum * corr + block_sum;
            norm[i].max = new_max;
            ck::scale(corr, acc + i * hd, hd);
          }
          ck::matmul_acc(s, kAttnBlock, vs, hd, acc, hd, qn, kn, hd, 1.0f);
        }
        for (size_t i = 0; i < qn; ++i) {
          float* a = acc + i * hd;
          ck::scale(1.0f / norm[i].sum, a, hd);
          store(out, (b * tq + q0 + i) * c_out + h * hd, a, hd, false, nullptr);
          lse[bh * tq + q0 + i] = norm[i].log_sum_exp();
        }
      });
    });
  }

  Status gqa_attention_backward_impl(Tensor dq, Tensor dk, Tensor dv, Accumulate d_mode,
                                     float* delta, ConstTensor dout, ConstTensor q,
                                     ConstTensor k, ConstTensor v, ConstTensor out,
                                     const float* lse, std::int64_t batch, std::int64_t seq,
                                     std::int64_t q_heads, std::int64_t kv_heads,
                                     std::int64_t head_dim, std::int64_t q_stride,
                                     std::int64_t kv_stride, float scale,
                                     gpu::Stream& stream) override {
    return enqueue(stream, [=, this] {
      const size_t t_len = sz(seq);
      const size_t hd = sz(head_dim);
      const size_t group = sz(q_heads / kv_heads);
      const size_t c_out = sz(q_heads) * hd;
      const bool add = d_mode == Accumulate::kAdd;
      // One task per (batch, kv head): it owns that head's dK and dV and the dQ of its query
      // heads, which it visits in head order, so no two tasks write one element and every sum
      // runs in a fixed order.
      parallel(sz(batch * kv_heads), 1, [&](size_t bkv) {
        const size_t b = bkv / sz(kv_heads);
        const size_t kvh = bkv % sz(kv_heads);
        auto kv_row = [&](size_t j) { return (b * t_len + j) * sz(kv_stride) + kvh * hd; };
        float* dkacc = tls_scratch(0, t_len * hd);
        float* dvacc = tls_scratch(1, t_len * hd);
        float* kt = tls_scratch(2, hd * kAttnBlock);  // one key block's k, transposed
        float* vt = tls_scratch(3, hd * kAttnBlock);  // and its v, transposed
        float* blk = tls_scratch(4, 5 * kAttnBlock * hd + hd);
        float* qs = blk;                           // the query block's q rows
        float* g = qs + kAttnBlock * hd;           // its dout rows
        float* dqacc = g + kAttnBlock * hd;        // its dq accumulators
        float* krows = dqacc + kAttnBlock * hd;    // the key block's k rows
        float* vrows = krows + kAttnBlock * hd;    // and v rows
        float* tmp = vrows + kAttnBlock * hd;      // one row of hd
        float* tiles = tls_scratch(5, 4 * kAttnBlock * kAttnBlock);
        float* p = tiles;                          // probabilities of the block pair
        float* ds = p + kAttnBlock * kAttnBlock;   // their score gradients
        float* pt = ds + kAttnBlock * kAttnBlock;  // P transposed
        float* dst = pt + kAttnBlock * kAttnBlock; // dS transposed
        std::fill(dkacc, dkacc + t_len * hd, 0.0f);
        std::fill(dvacc, dvacc + t_len * hd, 0.0f);
        for (size_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          const size_t bh = b * sz(q_heads) + h;
          auto q_row = [&](size_t t) { return (b * t_len + t) * sz(q_stride) + h * hd; };
          auto out_row = [&](size_t t) { return (b * t_len + t) * c_out + h * hd; };
          for (size_t q0 = 0; q0 < t_len; q0 += kAttnBlock) {
            const size_t qn = std::min(kAttnBlock, t_len - q0);
            for (size_t i = 0; i < qn; ++i) {
              load_into(q, q_row(q0 + i), hd, qs + i * hd);
              load_into(dout, out_row(q0 + i), hd, g + i * hd);
              const float* o = load(out, out_row(q0 + i), hd, tmp);
              delta[bh * t_len + q0 + i] = ck::dot(g + i * hd, o, hd);
            }
            std::fill(dqacc, dqacc + qn * hd, 0.0f);
            for (size_t k0 = 0; k0 < q0 + qn; k0 += kAttnBlock) {
              const size_t kn = std::min(kAttnBlock, q0 + qn - k0);
              for (size_t j = 0; j < kn; ++j) {
                load_into(k, kv_row(k0 + j), hd, krows + j * hd);
                load_into(v, kv_row(k0 + j), hd, vrows + j * hd);
                for (size_t d = 0; d < hd; ++d) {
                  kt[d * kAttnBlock + j] = krows[j * hd + d];
                  vt[d * kAttnBlock + j] = vrows[j * hd + d];
                }
              }
              constexpr size_t B = kAttnBlock;
              ck::matmul_acc(qs, hd, kt, B, p, B, qn, hd, kn, 0.0f);  // S = Q K^T
              ck::matmul_acc(g, hd, vt, B, ds, B, qn, hd, kn, 0.0f);  // dP = dO V^T
              for (size_t i = 0; i < qn; ++i) {
                const size_t t = q0 + i;
                const size_t valid = std::min(kn, t + 1 - std::min(t + 1, k0));
                float* pi = p + i * B;
                float* dsi = ds + i * B;
                if (valid > 0) ck::exp_shifted(pi, scale, lse[bh * t_len + t], pi, valid);
                std::fill(pi + valid, pi + kn, 0.0f);  // causal: no probability past the query
                const float di = delta[bh * t_len + t];
                for (size_t j = 0; j < kn; ++j) {
                  dsi[j] = pi[j] * (dsi[j] - di) * scale;  // through the scale too
                  pt[j * B + i] = pi[j];
                  dst[j * B + i] = dsi[j];
                }
              }
              ck::matmul_acc(pt, B, g, hd, dvacc + k0 * hd, hd, kn, qn, hd, 1.0f);   // dV += P^T dO
              ck::matmul_acc(ds, B, krows, hd, dqacc, hd, qn, kn, hd, 1.0f);         // dQ += dS K
              ck::matmul_acc(dst, B, qs, hd, dkacc + k0 * hd, hd, kn, qn, hd, 1.0f);  // dK += dS^T Q
            }
            for (size_t i = 0; i < qn; ++i) store(dq, q_row(q0 + i), dqacc + i * hd, hd, add, tmp);
          }
        }
        for (size_t t = 0; t < t_len; ++t) {
          store(dk, kv_row(t), dkacc + t * hd, hd, add, tmp);
          store(dv, kv_row(t), dvacc + t * hd, hd, add, tmp);
        }
      });
    });
  }

 private:
  // Backend-owned whole-tensor fp32 buffers, used under run_mu_ only.
  enum Slot { kSlotX, kSlotW, kSlotB, kSlotY, kSlotCount };

  // Enqueues `fn` on `stream`: it runs on the stream's worker, under the run lock.
  Status enqueue(gpu::Stream& stream, std::function<void()> fn) {
    return device_.host_callback(stream, [this, fn = std::move(fn)] {
      std::lock_guard<std::mutex> lock(run_mu_);
      fn();
    });
  }

  // fn(i) for i < n, in parallel in pieces of `grain`. The loops run on the same OpenMP team as
  // oneDNN's matmuls (the stream worker's, threads_ wide): one pool of threads for every op, so no
  // second pool's threads spin on the cores while the other pool works (with a oneTBB arena beside
  // OpenMP, libgomp's spinning workers slowed the element-wise ops and attention; issue 29). Every
  // fn(i) writes only its own outputs, so the bits do not depend on which thread runs it.
  template <typename Fn>
  void parallel(size_t n, size_t grain, const Fn& fn) const {
    const size_t tasks = (n + grain - 1) / grain;
    if (tasks <= 1 || threads_ <= 1) {
      for (size_t i = 0; i < n; ++i) fn(i);
      return;
    }
    const std::int64_t count = static_cast<std::int64_t>(tasks);
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 1)
    for (std::int64_t t = 0; t < count; ++t) {
      const size_t first = static_cast<size_t>(t) * grain;
      const size_t last = std::min(n, first + grain);
      for (size_t i = first; i < last; ++i) fn(i);
    }
  }
  // fn(offset, length) over [0, n) in pieces of kElemsPerTask.
  template <typename Fn>
  void chunks(size_t n, const Fn& fn) const {
    parallel((n + kElemsPerTask - 1) / kElemsPerTask, 1, [&](size_t k) {
      const size_t off = k * kElemsPerTask;
      fn(off, std::min(kElemsPerTask, n - off));
    });
  }

  float* scratch(Slot slot, size_t n) {
    std::vector<float>& b = scratch_[slot];
    if (b.size() < n) b.resize(n);
    return b.data();
  }
  // The whole tensor (n elements) as fp32: itself, or converted into slot `slot` in parallel.
  const float* whole(Slot slot, ConstTensor t, size_t n) {
    if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
    float* dst = scratch(slot, n);
    chunks(n, [&](size_t off, size_t len) {
      cpu::convert_16_to_f32(static_cast<const std::uint16_t*>(t.data) + off, t.dtype, dst + off,
                             len);
    });
    return dst;
  }
  void store_whole(Tensor t, const float* src, size_t n, bool add) {
    chunks(n, [&](size_t off, size_t len) {
      store(t, off, src + off, len, add, tls_scratch(5, len));
    });
  }
  // dst += the sum over `chunks` partial rows of `part` (chunks x n), in chunk order.
  void reduce_partials(Tensor dst, const float* part, size_t count, size_t n) {
    if (dst.data == nullptr) return;
    chunks(n, [&](size_t off, size_t len) {
      float* acc = tls_scratch(4, len);
      std::fill(acc, acc + len, 0.0f);
      for (size_t k = 0; k < count; ++k) ck::axpy(1.0f, part + k * n + off, acc, len);
      store(dst, off, acc, len, true, tls_scratch(5, len));
    });
  }

  // C (m, n) = op(A) op(B) + beta C, row-major, fp32, on this backend's threads. No process-wide
  // lock: each backend (each rank as a thread) runs its matmuls at the same time as the others.
  void sgemm(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, const float* a, size_t lda,
             const float* b, size_t ldb, float beta, float* c, size_t ldc) const {
    cpu_sgemm(threads_, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
  }
  // Whether a product of a and b runs on the native bf16 kernels: both bf16, and this backend
  // uses them (OpsOptions::native_bf16_gemm on a CPU that has them).
  bool native_bf16(ConstTensor a, ConstTensor b) const {
    return bf16_gemm_ && a.dtype == DType::kBF16 && b.dtype == DType::kBF16;
  }
  // The same product as sgemm on two bf16 tensors, without widening them.
  void gemm_bf16(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, ConstTensor a,
                 size_t lda, ConstTensor b, size_t ldb, float beta, float* c, size_t ldc) const {
    cpu_gemm_bf16(threads_, trans_a, trans_b, m, n, k, static_cast<const std::uint16_t*>(a.data),
                  lda, static_cast<const std::uint16_t*>(b.data), ldb, beta, c, ldc);
  }

  // Keys kn rows from k0 (row(j): element offset of key j's head), k transposed into kt
  // (hd x kAttnBlock) and v into vs (kn x hd).
  template <typename RowFn>
  static void load_kv_block(ConstTensor k, ConstTensor v, const RowFn& row, size_t k0, size_t kn,
                            size_t hd, float* kt, float* vs) {
    float* tmp = tls_scratch(5, hd);
    for (size_t j = 0; j < kn; ++j) {
      const float* kr = load(k, row(k0 + j), hd, tmp);
      for (size_t d = 0; d < hd; ++d) kt[d * kAttnBlock + j] = kr[d];
      load_into(v, row(k0 + j), hd, vs + j * hd);
    }
  }
  // Losses (when `losses` is not null) and, when dlogits is present, the gradient.
  Status cross_entropy(Tensor dlogits, float* losses, ConstTensor logits,
                       const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                       float grad_scale, gpu::Stream& stream) {
    const bool grad = dlogits.data != nullptr;
    return enqueue(stream, [=, this] {
      const size_t v = sz(vocab);
      parallel(sz(rows), 1, [&](size_t r) {
        const std::int32_t tgt = targets[r];
        TZ_ASSERT(tgt >= 0 && tgt < vocab, "cross_entropy: target out of [0, vocab)");
        const float* x = load(logits, r * v, v, tls_scratch(0, v));
        float* gr = nullptr;
        if (grad) {
          gr = dlogits.dtype == DType::kF32 ? static_cast<float*>(dlogits.data) + r * v
                                            : tls_scratch(1, v);
        }
        const float loss = ck::cross_entropy_row(x, gr, v, sz(tgt), grad_scale);
        if (losses != nullptr) losses[r] = loss;
        if (grad) store(dlogits, r * v, gr, v, false, nullptr);
      });
    });
  }

  gpu::Device& device_;
  int threads_;
  bool bf16_gemm_;  // bf16 x bf16 matmuls on oneDNN's native bf16 kernels
  std::string name_;
  std::mutex run_mu_;  // held while an op runs: ops of this backend run one at a time
  std::vector<float> scratch_[kSlotCount];  // guarded by run_mu_
};

}  // namespace

Result<std::unique_ptr<Ops>> create_cpu_ops(gpu::Device& device, const OpsOptions& options) {
  const int threads = options.cpu_threads > 0 ? options.cpu_threads : omp_get_num_procs();
  return std::unique_ptr<Ops>(new CpuOps(device, threads, options.native_bf16_gemm));
}

}  // namespace tz::ops::internal
