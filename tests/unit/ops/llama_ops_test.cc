// The Llama-family ops of ops/ops.h (RMSNorm, rotary embedding, SwiGLU, grouped-query causal
// attention, the embedding without learned positions) on the CPU backend, against float64
// references written here: every forward against its reference, every backward against central
// finite differences of the reference, fp32 and 16-bit storage, strided layouts (q and k inside a
// fused qkv row, gate and up inside a fused [gate | up] row), GQA with kv_heads < q_heads, the
// KV-cache offsets (q_len < kv_len, rope's pos_offset, one decode step equal to the full forward's
// row), and the argument errors. Seeds are printed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/host_device.h"
#include "ops/ops.h"
#include "ops/ops_math.h"
#include "ops_cpu_fixture.h"
#include "ops_harness.h"

namespace tz::ops {
namespace {

using testing::DeviceArrays;
using testing::expect_close;
using testing::finite_differences;
using testing::plus;
using testing::random_vector;
using testing::tolerance_for;
using testing::weighted_sum;
using Vec = std::vector<double>;
using std::size_t;

// ---- float64 references ------------------------------------------------------------------------

Vec rmsnorm_ref(const Vec& x, const Vec& w, double eps, int rows, int dim, Vec* rstd) {
  Vec out(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int k = 0; k < dim; ++k) ss += x[r * dim + k] * x[r * dim + k];
    const double rs = 1.0 / std::sqrt(ss / dim + eps);
    for (int k = 0; k < dim; ++k) out[r * dim + k] = x[r * dim + k] * rs * w[k];
    if (rstd != nullptr) (*rstd)[r] = rs;
  }
  return out;
}

// HF's default inverse frequencies, 1 / theta^(2i / D), rounded to fp32 (the op's input).
Vec inv_freq_for(int head_dim, double theta) {
  Vec f(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    f[i] = static_cast<float>(1.0 / std::pow(theta, 2.0 * i / head_dim));
  }
  return f;
}

// Rotary embedding of x (rows of `stride`, heads at element `offset` of each row) at positions
// pos_offset + (row % seq); elements outside the heads are copied. sign -1: the inverse rotation.
struct RopeShape {
  int batch, seq, heads, head_dim, stride, offset, pos_offset;
};
Vec rope_ref(const Vec& x, const Vec& inv_freq, const RopeShape& s, double sign = 1) {
  Vec y = x;
  const int half = s.head_dim / 2;
  for (int r = 0; r < s.batch * s.seq; ++r) {
    const double pos = s.pos_offset + r % s.seq;
    for (int h = 0; h < s.heads; ++h) {
      const size_t base = static_cast<size_t>(r) * s.stride + s.offset + h * s.head_dim;
      for (int i = 0; i < half; ++i) {
        const double a = pos * inv_freq[i];
        const double c = std::cos(a), sn = sign * std::sin(a);
        y[base + i] = x[base + i] * c - x[base + i + half] * sn;
        y[base + i + half] = x[base + i + half] * c + x[base + i] * sn;
      }
    }
  }
  return y;
}

double silu_ref(double g) { return g / (1 + std::exp(-g)); }

// silu(gate) * up over rows of `stride` with gate at `gate_off` and up at `up_off` of each row.
Vec swiglu_ref(const Vec& in, int rows, int dim, int stride, int gate_off, int up_off) {
  Vec out(static_cast<size_t>(rows) * dim);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < dim; ++k) {
      out[r * dim + k] = silu_ref(in[r * stride + gate_off + k]) * in[r * stride + up_off + k];
    }
  }
  return out;
}

// Grouped-query causal attention by the full score matrix. q rows (b, i) at q_off + (b * tq + i) *
// q_stride in qbuf; k and v rows (b, j) at k_off / v_off + (b * tk + j) * kv_stride in kvbuf.
struct GqaShape {
  int batch, tq, tk, qh, kvh, hd, q_stride, kv_stride, q_off, k_off, v_off;
  double scale;
};
Vec gqa_ref(const Vec& qbuf, const Vec& kvbuf, const GqaShape& s, Vec* lse) {
  const int group = s.qh / s.kvh;
  const int c = s.qh * s.hd;
  Vec out(static_cast<size_t>(s.batch) * s.tq * c, 0.0);
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.qh; ++h) {
      const int kvh = h / group;
      for (int i = 0; i < s.tq; ++i) {
        const int last = s.tk - s.tq + i;  // the query's absolute position
        const double* qi = &qbuf[s.q_off + static_cast<size_t>(b * s.tq + i) * s.q_stride + h * s.hd];
        Vec sc(last + 1);
        double mx = -1e300;
        for (int j = 0; j <= last; ++j) {
          const size_t kr = s.k_off + static_cast<size_t>(b * s.tk + j) * s.kv_stride + kvh * s.hd;
          double dot = 0;
          for (int d = 0; d < s.hd; ++d) dot += qi[d] * kvbuf[kr + d];
          sc[j] = dot * s.scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j <= last; ++j) sum += std::exp(sc[j] - mx);
        for (int j = 0; j <= last; ++j) {
          const double p = std::exp(sc[j] - mx) / sum;
          const size_t vr = s.v_off + static_cast<size_t>(b * s.tk + j) * s.kv_stride + kvh * s.hd;
          for (int d = 0; d < s.hd; ++d) out[(b * s.tq + i) * c + h * s.hd + d] += p * kvbuf[vr + d];
        }
        if (lse != nullptr) (*lse)[(b * s.qh + h) * s.tq + i] = mx + std::log(sum);
      }
    }
  }
  return out;
}

// ---- fixture -----------------------------------------------------------------------------------

class LlamaOpsCpuTest : public testing::OpsCpuFixture {
 protected:
  LlamaOpsCpuTest() : OpsCpuFixture(20261203) {}
  // The tensor's elements offset by `elems` (a view into a fused buffer).
  static Tensor at(Tensor t, size_t elems) {
    return Tensor{static_cast<char*>(t.data) + elems * dtype_size(t.dtype), t.dtype};
  }
};

// ---- embedding without learned positions ------------------------------------------------------

TEST_P(LlamaOpsCpuTest, EmbeddingWithoutPositions) {
  auto g = rng(1);
  const int b = 2, t = 5, c = 13, v = 11;
  std::vector<std::int32_t> tok(static_cast<size_t>(b) * t);
  for (auto& x : tok) x = static_cast<std::int32_t>(g() % 4);  // repeated tokens
  Vec wte = random_vector(g, static_cast<size_t>(v) * c, -1, 1);
  auto* dtok = arrays_->upload_i32(tok);
  Tensor twte = arrays_->upload(wte, param());
  Tensor out = arrays_->zeros(tok.size() * c, act());
  ASSERT_TRUE(ops_->embedding_forward(out, dtok, twte, Tensor{nullptr, param()}, b, t, c, v,
                                      stream()).is_ok());
  Vec ref(tok.size() * c);
  for (size_t r = 0; r < tok.size(); ++r) {
    for (int k = 0; k < c; ++k) ref[r * c + k] = wte[tok[r] * c + k];
  }
  expect_close(arrays_->download(out, ref.size()), ref, tolerance_for(act()), "embedding out");

  Vec w = random_vector(g, ref.size(), -1, 1);
  Tensor dout = arrays_->upload(w, act());
  Vec g0 = random_vector(g, wte.size(), -0.5, 0.5);
  Tensor dwte = arrays_->upload(g0, param());
  ASSERT_TRUE(ops_->embedding_backward(dwte, Tensor{nullptr, param()}, dout, dtok, b, t, c, v,
                                       stream()).is_ok());
  auto loss = [&] {
    double s = 0;
    for (size_t r = 0; r < tok.size(); ++r) {
      for (int k = 0; k < c; ++k) s += wte[tok[r] * c + k] * w[r * c + k];
    }
    return s;
  };
  expect_close(arrays_->download(dwte, wte.size()), plus(g0, finite_differences(wte, loss)),
               tolerance_for(param()), "embedding dwte");
}

// The table in slices (the Llama family's vocabulary chunks): each slice's forward fills the rows
// whose tokens it holds and leaves the others as they are; each slice's backward adds the rows of
// its tokens only, so the slices together give the whole table's gradient.
TEST_P(LlamaOpsCpuTest, EmbeddingTableSlices) {
  auto g = rng(11);
  const int b = 3, t = 4, c = 7, v = 10;
  const int firsts[] = {0, 4, 8}, sizes[] = {4, 4, 2};
  std::vector<std::int32_t> tok(static_cast<size_t>(b) * t);
  for (auto& x : tok) x = static_cast<std::int32_t>(g() % v);
  tok[0] = tok[5] = 9;  // a repeated token of the last slice
  Vec wte = random_vector(g, static_cast<size_t>(v) * c, -1, 1);
  Tensor whole = arrays_->upload(wte, param());  // rounds wte to the param dtype
  auto* dtok = arrays_->upload_i32(tok);
  Vec sentinel(tok.size() * c, 7.0);
  Tensor out = arrays_->upload(sentinel, act());
  for (int s = 0; s < 2; ++s) {  // the last slice left out: its rows keep the sentinel
    Vec part(wte.begin() + firsts[s] * c, wte.begin() + (firsts[s] + sizes[s]) * c);
    ASSERT_TRUE(ops_->embedding_forward(out, dtok, arrays_->upload(part, param()),
                                        Tensor{nullptr, param()}, b, t, c, v, stream(), firsts[s],
                                        sizes[s]).is_ok());
  }
  Vec ref(tok.size() * c);
  for (size_t r = 0; r < tok.size(); ++r) {
    for (int k = 0; k < c; ++k) ref[r * c + k] = tok[r] >= 8 ? 7.0 : wte[tok[r] * c + k];
  }
  expect_close(arrays_->download(out, ref.size()), ref, tolerance_for(act()), "sliced out");

  Vec w = random_vector(g, ref.size(), -1, 1);
  Tensor dout = arrays_->upload(w, act());
  Vec got;
  for (int s = 0; s < 3; ++s) {
    Tensor dpart = arrays_->zeros(static_cast<size_t>(sizes[s]) * c, param());
    ASSERT_TRUE(ops_->embedding_backward(dpart, Tensor{nullptr, param()}, dout, dtok, b, t, c, v,
                                         stream(), firsts[s], sizes[s]).is_ok());
    const Vec d = arrays_->download(dpart, static_cast<size_t>(sizes[s]) * c);
    got.insert(got.end(), d.begin(), d.end());
  }
  Vec want(wte.size(), 0.0);  // dwte[token] = sum of its rows of dout
  for (size_t r = 0; r < tok.size(); ++r) {
    for (int k = 0; k < c; ++k) want[tok[r] * c + k] += w[r * c + k];
  }
  expect_close(got, want, tolerance_for(param()), "sliced dwte");

  // A slice outside the table, a slice with dwpe: refused, naming the op.
  const Status past = ops_->embedding_forward(out, dtok, whole,
                                              Tensor{nullptr, param()}, b, t, c, v, stream(), 8,
                                              4);
  EXPECT_EQ(past.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(past.message().find("embedding_forward"), std::string::npos) << past.message();
  const Status wpe = ops_->embedding_backward(arrays_->zeros(wte.size(), param()),
                                              arrays_->zeros(static_cast<size_t>(t) * c, param()),
                                              dout, dtok, b, t, c, v, stream(), 0, 4);
  EXPECT_EQ(wpe.code(), ErrorCode::kInvalidArgument);
}

// copy_block: a block of rows x cols between row strides, in both directions of the LM head's
// chunk copies, elements outside the block untouched; strides below cols refused.
TEST_P(LlamaOpsCpuTest, CopyBlock) {
  auto g = rng(12);
  const int rows = 5, cols = 3, wide = 11, at = 4;
  Vec big = random_vector(g, static_cast<size_t>(rows) * wide, -1, 1);
  Vec small = random_vector(g, static_cast<size_t>(rows) * cols, -1, 1);
  Tensor tbig = arrays_->upload(big, act());
  Tensor tsmall = arrays_->upload(small, act());
  const size_t es = dtype_size(act());
  Tensor column{static_cast<std::byte*>(tbig.data) + at * es, act()};
  ASSERT_TRUE(ops_->copy_block(column, wide, tsmall, cols, rows, cols, stream()).is_ok());
  Vec want = big;
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < cols; ++k) want[r * wide + at + k] = small[r * cols + k];
  }
  expect_close(arrays_->download(tbig, big.size()), want, tolerance_for(act()), "into columns");
  Tensor back = arrays_->zeros(small.size(), act());
  ASSERT_TRUE(ops_->copy_block(back, cols, column, wide, rows, cols, stream()).is_ok());
  expect_close(arrays_->download(back, small.size()), small, tolerance_for(act()), "out of them");
  EXPECT_EQ(ops_->copy_block(back, 2, column, wide, rows, cols, stream()).code(),
            ErrorCode::kInvalidArgument);
}

// ---- RMSNorm -----------------------------------------------------------------------------------

TEST_P(LlamaOpsCpuTest, RmsNorm) {
  for (auto [rows, dim, eps] : {std::tuple{7, 37, 1e-6f}, std::tuple{1, 1, 1e-5f},
                                std::tuple{70, 96, 1e-6f}, std::tuple{33, 8, 0.0f}}) {
    auto g = rng(static_cast<std::uint64_t>(rows * 100 + dim));
    const size_t n = static_cast<size_t>(rows) * dim;
    Vec x = random_vector(g, n, -2, 2);
    Vec w = random_vector(g, dim, 0.5, 1.5);
    Tensor tx = arrays_->upload(x, act());
    Tensor tw = arrays_->upload(w, param());
    Tensor out = arrays_->zeros(n, act());
    float* rstd = arrays_->zeros_f32(rows);
    ASSERT_TRUE(ops_->rmsnorm_forward(out, rstd, tx, tw, eps, rows, dim, stream()).is_ok());
    Vec rrstd(rows);
    const Vec ref = rmsnorm_ref(x, w, eps, rows, dim, &rrstd);
    expect_close(arrays_->download(out, n), ref, tolerance_for(act()), "rmsnorm forward");
    expect_close(arrays_->download_f32(rstd, rows), rrstd, tolerance_for(DType::kF32), "rstd");

    // In place (out aliases x), on a copy.
    Vec x2 = x;
    Tensor tx2 = arrays_->upload(x2, act());
    float* rstd2 = arrays_->zeros_f32(rows);
    ASSERT_TRUE(ops_->rmsnorm_forward(tx2, rstd2, tx2, tw, eps, rows, dim, stream()).is_ok());
    expect_close(arrays_->download(tx2, n), ref, tolerance_for(act()), "rmsnorm in place");

    // A 1-wide row is w * x / sqrt(x^2 + eps): its x-derivative is O(eps), below fp32's
    // cancellation in the formula, so only wider rows check the backward.
    if (dim == 1) continue;
    Vec r = random_vector(g, n, -1, 1);
    Tensor dout = arrays_->upload(r, act());
    auto loss = [&] { return weighted_sum(rmsnorm_ref(x, w, eps, rows, dim, nullptr), r); };
    const Vec fd_x = finite_differences(x, loss);
    const Vec fd_w = finite_differences(w, loss);
    for (Accumulate mode : {Accumulate::kOverwrite, Accumulate::kAdd}) {
      Vec dx0 = mode == Accumulate::kAdd ? random_vector(g, n, -1, 1) : Vec(n, 0.0);
      Tensor dx = arrays_->upload(dx0, act());
      Vec g0w = random_vector(g, dim, -1, 1);
      Tensor dw = arrays_->upload(g0w, param());
      // The overwrite pass leaves dweight out (null: not wanted).
      const Tensor dw_arg = mode == Accumulate::kAdd ? dw : Tensor{nullptr, param()};
      ASSERT_TRUE(ops_->rmsnorm_backward(dx, mode, dw_arg, dout, tx, tw, rstd, rows, dim,
                                         stream()).is_ok());
      expect_close(arrays_->download(dx, n), plus(dx0, fd_x), tolerance_for(act()),
                   "rmsnorm dx");
      expect_close(arrays_->download(dw, dim),
                   mode == Accumulate::kAdd ? plus(g0w, fd_w) : g0w, tolerance_for(param()),
                   "rmsnorm dweight");
    }
  }
}

// ---- rotary embedding --------------------------------------------------------------------------

TEST_P(LlamaOpsCpuTest, RopeOnQAndKInsideFusedQkv) {
  // q (3 heads) and k (1 head) inside a fused [q | k | v] row, with positions from an offset.
  const int b = 2, t = 9, qh = 3, kvh = 1, hd = 8, pos0 = 37;
  const int stride = (qh + 2 * kvh) * hd;
  auto g = rng(20);
  const Vec inv = inv_freq_for(hd, 10000.0);
  Vec inv_copy = inv;
  float* dinv = arrays_->upload_f32(inv_copy);
  const size_t n = static_cast<size_t>(b) * t * stride;
  Vec x = random_vector(g, n, -2, 2);
  Tensor tx = arrays_->upload(x, act());
  ASSERT_TRUE(ops_->rope_forward(tx, dinv, b, t, qh, hd, stride, pos0, stream()).is_ok());
  ASSERT_TRUE(ops_->rope_forward(at(tx, qh * hd), dinv, b, t, kvh, hd, stride, pos0, stream())
                  .is_ok());
  auto forward_ref = [&](const Vec& in) {
    Vec y = rope_ref(in, inv, {b, t, qh, hd, stride, 0, pos0});
    return rope_ref(y, inv, {b, t, kvh, hd, stride, qh * hd, pos0});
  };
  // v (and everything outside q and k) is left as it was: the reference copies it.
  expect_close(arrays_->download(tx, n), forward_ref(x), tolerance_for(act()), "rope forward");

  // Backward: the gradient of sum(rope(x) * r) is rope_backward(r), in place.
  Vec r = random_vector(g, n, -1, 1);
  Tensor dx = arrays_->upload(r, act());
  ASSERT_TRUE(ops_->rope_backward(dx, dinv, b, t, qh, hd, stride, pos0, stream()).is_ok());
  ASSERT_TRUE(ops_->rope_backward(at(dx, qh * hd), dinv, b, t, kvh, hd, stride, pos0, stream())
                  .is_ok());
  Vec fd = finite_differences(x, [&] { return weighted_sum(forward_ref(x), r); });
  // Outside q and k the op leaves the gradient as it was (the caller's), not the derivative.
  for (int row = 0; row < b * t; ++row) {
    for (int e = (qh + kvh) * hd; e < stride; ++e) fd[row * stride + e] = r[row * stride + e];
  }
  expect_close(arrays_->download(dx, n), fd, tolerance_for(act()), "rope backward");
}

TEST_P(LlamaOpsCpuTest, RopeDecodeStepEqualsTheFullForwardsRow) {
  // Llama 3's theta and a long position: a single row at pos_offset p rotates exactly as row p of
  // the full forward.
  const int t = 70, heads = 2, hd = 64;
  auto g = rng(21);
  const Vec inv = inv_freq_for(hd, 500000.0);
  Vec inv_copy = inv;
  float* dinv = arrays_->upload_f32(inv_copy);
  const size_t row = static_cast<size_t>(heads) * hd;
  Vec x = random_vector(g, t * row, -1, 1);
  Tensor full = arrays_->upload(x, act());
  ASSERT_TRUE(ops_->rope_forward(full, dinv, 1, t, heads, hd, row, 0, stream()).is_ok());
  const Vec got_full = arrays_->download(full, x.size());
  expect_close(got_full, rope_ref(x, inv, {1, t, heads, hd, static_cast<int>(row), 0, 0}),
               tolerance_for(act()), "rope full forward");
  for (int p : {0, 1, 63, 69}) {
    Vec one(x.begin() + p * row, x.begin() + (p + 1) * row);
    Tensor step = arrays_->upload(one, act());
    ASSERT_TRUE(ops_->rope_forward(step, dinv, 1, 1, heads, hd, row, p, stream()).is_ok());
    const Vec got = arrays_->download(step, row);
    for (size_t e = 0; e < row; ++e) {
      ASSERT_EQ(got[e], got_full[p * row + e]) << "position " << p << " element " << e;
    }
  }
}

// ---- SwiGLU ------------------------------------------------------------------------------------

TEST_P(LlamaOpsCpuTest, SwigluFusedAndSeparate) {
  struct Case {
    int rows, dim, stride, gate_off, up_off;
  };
  // Fused [gate | up] rows; gate and up each in a padded buffer of its own (stride > dim).
  for (const Case& k : {Case{7, 37, 74, 0, 37}, Case{1, 1, 2, 0, 1}, Case{5, 19, 19 + 3, 0, 0}}) {
    auto g = rng(static_cast<std::uint64_t>(300 + k.rows * 10 + k.dim));
    const bool fused = k.up_off != 0;
    const size_t n_in = static_cast<size_t>(k.rows) * k.stride;
    const size_t n_out = static_cast<size_t>(k.rows) * k.dim;
    // Fused: one buffer holds both. Separate: gate rows in `in`, up rows in `in2`.
    Vec in = random_vector(g, n_in, -5, 5);
    Vec in2 = random_vector(g, n_in, -2, 2);
    Tensor tin = arrays_->upload(in, act());
    Tensor tin2 = arrays_->upload(in2, act());
    const Tensor tgate = tin;
    const Tensor tup = fused ? at(tin, k.up_off) : tin2;
    // The reference sees one buffer: gate at gate_off, up at up_off (separate: up from in2, laid
    // out after it).
    auto joined = [&] {
      if (fused) return in;
      Vec j(2 * n_in);
      for (size_t i = 0; i < n_in; ++i) {
        j[2 * (i / k.stride) * k.stride + i % k.stride] = in[i];
        j[(2 * (i / k.stride) + 1) * k.stride + i % k.stride] = in2[i];
      }
      return j;
    };
    const int ref_stride = fused ? k.stride : 2 * k.stride;
    const int ref_up = fused ? k.up_off : k.stride;
    Tensor out = arrays_->zeros(n_out, act());
    ASSERT_TRUE(ops_->swiglu_forward(out, tgate, tup, k.rows, k.dim, k.stride, stream()).is_ok());
    expect_close(arrays_->download(out, n_out),
                 swiglu_ref(joined(), k.rows, k.dim, ref_stride, 0, ref_up), tolerance_for(act()),
                 "swiglu forward");

    Vec r = random_vector(g, n_out, -1, 1);
    Tensor dout = arrays_->upload(r, act());
    // Gradients laid out as the inputs; the padding of separate buffers keeps its values.
    Vec pad = random_vector(g, n_in, -1, 1);
    Tensor dgate_buf = arrays_->upload(pad, act());
    Vec pad2 = pad;
    Tensor dup_buf = fused ? dgate_buf : arrays_->upload(pad2, act());
    const Tensor dgate = dgate_buf;
    const Tensor dup = fused ? at(dgate_buf, k.up_off) : dup_buf;
    ASSERT_TRUE(
        ops_->swiglu_backward(dgate, dup, dout, tgate, tup, k.rows, k.dim, k.stride, stream())
            .is_ok());
    Vec j = joined();
    const Vec fd = finite_differences(
        j, [&] { return weighted_sum(swiglu_ref(j, k.rows, k.dim, ref_stride, 0, ref_up), r); });
    Vec want_gate = pad, want_up = pad2;
    for (int row = 0; row < k.rows; ++row) {
      for (int e = 0; e < k.dim; ++e) {
        want_gate[row * k.stride + e] = fd[row * ref_stride + e];
        (fused ? want_gate : want_up)[row * k.stride + k.up_off + e] =
            fd[row * ref_stride + ref_up + e];
      }
    }
    expect_close(arrays_->download(dgate_buf, n_in), want_gate, tolerance_for(act()),
                 "swiglu dgate");
    if (!fused) {
      expect_close(arrays_->download(dup_buf, n_in), want_up, tolerance_for(act()), "swiglu dup");
    }
  }
}

TEST(LlamaOpsMath, SiluIsStableAtTheExtremes) {
  for (float x : {-200.0f, -88.0f, -20.0f, -1.0f, 0.0f, 1e-3f, 3.0f, 90.0f, 200.0f}) {
    float dg = 0, du = 0;
    math::swiglu_backward(x, 1.0f, 1.0f, &dg, &du);
    EXPECT_TRUE(std::isfinite(dg) && std::isfinite(du)) << x;
    EXPECT_NEAR(du, silu_ref(x), 1e-6 + 1e-6 * std::abs(silu_ref(x))) << x;
    const double h = 1e-4;
    const double fd = (silu_ref(x + h) - silu_ref(x - h)) / (2 * h);
    EXPECT_NEAR(dg, fd, 1e-5 + 1e-5 * std::abs(fd)) << x;
  }
}

// ---- grouped-query attention ---------------------------------------------------------------------

TEST_P(LlamaOpsCpuTest, GqaAttentionFusedQkvForwardAndBackward) {
  struct Case {
    int batch, t, qh, kvh, hd, pad;
  };
  // MHA; GQA 4 -> 2 with padded rows; MQA 3 -> 1 with head_dim 1; T past two 64-row blocks.
  for (const Case& k : {Case{2, 7, 2, 2, 6, 0}, Case{2, 9, 4, 2, 4, 3}, Case{1, 5, 3, 1, 1, 0},
                        Case{1, 130, 2, 1, 4, 0}}) {
    auto g = rng(static_cast<std::uint64_t>(400 + k.t * 10 + k.qh));
    const int stride = (k.qh + 2 * k.kvh) * k.hd + k.pad;
    const GqaShape s{k.batch, k.t, k.t, k.qh, k.kvh, k.hd, stride, stride, 0, k.qh * k.hd,
                     (k.qh + k.kvh) * k.hd, 1.0 / std::sqrt(static_cast<double>(k.hd))};
    const float scale = static_cast<float>(s.scale);
    const size_t n_qkv = static_cast<size_t>(k.batch) * k.t * stride;
    const size_t n_out = static_cast<size_t>(k.batch) * k.t * k.qh * k.hd;
    const size_t n_lse = static_cast<size_t>(k.batch) * k.qh * k.t;
    Vec qkv = random_vector(g, n_qkv, -2, 2);
    Tensor tqkv = arrays_->upload(qkv, act());
    const Tensor tq = tqkv, tk = at(tqkv, s.k_off), tv = at(tqkv, s.v_off);
    Tensor out = arrays_->zeros(n_out, act());
    float* lse = arrays_->zeros_f32(n_lse);
    ASSERT_TRUE(ops_->gqa_attention_forward(out, lse, tq, tk, tv, k.batch, k.t, k.t, k.qh, k.kvh,
                                            k.hd, stride, stride, scale, stream()).is_ok());
    Vec rlse(n_lse);
    expect_close(arrays_->download(out, n_out), gqa_ref(qkv, qkv, s, &rlse), tolerance_for(act()),
                 "gqa forward");
    expect_close(arrays_->download_f32(lse, n_lse), rlse, tolerance_for(DType::kF32), "gqa lse");

    Vec r = random_vector(g, n_out, -1, 1);
    Tensor dout = arrays_->upload(r, act());
    Vec fd = finite_differences(qkv, [&] { return weighted_sum(gqa_ref(qkv, qkv, s, nullptr), r); });
    for (Accumulate mode : {Accumulate::kOverwrite, Accumulate::kAdd}) {
      // dq, dk, dv point into one fused buffer; its padding keeps its values in both modes.
      Vec d0 = random_vector(g, n_qkv, -1, 1);
      Tensor dqkv = arrays_->upload(d0, act());
      float* delta = arrays_->zeros_f32(n_lse);
      ASSERT_TRUE(ops_->gqa_attention_backward(at(dqkv, 0), at(dqkv, s.k_off), at(dqkv, s.v_off),
                                               mode, delta, dout, tq, tk, tv, out, lse, k.batch,
                                               k.t, k.qh, k.kvh, k.hd, stride, stride, scale,
                                               stream()).is_ok());
      Vec want(n_qkv);
      for (size_t i = 0; i < n_qkv; ++i) {
        const bool padding = static_cast<int>(i % stride) >= (k.qh + 2 * k.kvh) * k.hd;
        want[i] = padding ? d0[i] : (mode == Accumulate::kAdd ? d0[i] : 0.0) + fd[i];
      }
      expect_close(arrays_->download(dqkv, n_qkv), want, tolerance_for(act()), "gqa dqkv");
    }
  }
}

TEST_P(LlamaOpsCpuTest, GqaAttentionQueriesAfterACache) {
  // q_len < kv_len: the queries are the last q_len positions; separate q and [k | v] buffers with
  // padded rows, a custom scale.
  for (auto [batch, tq, tk] : {std::tuple{2, 3, 10}, std::tuple{1, 1, 1}, std::tuple{1, 5, 140}}) {
    auto g = rng(static_cast<std::uint64_t>(500 + tq * 1000 + tk));
    const int qh = 4, kvh = 2, hd = 8;
    const int q_stride = qh * hd + 2, kv_stride = 2 * kvh * hd + 1;
    const GqaShape s{batch, tq, tk, qh, kvh, hd, q_stride, kv_stride, 0, 0, kvh * hd, 0.3};
    Vec qbuf = random_vector(g, static_cast<size_t>(batch) * tq * q_stride, -2, 2);
    Vec kvbuf = random_vector(g, static_cast<size_t>(batch) * tk * kv_stride, -2, 2);
    Tensor tq_t = arrays_->upload(qbuf, act());
    Tensor tkv = arrays_->upload(kvbuf, act());
    const size_t n_out = static_cast<size_t>(batch) * tq * qh * hd;
    const size_t n_lse = static_cast<size_t>(batch) * qh * tq;
    Tensor out = arrays_->zeros(n_out, act());
    float* lse = arrays_->zeros_f32(n_lse);
    ASSERT_TRUE(ops_->gqa_attention_forward(out, lse, tq_t, tkv, at(tkv, s.v_off), batch, tq, tk,
                                            qh, kvh, hd, q_stride, kv_stride, 0.3f, stream())
                    .is_ok());
    Vec rlse(n_lse);
    expect_close(arrays_->download(out, n_out), gqa_ref(qbuf, kvbuf, s, &rlse),
                 tolerance_for(act()), "gqa forward after a cache");
    expect_close(arrays_->download_f32(lse, n_lse), rlse, tolerance_for(DType::kF32), "lse");
  }
}

TEST_P(LlamaOpsCpuTest, GqaAttentionDecodeStepEqualsTheFullForwardsRow) {
  // One decode step (q_len 1) over a cache of the first p positions plus the new one gives row p
  // of the full forward over the same q, k, v.
  const int batch = 2, t = 70, qh = 4, kvh = 2, hd = 16;
  const int stride = (qh + 2 * kvh) * hd;
  const float scale = 0.25f;
  auto g = rng(600);
  Vec qkv = random_vector(g, static_cast<size_t>(batch) * t * stride, -2, 2);
  Tensor tqkv = arrays_->upload(qkv, act());
  const size_t c = static_cast<size_t>(qh) * hd;
  Tensor out = arrays_->zeros(batch * t * c, act());
  float* lse = arrays_->zeros_f32(static_cast<size_t>(batch) * qh * t);
  ASSERT_TRUE(ops_->gqa_attention_forward(out, lse, tqkv, at(tqkv, qh * hd),
                                          at(tqkv, (qh + kvh) * hd), batch, t, t, qh, kvh, hd,
                                          stride, stride, scale, stream()).is_ok());
  const Vec full = arrays_->download(out, batch * t * c);
  for (int p : {0, 63, 64, 69}) {
    // The cache: rows 0..p of each batch's fused rows (rows past p do not exist yet).
    Vec cache(static_cast<size_t>(batch) * (p + 1) * stride);
    Vec q(static_cast<size_t>(batch) * stride);
    for (int b = 0; b < batch; ++b) {
      for (int j = 0; j <= p; ++j) {
        for (int e = 0; e < stride; ++e) {
          cache[(b * (p + 1) + j) * stride + e] = qkv[(b * t + j) * stride + e];
        }
      }
      for (int e = 0; e < stride; ++e) q[b * stride + e] = qkv[(b * t + p) * stride + e];
    }
    Tensor tcache = arrays_->upload(cache, act());
    Tensor tq1 = arrays_->upload(q, act());
    Tensor out1 = arrays_->zeros(batch * c, act());
    float* lse1 = arrays_->zeros_f32(static_cast<size_t>(batch) * qh);
    ASSERT_TRUE(ops_->gqa_attention_forward(out1, lse1, tq1, at(tcache, qh * hd),
                                            at(tcache, (qh + kvh) * hd), batch, 1, p + 1, qh, kvh,
                                            hd, stride, stride, scale, stream()).is_ok());
    Vec want(batch * c);
    for (int b = 0; b < batch; ++b) {
      for (size_t e = 0; e < c; ++e) want[b * c + e] = full[(b * t + p) * c + e];
    }
    // The same blocks in the same order: equal up to the final rounding to a 16-bit dtype.
    const testing::Tolerance tol =
        act() == DType::kF32 ? testing::Tolerance{1e-6, 1e-6} : testing::Tolerance{8e-3, 1e-6};
    expect_close(arrays_->download(out1, batch * c), want, tol,
                 "decode step at position " + std::to_string(p));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LlamaOpsCpuTest,
                         ::testing::ValuesIn(testing::storage_dtypes()),
                         testing::dtypes_name);

// ---- determinism -----------------------------------------------------------------------------------

// The backward sums (RMSNorm's dweight over rows, attention's dk/dv over a group's query heads)
// run in a fixed order: one thread and three give the same bits.
TEST(LlamaOpsDeterminism, BackwardBitsDoNotDependOnTheThreadCount) {
  auto d = gpu::HostDevice::create(256 << 20);
  ASSERT_TRUE(d.is_ok());
  gpu::Stream& s = (*d)->compute_stream();
  const std::uint64_t seed = 20261203 + 77;
  std::cout << "[ seed ] " << seed << "\n";
  const int rows = 100, dim = 40;
  const int b = 2, t = 80, qh = 6, kvh = 2, hd = 8, stride = (qh + 2 * kvh) * hd;
  std::vector<std::vector<double>> results[2];
  for (int run = 0; run < 2; ++run) {
    auto o = Ops::create(**d, OpsOptions{run == 0 ? 1 : 3});
    ASSERT_TRUE(o.is_ok());
    Ops& ops = **o;
    DeviceArrays a(**d, s);
    std::mt19937_64 g(seed);
    Vec x = random_vector(g, static_cast<size_t>(rows) * dim, -2, 2);
    Vec w = random_vector(g, dim, 0.5, 1.5);
    Vec r = random_vector(g, x.size(), -1, 1);
    Tensor tx = a.upload(x, DType::kF32), tw = a.upload(w, DType::kF32);
    Tensor dout = a.upload(r, DType::kF32);
    Tensor out = a.zeros(x.size(), DType::kF32), dx = a.zeros(x.size(), DType::kF32);
    Tensor dw = a.zeros(dim, DType::kF32);
    float* rstd = a.zeros_f32(rows);
    ASSERT_TRUE(ops.rmsnorm_forward(out, rstd, tx, tw, 1e-6f, rows, dim, s).is_ok());
    ASSERT_TRUE(
        ops.rmsnorm_backward(dx, Accumulate::kOverwrite, dw, dout, tx, tw, rstd, rows, dim, s)
            .is_ok());
    results[run].push_back(a.download(dx, x.size()));
    results[run].push_back(a.download(dw, dim));

    const size_t n_qkv = static_cast<size_t>(b) * t * stride;
    const size_t n_out = static_cast<size_t>(b) * t * qh * hd;
    Vec qkv = random_vector(g, n_qkv, -2, 2);
    Vec go = random_vector(g, n_out, -1, 1);
    Tensor tq = a.upload(qkv, DType::kF32), tg = a.upload(go, DType::kF32);
    const Tensor tk{static_cast<float*>(tq.data) + qh * hd, DType::kF32};
    const Tensor tv{static_cast<float*>(tq.data) + (qh + kvh) * hd, DType::kF32};
    Tensor ao = a.zeros(n_out, DType::kF32), dqkv = a.zeros(n_qkv, DType::kF32);
    float* lse = a.zeros_f32(static_cast<size_t>(b) * qh * t);
    float* delta = a.zeros_f32(static_cast<size_t>(b) * qh * t);
    ASSERT_TRUE(ops.gqa_attention_forward(ao, lse, tq, tk, tv, b, t, t, qh, kvh, hd, stride,
                                          stride, 0.35f, s).is_ok());
    const Tensor dk{static_cast<float*>(dqkv.data) + qh * hd, DType::kF32};
    const Tensor dv{static_cast<float*>(dqkv.data) + (qh + kvh) * hd, DType::kF32};
    ASSERT_TRUE(ops.gqa_attention_backward(dqkv, dk, dv, Accumulate::kOverwrite, delta, tg, tq,
                                           tk, tv, ao, lse, b, t, qh, kvh, hd, stride, stride,
                                           0.35f, s).is_ok());
    results[run].push_back(a.download(ao, n_out));
    results[run].push_back(a.download(dqkv, n_qkv));
    ASSERT_TRUE((*d)->synchronize().is_ok());
  }
  for (size_t i = 0; i < results[0].size(); ++i) {
    ASSERT_EQ(results[0][i].size(), results[1][i].size());
    for (size_t e = 0; e < results[0][i].size(); ++e) {
      ASSERT_EQ(results[0][i][e], results[1][i][e]) << "result " << i << " element " << e;
    }
  }
}

// ---- argument errors -------------------------------------------------------------------------------

TEST(LlamaOpsErrors, RejectsBadArgumentsNamingThem) {
  auto d = gpu::HostDevice::create(64 << 20);
  ASSERT_TRUE(d.is_ok());
  auto other = gpu::HostDevice::create(64 << 20);
  ASSERT_TRUE(other.is_ok());
  auto o = Ops::create(**d);
  ASSERT_TRUE(o.is_ok());
  Ops& ops = **o;
  gpu::Stream& s = (*d)->compute_stream();
  float buf[256] = {};
  const Tensor t{buf, DType::kF32};
  const Tensor none{nullptr, DType::kF32};
  auto expect_error = [](const Status& st, const std::string& text) {
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.message();
    EXPECT_NE(st.message().find(text), std::string::npos) << st.message();
  };
  expect_error(ops.rmsnorm_forward(t, buf, t, t, -1.0f, 2, 4, s), "rmsnorm_forward: eps");
  expect_error(ops.rmsnorm_forward(t, nullptr, t, t, 1e-6f, 2, 4, s), "rmsnorm_forward: rstd");
  expect_error(ops.rmsnorm_forward(t, buf, t, t, 1e-6f, 2, 0, s), "dim must be > 0");
  expect_error(ops.rmsnorm_backward(t, Accumulate::kAdd, none, t, Tensor{buf, DType::kF16}, t, buf,
                                    2, 4, s),
               "rmsnorm_backward: x is fp16 but must be fp32");
  expect_error(ops.rope_forward(t, buf, 1, 2, 2, 5, 10, 0, s), "head_dim 5 must be even");
  expect_error(ops.rope_forward(t, buf, 1, 2, 2, 4, 7, 0, s), "row_stride 7 is less than");
  expect_error(ops.rope_backward(t, buf, 1, 2, 2, 4, 8, -1, s), "rope_backward: pos_offset");
  expect_error(ops.rope_forward(t, nullptr, 1, 2, 2, 4, 8, 0, s), "rope_forward: inv_freq");
  expect_error(ops.swiglu_forward(t, t, t, 2, 4, 3, s), "in_stride 3 is less than dim 4");
  expect_error(ops.swiglu_backward(t, none, t, t, t, 2, 4, 8, s), "swiglu_backward: dup");
  expect_error(ops.gqa_attention_forward(t, buf, t, t, t, 1, 2, 2, 3, 2, 4, 12, 8, 0.5f, s),
               "q_heads 3 does not divide by kv_heads 2");
  expect_error(ops.gqa_attention_forward(t, buf, t, t, t, 1, 3, 2, 2, 1, 4, 8, 4, 0.5f, s),
               "kv_len 2 is less than q_len 3");
  expect_error(ops.gqa_attention_forward(t, buf, t, t, t, 1, 2, 2, 2, 1, 4, 7, 4, 0.5f, s),
               "q_stride 7 is less than");
  expect_error(ops.gqa_attention_forward(t, buf, t, t, t, 1, 2, 2, 2, 1, 4, 8, 3, 0.5f, s),
               "kv_stride 3 is less than");
  expect_error(ops.gqa_attention_forward(t, buf, t, t, t, 1, 2, 2, 2, 1, 4, 8, 4, NAN, s),
               "scale must be finite");
  expect_error(ops.gqa_attention_forward(t, buf, t, none, t, 1, 2, 2, 2, 1, 4, 8, 4, 0.5f, s),
               "gqa_attention_forward: k is null");
  expect_error(ops.gqa_attention_backward(t, t, t, Accumulate::kOverwrite, nullptr, t, t, t, t, t,
                                          buf, 1, 2, 2, 1, 4, 8, 4, 0.5f, s),
               "gqa_attention_backward: delta");
  expect_error(ops.rmsnorm_forward(t, buf, t, t, 1e-6f, 2, 4, (*other)->compute_stream()),
               "belongs to another device");
  EXPECT_TRUE((*d)->synchronize().is_ok());
}

}  // namespace
}  // namespace tz::ops
