// The CPU backend of ops/ops.h against float64 references written here: every op's forward against
// the reference, every backward against central finite differences of the reference (so the
// gradient formulas are checked independently of both the kernels and any analytic derivation),
// at odd shapes (T = 1 and T past one 64-row attention block, heads = 1, embd not a multiple of
// 64, vocab not a multiple of 8), with fp32 and 16-bit storage, parameter gradients accumulating
// onto what their buffers held. Seeds are printed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/host_device.h"
#include "ops/internal/cpu_kernels.h"
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

// ---- float64 references ----------------------------------------------------------------------

Vec embedding_ref(const std::vector<std::int32_t>& tok, const Vec& wte, const Vec& wpe, int b,
                  int t, int c) {
  Vec out(static_cast<std::size_t>(b) * t * c);
  for (int r = 0; r < b * t; ++r) {
    for (int k = 0; k < c; ++k) out[r * c + k] = wte[tok[r] * c + k] + wpe[(r % t) * c + k];
  }
  return out;
}

Vec layernorm_ref(const Vec& x, const Vec& w, const Vec& bias, int rows, int dim, Vec* mean,
                  Vec* rstd) {
  Vec out(x.size());
  for (int r = 0; r < rows; ++r) {
    double m = 0;
    for (int k = 0; k < dim; ++k) m += x[r * dim + k];
    m /= dim;
    double var = 0;
    for (int k = 0; k < dim; ++k) var += (x[r * dim + k] - m) * (x[r * dim + k] - m);
    const double rs = 1.0 / std::sqrt(var / dim + 1e-5);
    for (int k = 0; k < dim; ++k) out[r * dim + k] = (x[r * dim + k] - m) * rs * w[k] + bias[k];
    if (mean != nullptr) (*mean)[r] = m;
    if (rstd != nullptr) (*rstd)[r] = rs;
  }
  return out;
}

Vec matmul_ref(const Vec& x, const Vec& w, const Vec* bias, WeightLayout layout, int rows, int in,
               int out_dim) {
  Vec y(static_cast<std::size_t>(rows) * out_dim);
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out_dim; ++o) {
      double s = bias != nullptr ? (*bias)[o] : 0.0;
      for (int i = 0; i < in; ++i) {
        s += x[r * in + i] * (layout == WeightLayout::kInOut ? w[i * out_dim + o] : w[o * in + i]);
      }
      y[r * out_dim + o] = s;
    }
  }
  return y;
}

// Plain softmax attention over the full causal T x T score matrix, per head.
Vec attention_ref(const Vec& qkv, int b, int t, int c, int h, Vec* lse) {
  const int hd = c / h;
  Vec out(static_cast<std::size_t>(b) * t * c, 0.0);
  auto at = [&](int bi, int ti, int part, int hi, int d) {
    return qkv[((bi * t + ti) * 3 + part) * c + hi * hd + d];
  };
  for (int bi = 0; bi < b; ++bi) {
    for (int hi = 0; hi < h; ++hi) {
      for (int i = 0; i < t; ++i) {
        Vec s(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += at(bi, i, 0, hi, d) * at(bi, j, 1, hi, d);
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - mx) / sum;
          for (int d = 0; d < hd; ++d) out[(bi * t + i) * c + hi * hd + d] += p * at(bi, j, 2, hi, d);
        }
        if (lse != nullptr) (*lse)[(bi * h + hi) * t + i] = mx + std::log(sum);
      }
    }
  }
  return out;
}

double gelu_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

Vec cross_entropy_ref(const Vec& logits, const std::vector<std::int32_t>& tgt, int rows, int v) {
  Vec loss(rows);
  for (int r = 0; r < rows; ++r) {
    double mx = -1e300;
    for (int k = 0; k < v; ++k) mx = std::max(mx, logits[r * v + k]);
    double s = 0;
    for (int k = 0; k < v; ++k) s += std::exp(logits[r * v + k] - mx);
    loss[r] = mx + std::log(s) - logits[r * v + tgt[r]];
  }
  return loss;
}

// ---- fixture -----------------------------------------------------------------------------------

class OpsCpuTest : public testing::OpsCpuFixture {
 protected:
  OpsCpuTest() : OpsCpuFixture(20261201) {}
};

// ---- embedding -------------------------------------------------------------------------------

TEST_P(OpsCpuTest, Embedding) {
  for (auto [b, t, c, v] : {std::tuple{2, 5, 13, 11}, std::tuple{1, 1, 3, 5}}) {
    auto g = rng(static_cast<std::uint64_t>(b * 1000 + t));
    std::vector<std::int32_t> tok(static_cast<std::size_t>(b) * t);
    for (auto& x : tok) x = static_cast<std::int32_t>(g() % static_cast<std::uint64_t>(v / 2 + 1));
    const int max_t = t + 2;  // wpe has more rows than the sequence uses
    Vec wte = random_vector(g, static_cast<std::size_t>(v) * c, -1, 1);
    Vec wpe = random_vector(g, static_cast<std::size_t>(max_t) * c, -1, 1);
    auto* dtok = arrays_->upload_i32(tok);
    Tensor twte = arrays_->upload(wte, param());
    Tensor twpe = arrays_->upload(wpe, param());
    Tensor out = arrays_->zeros(static_cast<std::size_t>(b) * t * c, act());
    ASSERT_TRUE(ops_->embedding_forward(out, dtok, twte, twpe, b, t, c, v, stream()).is_ok());
    expect_close(arrays_->download(out, tok.size() * c), embedding_ref(tok, wte, wpe, b, t, c),
                 tolerance_for(act()), "embedding forward");

    Vec w = random_vector(g, tok.size() * c, -1, 1);
    Tensor dout = arrays_->upload(w, act());
    Vec g0_wte = random_vector(g, wte.size(), -0.5, 0.5);
    Vec g0_wpe = random_vector(g, wpe.size(), -0.5, 0.5);
    Tensor dwte = arrays_->upload(g0_wte, param());
    Tensor dwpe = arrays_->upload(g0_wpe, param());
    ASSERT_TRUE(ops_->embedding_backward(dwte, dwpe, dout, dtok, b, t, c, v, stream()).is_ok());
    auto loss = [&] { return weighted_sum(embedding_ref(tok, wte, wpe, b, t, c), w); };
    expect_close(arrays_->download(dwte, wte.size()), plus(g0_wte, finite_differences(wte, loss)),
                 tolerance_for(param()), "embedding dwte");
    expect_close(arrays_->download(dwpe, wpe.size()), plus(g0_wpe, finite_differences(wpe, loss)),
                 tolerance_for(param()), "embedding dwpe");
  }
}

// ---- layernorm -------------------------------------------------------------------------------

TEST_P(OpsCpuTest, LayerNorm) {
  for (auto [rows, dim] : {std::pair{7, 37}, std::pair{1, 1}, std::pair{70, 96}}) {
    auto g = rng(static_cast<std::uint64_t>(rows * 100 + dim));
    Vec x = random_vector(g, static_cast<std::size_t>(rows) * dim, 2, 4);  // |mean| >> spread
    Vec w = random_vector(g, dim, 0.5, 1.5);
    Vec bias = random_vector(g, dim, -1, 1);
    Tensor tx = arrays_->upload(x, act());
    Tensor tw = arrays_->upload(w, param());
    Tensor tb = arrays_->upload(bias, param());
    Tensor out = arrays_->zeros(x.size(), act());
    float* mean = arrays_->zeros_f32(rows);
    float* rstd = arrays_->zeros_f32(rows);
    ASSERT_TRUE(
        ops_->layernorm_forward(out, mean, rstd, tx, tw, tb, rows, dim, stream()).is_ok());
    Vec rmean(rows), rrstd(rows);
    const Vec ref = layernorm_ref(x, w, bias, rows, dim, &rmean, &rrstd);
    expect_close(arrays_->download(out, x.size()), ref, tolerance_for(act()), "layernorm forward");
    expect_close(arrays_->download_f32(mean, rows), rmean, tolerance_for(DType::kF32), "mean");
    // rstd of a 1-wide row is 1/sqrt(eps): fp32 rounding of the zero deviation matters little.
    expect_close(arrays_->download_f32(rstd, rows), rrstd, {1e-3, 1e-5}, "rstd");

    if (dim == 1) continue;  // the output is the bias whatever x is: no gradient to check
    for (Accumulate mode : {Accumulate::kOverwrite, Accumulate::kAdd}) {
      Vec r = random_vector(g, x.size(), -1, 1);
      Tensor dout = arrays_->upload(r, act());
      Vec dx0 = mode == Accumulate::kAdd ? random_vector(g, x.size(), -1, 1) : Vec(x.size(), 0.0);
      Tensor dx = arrays_->upload(dx0, act());
      Vec g0w = random_vector(g, dim, -1, 1);
      Vec g0b = random_vector(g, dim, -1, 1);
      Tensor dw = arrays_->upload(g0w, param());
      Tensor db = arrays_->upload(g0b, param());
      ASSERT_TRUE(ops_->layernorm_backward(dx, mode, dw, db, dout, tx, tw, mean, rstd, rows, dim,
                                           stream()).is_ok());
      auto loss = [&] { return weighted_sum(layernorm_ref(x, w, bias, rows, dim, nullptr, nullptr), r); };
      expect_close(arrays_->download(dx, x.size()), plus(dx0, finite_differences(x, loss)),
                   tolerance_for(act()), "layernorm dx");
      expect_close(arrays_->download(dw, dim), plus(g0w, finite_differences(w, loss)),
                   tolerance_for(param()), "layernorm dweight");
      expect_close(arrays_->download(db, dim), plus(g0b, finite_differences(bias, loss)),
                   tolerance_for(param()), "layernorm dbias");
    }
  }
}

// ---- matmul ----------------------------------------------------------------------------------

TEST_P(OpsCpuTest, Matmul) {
  struct Case {
    int rows, in, out;
    WeightLayout layout;
    bool bias;
    Accumulate mode;
  };
  for (const Case& k : {Case{7, 19, 23, WeightLayout::kInOut, true, Accumulate::kOverwrite},
                        Case{1, 5, 3, WeightLayout::kInOut, false, Accumulate::kAdd},
                        Case{9, 13, 37, WeightLayout::kOutIn, false, Accumulate::kOverwrite},
                        Case{6, 8, 11, WeightLayout::kOutIn, true, Accumulate::kAdd}}) {
    auto g = rng(static_cast<std::uint64_t>(k.rows * 10000 + k.in * 100 + k.out));
    Vec x = random_vector(g, static_cast<std::size_t>(k.rows) * k.in, -1, 1);
    Vec w = random_vector(g, static_cast<std::size_t>(k.in) * k.out, -1, 1);
    Vec bias = random_vector(g, k.out, -1, 1);
    Tensor tx = arrays_->upload(x, act());
    Tensor tw = arrays_->upload(w, param());
    Tensor tb = k.bias ? arrays_->upload(bias, param()) : Tensor{nullptr, param()};
    Tensor out = arrays_->zeros(static_cast<std::size_t>(k.rows) * k.out, act());
    ASSERT_TRUE(ops_->matmul_forward(out, tx, tw, k.layout, tb, k.rows, k.in, k.out, stream())
                    .is_ok());
    const Vec* bp = k.bias ? &bias : nullptr;
    expect_close(arrays_->download(out, static_cast<std::size_t>(k.rows) * k.out),
                 matmul_ref(x, w, bp, k.layout, k.rows, k.in, k.out), tolerance_for(act()),
                 "matmul forward");

    Vec r = random_vector(g, static_cast<std::size_t>(k.rows) * k.out, -1, 1);
    Tensor dout = arrays_->upload(r, act());
    Vec dx0 = k.mode == Accumulate::kAdd ? random_vector(g, x.size(), -1, 1) : Vec(x.size(), 0.0);
    Tensor dx = arrays_->upload(dx0, act());
    Vec g0w = random_vector(g, w.size(), -1, 1);
    Vec g0b = random_vector(g, bias.size(), -1, 1);
    Tensor dw = arrays_->upload(g0w, param());
    Tensor db = k.bias ? arrays_->upload(g0b, param()) : Tensor{nullptr, param()};
    ASSERT_TRUE(ops_->matmul_backward(dx, k.mode, dw, db, dout, tx, tw, k.layout, k.rows, k.in,
                                      k.out, stream()).is_ok());
    auto loss = [&] { return weighted_sum(matmul_ref(x, w, bp, k.layout, k.rows, k.in, k.out), r); };
    expect_close(arrays_->download(dx, x.size()), plus(dx0, finite_differences(x, loss)),
                 tolerance_for(act()), "matmul dx");
    expect_close(arrays_->download(dw, w.size()), plus(g0w, finite_differences(w, loss)),
                 tolerance_for(param()), "matmul dweight");
    if (k.bias) {
      expect_close(arrays_->download(db, bias.size()), plus(g0b, finite_differences(bias, loss)),
                   tolerance_for(param()), "matmul dbias");
    }
  }
}

// ---- attention -------------------------------------------------------------------------------

TEST_P(OpsCpuTest, Attention) {
  // T = 1; T odd below one block; T = 130 spans three 64-row blocks with a ragged last one.
  for (auto [b, t, c, h] : {std::tuple{2, 1, 6, 2}, std::tuple{2, 7, 12, 3}, std::tuple{1, 9, 5, 1},
                            std::tuple{1, 130, 4, 1}}) {
    auto g = rng(static_cast<std::uint64_t>(b * 100000 + t * 100 + c));
    const std::size_t n_qkv = static_cast<std::size_t>(b) * t * 3 * c;
    const std::size_t n_out = static_cast<std::size_t>(b) * t * c;
    const std::size_t n_lse = static_cast<std::size_t>(b) * h * t;
    Vec qkv = random_vector(g, n_qkv, -2, 2);
    Tensor tqkv = arrays_->upload(qkv, act());
    Tensor out = arrays_->zeros(n_out, act());
    float* lse = arrays_->zeros_f32(n_lse);
    ASSERT_TRUE(ops_->attention_forward(out, lse, tqkv, b, t, c, h, stream()).is_ok());
    Vec rlse(n_lse);
    expect_close(arrays_->download(out, n_out), attention_ref(qkv, b, t, c, h, &rlse),
                 tolerance_for(act()), "attention forward");
    expect_close(arrays_->download_f32(lse, n_lse), rlse, tolerance_for(DType::kF32), "lse");

    for (Accumulate mode : {Accumulate::kOverwrite, Accumulate::kAdd}) {
      Vec r = random_vector(g, n_out, -1, 1);
      Tensor dout = arrays_->upload(r, act());
      Vec d0 = mode == Accumulate::kAdd ? random_vector(g, n_qkv, -1, 1) : Vec(n_qkv, 0.0);
      Tensor dqkv = arrays_->upload(d0, act());
      float* delta = arrays_->zeros_f32(n_lse);
      ASSERT_TRUE(ops_->attention_backward(dqkv, mode, delta, dout, tqkv, out, lse, b, t, c, h,
                                           stream()).is_ok());
      auto loss = [&] { return weighted_sum(attention_ref(qkv, b, t, c, h, nullptr), r); };
      expect_close(arrays_->download(dqkv, n_qkv), plus(d0, finite_differences(qkv, loss)),
                   tolerance_for(act()), "attention dqkv");
    }
  }
}

// ---- gelu, residual ---------------------------------------------------------------------------

TEST_P(OpsCpuTest, Gelu) {
  auto g = rng(7);
  const int n = 1001;
  Vec x = random_vector(g, n, -6, 6);
  Tensor tx = arrays_->upload(x, act());
  Tensor out = arrays_->zeros(n, act());
  ASSERT_TRUE(ops_->gelu_forward(out, tx, n, stream()).is_ok());
  Vec ref(n);
  for (int i = 0; i < n; ++i) ref[i] = gelu_ref(x[i]);
  expect_close(arrays_->download(out, n), ref, tolerance_for(act()), "gelu forward");
  for (Accumulate mode : {Accumulate::kOverwrite, Accumulate::kAdd}) {
    Vec r = random_vector(g, n, -1, 1);
    Tensor dout = arrays_->upload(r, act());
    Vec d0 = mode == Accumulate::kAdd ? random_vector(g, n, -1, 1) : Vec(n, 0.0);
    Tensor dx = arrays_->upload(d0, act());
    ASSERT_TRUE(ops_->gelu_backward(dx, mode, dout, tx, n, stream()).is_ok());
    auto loss = [&] {
      double s = 0;
      for (int i = 0; i < n; ++i) s += gelu_ref(x[i]) * r[i];
      return s;
    };
    expect_close(arrays_->download(dx, n), plus(d0, finite_differences(x, loss)),
                 tolerance_for(act()), "gelu dx");
  }
  // In place: out aliases x.
  ASSERT_TRUE(ops_->gelu_forward(tx, tx, n, stream()).is_ok());
  expect_close(arrays_->download(tx, n), ref, tolerance_for(act()), "gelu forward in place");
}

TEST(OpsMath, GeluDerivativeMatchesFiniteDifferences) {
  for (double x = -8; x <= 8; x += 0.125) {
    const double h = 1e-4;
    const double fd = (gelu_ref(x + h) - gelu_ref(x - h)) / (2 * h);
    EXPECT_NEAR(math::gelu_derivative(static_cast<float>(x)), fd, 2e-6 + 1e-5 * std::abs(fd)) << x;
    EXPECT_NEAR(math::gelu_forward(static_cast<float>(x)), gelu_ref(x), 1e-6 + 1e-6 * std::abs(x));
  }
}

TEST_P(OpsCpuTest, Residual) {
  auto g = rng(11);
  const int n = 40000;  // more than one element-wise task
  Vec a = random_vector(g, n, -1, 1);
  Vec b = random_vector(g, n, -1, 1);
  Tensor ta = arrays_->upload(a, act());
  Tensor tb = arrays_->upload(b, act());
  Tensor out = arrays_->zeros(n, act());
  ASSERT_TRUE(ops_->residual_forward(out, ta, tb, n, stream()).is_ok());
  expect_close(arrays_->download(out, n), plus(a, b), tolerance_for(act()), "residual forward");

  Vec r = random_vector(g, n, -1, 1);
  Tensor dout = arrays_->upload(r, act());
  Vec da0 = random_vector(g, n, -1, 1);
  Tensor da = arrays_->upload(da0, act());
  Tensor db = arrays_->zeros(n, act());
  ASSERT_TRUE(ops_->residual_backward(da, Accumulate::kAdd, db, Accumulate::kOverwrite, dout, n,
                                      stream()).is_ok());
  expect_close(arrays_->download(da, n), plus(da0, r), tolerance_for(act()), "residual da");
  expect_close(arrays_->download(db, n), r, tolerance_for(act()), "residual db");
}

// out = alpha * x * keep, overwrite (also in place) and add, with and without a mask.
TEST_P(OpsCpuTest, Scale) {
  auto g = rng(13);
  const int n = 40000;  // more than one element-wise task
  Vec x = random_vector(g, n, -1, 1);
  Tensor tx = arrays_->upload(x, act());
  std::vector<std::uint8_t> keep(n);
  for (int i = 0; i < n; ++i) keep[i] = static_cast<std::uint8_t>((i * 7919 % 10) < 7);
  const std::uint8_t* dkeep = arrays_->upload_u8(keep);
  const double alpha = 1.0 / 0.7;
  for (const bool masked : {false, true}) {
    for (Accumulate mode : {Accumulate::kOverwrite, Accumulate::kAdd}) {
      Vec o0 = mode == Accumulate::kAdd ? random_vector(g, n, -1, 1) : Vec(n, 0.0);
      Tensor out = arrays_->upload(o0, act());
      ASSERT_TRUE(ops_->scale(out, mode, tx, masked ? dkeep : nullptr, static_cast<float>(alpha),
                              n, stream()).is_ok());
      Vec ref(n);
      for (int i = 0; i < n; ++i) {
        ref[i] = o0[i] + (masked && keep[i] == 0 ? 0.0 : static_cast<float>(alpha) * x[i]);
      }
      expect_close(arrays_->download(out, n), ref, tolerance_for(act()), "scale");
    }
  }
  Vec ref(n);
  for (int i = 0; i < n; ++i) ref[i] = 0.5 * x[i];
  ASSERT_TRUE(ops_->scale(tx, Accumulate::kOverwrite, tx, nullptr, 0.5f, n, stream()).is_ok());
  expect_close(arrays_->download(tx, n), ref, tolerance_for(act()), "scale in place");
  EXPECT_FALSE(ops_->scale(tx, Accumulate::kAdd, tx, nullptr, 0.5f, n, stream()).is_ok());
}

// ---- cross-entropy ---------------------------------------------------------------------------

TEST_P(OpsCpuTest, CrossEntropy) {
  for (auto [rows, v] : {std::pair{5, 37}, std::pair{1, 3}, std::pair{3, 1001}}) {
    auto g = rng(static_cast<std::uint64_t>(rows * 10000 + v));
    Vec logits = random_vector(g, static_cast<std::size_t>(rows) * v, -4, 4);
    std::vector<std::int32_t> tgt(rows);
    for (auto& x : tgt) x = static_cast<std::int32_t>(g() % static_cast<std::uint64_t>(v));
    auto* dt = arrays_->upload_i32(tgt);
    Tensor tl = arrays_->upload(logits, act());
    float* losses = arrays_->zeros_f32(rows);
    ASSERT_TRUE(ops_->cross_entropy_forward(losses, tl, dt, rows, v, stream()).is_ok());
    const Vec ref = cross_entropy_ref(logits, tgt, rows, v);
    expect_close(arrays_->download_f32(losses, rows), ref, tolerance_for(DType::kF32), "ce loss");

    const float scale = 1.0f / static_cast<float>(rows);
    auto loss = [&] {
      double s = 0;
      for (double l : cross_entropy_ref(logits, tgt, rows, v)) s += l;
      return s * scale;
    };
    const Vec fd = finite_differences(logits, loss);
    // Separate output buffer, then in place over the logits (losses written in the same pass).
    Tensor dl = arrays_->zeros(logits.size(), act());
    ASSERT_TRUE(ops_->cross_entropy_backward(dl, nullptr, tl, dt, rows, v, scale, stream()).is_ok());
    expect_close(arrays_->download(dl, logits.size()), fd, tolerance_for(act()), "ce dlogits");
    float* losses2 = arrays_->zeros_f32(rows);
    ASSERT_TRUE(ops_->cross_entropy_backward(tl, losses2, tl, dt, rows, v, scale, stream()).is_ok());
    expect_close(arrays_->download(tl, logits.size()), fd, tolerance_for(act()),
                 "ce dlogits in place");
    expect_close(arrays_->download_f32(losses2, rows), ref, tolerance_for(DType::kF32),
                 "ce loss of the fused pass");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OpsCpuTest,
                         ::testing::ValuesIn(testing::storage_dtypes()),
                         testing::dtypes_name);

// ---- argument errors ---------------------------------------------------------------------------

TEST(OpsCpuErrors, RejectsBadArgumentsNamingThem) {
  auto d = gpu::HostDevice::create(64 << 20);
  ASSERT_TRUE(d.is_ok());
  auto o = Ops::create(**d);
  ASSERT_TRUE(o.is_ok());
  Ops& ops = **o;
  gpu::Stream& s = (*d)->compute_stream();
  float buf[64] = {};
  const Tensor t{buf, DType::kF32};
  Status st = ops.attention_forward(t, buf, t, 1, 4, 10, 3, s);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("heads"), std::string::npos) << st.message();
  st = ops.matmul_forward(t, Tensor{nullptr, DType::kF32}, t, WeightLayout::kInOut, Tensor{}, 1, 1,
                          1, s);
  EXPECT_NE(st.message().find("matmul_forward: x"), std::string::npos) << st.message();
  st = ops.layernorm_forward(t, buf, buf, t, t, t, 0, 4, s);
  EXPECT_NE(st.message().find("rows must be > 0"), std::string::npos) << st.message();
  st = ops.gelu_forward(t, Tensor{buf, DType::kBF16}, 4, s);
  EXPECT_NE(st.message().find("x is bf16 but must be fp32"), std::string::npos) << st.message();
  EXPECT_EQ(Ops::create(**d, OpsOptions{-1}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE((*d)->synchronize().is_ok());
}

// The attention tiles' matmul_acc keeps blocks of C in registers; each element must still be the
// same in-order sum of fused products as a row-at-a-time product (one row per call), for every
// shape (rows and columns past the blocks, leading dimensions wider than the block) and beta.
TEST(OpsCpuKernels, BlockedMatmulAccEqualsRowAtATimeBitwise) {
  const std::uint64_t seed = 20261201 + 5;
  std::cout << "[ seed ] " << seed << "\n";
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [m, k, n] : {std::tuple<std::size_t, std::size_t, std::size_t>{64, 64, 64},
                                {7, 5, 33}, {4, 1, 16}, {9, 70, 17}, {1, 3, 3}, {13, 64, 40}}) {
    for (const float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) +
                   " beta " + std::to_string(beta));
      const std::size_t lda = k + 3, ldb = n + 5, ldc = n + 2;
      std::vector<float> a(m * lda), b(k * ldb), c0(m * ldc);
      for (float& x : a) x = normal(rng);
      for (float& x : b) x = normal(rng);
      for (float& x : c0) x = normal(rng);
      std::vector<float> blocked = c0, rows = c0;
      cpu_kernels::matmul_acc(a.data(), lda, b.data(), ldb, blocked.data(), ldc, m, k, n, beta);
      for (std::size_t i = 0; i < m; ++i) {
        cpu_kernels::matmul_acc(a.data() + i * lda, lda, b.data(), ldb, rows.data() + i * ldc, ldc,
                                1, k, n, beta);
      }
      ASSERT_EQ(0, std::memcmp(blocked.data(), rows.data(), blocked.size() * sizeof(float)));
    }
  }
}

}  // namespace
}  // namespace tz::ops
