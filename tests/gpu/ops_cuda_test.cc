// The CUDA backend of ops/ops.h against the CPU backend (itself tested against float64 references
// and finite differences in tests/unit/ops): every op's forward and backward on the same seeded,
// pre-rounded inputs, fp32 and bf16 storage, odd shapes and GPT-2-small-like ones (head_dim 64,
// vocab 50257, T past several attention tiles), and the Llama family's ops (RMSNorm, rotary
// embedding, SwiGLU, grouped-query attention with a decode step) at Llama-3.2-1B-like and
// Qwen3-like shapes. Skips with the reason when no GPU can be used.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/host_device.h"
#include "gpu/select.h"
#include "ops/ops.h"
#include "ops_harness.h"

namespace tz::ops {
namespace {

using testing::DeviceArrays;
using testing::random_vector;
using Vec = std::vector<double>;
// One case: uploads its inputs (the same on both backends: same seed), runs ops, returns named
// outputs downloaded to the host.
using Outputs = std::vector<std::pair<std::string, Vec>>;
using Case = std::function<Outputs(Ops&, DeviceArrays&, std::mt19937_64&)>;

class OpsCudaTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    auto cuda = gpu::create_cuda_device(0, 8ull << 30);
    if (!cuda.is_ok()) GTEST_SKIP() << "skipped: " << cuda.status().message();
    cuda_ = std::move(*cuda);
    auto host = gpu::HostDevice::create(8ull << 30);
    ASSERT_TRUE(host.is_ok());
    host_ = std::move(*host);
    auto co = Ops::create(*cuda_);
    ASSERT_TRUE(co.is_ok()) << co.status().message();
    cuda_ops_ = std::move(*co);
    auto ho = Ops::create(*host_);
    ASSERT_TRUE(ho.is_ok());
    host_ops_ = std::move(*ho);
    std::cout << cuda_ops_->name() << " vs " << host_ops_->name() << "\n";
  }
  void TearDown() override {
    if (cuda_) {
      EXPECT_TRUE(cuda_->synchronize().is_ok());
    }
  }
  DType dt() const { return GetParam(); }

  void compare(const Case& c, std::uint64_t seed) {
    std::cout << "[ seed ] " << seed << "\n";
    std::mt19937_64 g1(seed);
    std::mt19937_64 g2(seed);
    DeviceArrays ha(*host_, host_->compute_stream());
    DeviceArrays ca(*cuda_, cuda_->compute_stream());
    const Outputs want = c(*host_ops_, ha, g1);
    const Outputs got = c(*cuda_ops_, ca, g2);
    ASSERT_EQ(want.size(), got.size());
    const testing::Tolerance tol =
        dt() == DType::kF32 ? testing::Tolerance{1e-3, 1e-4} : testing::Tolerance{2e-2, 8e-3};
    for (std::size_t i = 0; i < want.size(); ++i) {
      testing::expect_close(got[i].second, want[i].second, tol, want[i].first);
    }
  }

  std::unique_ptr<gpu::Device> cuda_;
  std::unique_ptr<gpu::HostDevice> host_;
  std::unique_ptr<Ops> cuda_ops_;
  std::unique_ptr<Ops> host_ops_;
};

TEST_P(OpsCudaTest, Embedding) {
  const DType d = dt();
  for (auto [b, t, c, v] : {std::tuple{2, 7, 13, 11}, std::tuple{4, 256, 768, 50257}}) {
    compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
      gpu::Stream& s = ops.device().compute_stream();
      std::vector<std::int32_t> tok(static_cast<std::size_t>(b) * t);
      for (auto& x : tok) x = static_cast<std::int32_t>(g() % static_cast<std::uint64_t>(v / 3 + 1));
      Vec wte = random_vector(g, static_cast<std::size_t>(v) * c, -1, 1);
      Vec wpe = random_vector(g, static_cast<std::size_t>(t) * c, -1, 1);
      Vec r = random_vector(g, tok.size() * c, -1, 1);
      auto* dtok = a.upload_i32(tok);
      Tensor twte = a.upload(wte, d), twpe = a.upload(wpe, d), dout = a.upload(r, d);
      Tensor out = a.zeros(tok.size() * c, d);
      Tensor dwte = a.upload(wte, d), dwpe = a.upload(wpe, d);  // accumulate onto the tables
      EXPECT_TRUE(ops.embedding_forward(out, dtok, twte, twpe, b, t, c, v, s).is_ok());
      EXPECT_TRUE(ops.embedding_backward(dwte, dwpe, dout, dtok, b, t, c, v, s).is_ok());
      return {{"out", a.download(out, tok.size() * c)},
              {"dwte", a.download(dwte, wte.size())},
              {"dwpe", a.download(dwpe, wpe.size())}};
    }, static_cast<std::uint64_t>(100 + t));
  }
}

TEST_P(OpsCudaTest, LayerNorm) {
  const DType d = dt();
  for (auto [rows, dim] : {std::pair{7, 37}, std::pair{1024, 768}}) {
    compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
      gpu::Stream& s = ops.device().compute_stream();
      const std::size_t n = static_cast<std::size_t>(rows) * dim;
      Vec x = random_vector(g, n, -2, 3), w = random_vector(g, dim, 0.5, 1.5);
      Vec bias = random_vector(g, dim, -1, 1), r = random_vector(g, n, -1, 1);
      Vec dx0 = random_vector(g, n, -1, 1);
      Tensor tx = a.upload(x, d), tw = a.upload(w, d), tb = a.upload(bias, d);
      Tensor dout = a.upload(r, d), dx = a.upload(dx0, d);
      Tensor dw = a.upload(w, d), db = a.upload(bias, d);
      Tensor out = a.zeros(n, d);
      float* mean = a.zeros_f32(rows);
      float* rstd = a.zeros_f32(rows);
      EXPECT_TRUE(ops.layernorm_forward(out, mean, rstd, tx, tw, tb, rows, dim, s).is_ok());
      EXPECT_TRUE(ops.layernorm_backward(dx, Accumulate::kAdd, dw, db, dout, tx, tw, mean, rstd,
                                         rows, dim, s).is_ok());
      return {{"out", a.download(out, n)}, {"mean", a.download_f32(mean, rows)},
              {"rstd", a.download_f32(rstd, rows)}, {"dx", a.download(dx, n)},
              {"dweight", a.download(dw, dim)}, {"dbias", a.download(db, dim)}};
    }, static_cast<std::uint64_t>(200 + rows));
  }
}

TEST_P(OpsCudaTest, Matmul) {
  const DType d = dt();
  struct Shape {
    int rows, in, out;
    WeightLayout layout;
  };
  for (const Shape& k : {Shape{7, 19, 23, WeightLayout::kInOut}, Shape{9, 13, 37, WeightLayout::kOutIn},
                         Shape{1024, 768, 2304, WeightLayout::kInOut},
                         Shape{256, 768, 50257, WeightLayout::kOutIn}}) {
    compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
      gpu::Stream& s = ops.device().compute_stream();
      const std::size_t nx = static_cast<std::size_t>(k.rows) * k.in;
      const std::size_t nw = static_cast<std::size_t>(k.in) * k.out;
      const std::size_t ny = static_cast<std::size_t>(k.rows) * k.out;
      Vec x = random_vector(g, nx, -1, 1), w = random_vector(g, nw, -0.1, 0.1);
      Vec bias = random_vector(g, k.out, -1, 1), r = random_vector(g, ny, -1, 1);
      Tensor tx = a.upload(x, d), tw = a.upload(w, d), tb = a.upload(bias, d);
      Tensor dout = a.upload(r, d);
      Tensor out = a.zeros(ny, d), dx = a.zeros(nx, d);
      Tensor dw = a.upload(w, d), db = a.upload(bias, d);
      EXPECT_TRUE(ops.matmul_forward(out, tx, tw, k.layout, tb, k.rows, k.in, k.out, s).is_ok());
      EXPECT_TRUE(ops.matmul_backward(dx, Accumulate::kOverwrite, dw, db, dout, tx, tw, k.layout,
                                      k.rows, k.in, k.out, s).is_ok());
      return {{"out", a.download(out, ny)}, {"dx", a.download(dx, nx)},
              {"dweight", a.download(dw, nw)}, {"dbias", a.download(db, bias.size())}};
    }, static_cast<std::uint64_t>(300 + k.out));
  }
}

TEST_P(OpsCudaTest, Attention) {
  const DType d = dt();
  for (auto [b, t, c, h] : {std::tuple{2, 1, 6, 2}, std::tuple{1, 70, 12, 1},
                            std::tuple{2, 257, 768, 12}, std::tuple{1, 1024, 256, 4}}) {
    compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
      gpu::Stream& s = ops.device().compute_stream();
      const std::size_t nqkv = static_cast<std::size_t>(b) * t * 3 * c;
      const std::size_t nout = static_cast<std::size_t>(b) * t * c;
      const std::size_t nl = static_cast<std::size_t>(b) * h * t;
      Vec qkv = random_vector(g, nqkv, -1, 1), r = random_vector(g, nout, -1, 1);
      Tensor tq = a.upload(qkv, d), dout = a.upload(r, d);
      Tensor out = a.zeros(nout, d), dqkv = a.zeros(nqkv, d);
      float* lse = a.zeros_f32(nl);
      float* delta = a.zeros_f32(nl);
      EXPECT_TRUE(ops.attention_forward(out, lse, tq, b, t, c, h, s).is_ok());
      EXPECT_TRUE(ops.attention_backward(dqkv, Accumulate::kOverwrite, delta, dout, tq, out, lse,
                                         b, t, c, h, s).is_ok());
      return {{"out", a.download(out, nout)}, {"lse", a.download_f32(lse, nl)},
              {"dqkv", a.download(dqkv, nqkv)}};
    }, static_cast<std::uint64_t>(400 + t));
  }
}

TEST_P(OpsCudaTest, GeluAndResidual) {
  const DType d = dt();
  compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
    gpu::Stream& s = ops.device().compute_stream();
    const std::size_t n = 1024 * 3072 + 5;
    Vec x = random_vector(g, n, -6, 6), r = random_vector(g, n, -1, 1);
    Vec d0 = random_vector(g, n, -1, 1);
    Tensor tx = a.upload(x, d), dout = a.upload(r, d), dx = a.upload(d0, d);
    Tensor out = a.zeros(n, d), sum = a.zeros(n, d), da = a.upload(d0, d);
    const auto len = static_cast<std::int64_t>(n);
    EXPECT_TRUE(ops.gelu_forward(out, tx, len, s).is_ok());
    EXPECT_TRUE(ops.gelu_backward(dx, Accumulate::kAdd, dout, tx, len, s).is_ok());
    EXPECT_TRUE(ops.residual_forward(sum, tx, dout, len, s).is_ok());
    EXPECT_TRUE(ops.residual_backward(da, Accumulate::kAdd, Tensor{}, Accumulate::kOverwrite, dout,
                                      len, s).is_ok());
    return {{"gelu", a.download(out, n)}, {"gelu dx", a.download(dx, n)},
            {"residual", a.download(sum, n)}, {"residual da", a.download(da, n)}};
  }, 500);
}

TEST_P(OpsCudaTest, CrossEntropy) {
  const DType d = dt();
  for (auto [rows, v] : {std::pair{5, 37}, std::pair{64, 50257}}) {
    compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
      gpu::Stream& s = ops.device().compute_stream();
      const std::size_t n = static_cast<std::size_t>(rows) * v;
      Vec logits = random_vector(g, n, -5, 5);
      std::vector<std::int32_t> tgt(rows);
      for (auto& x : tgt) x = static_cast<std::int32_t>(g() % static_cast<std::uint64_t>(v));
      auto* dtg = a.upload_i32(tgt);
      Tensor tl = a.upload(logits, d);
      float* losses = a.zeros_f32(rows);
      float* losses2 = a.zeros_f32(rows);
      EXPECT_TRUE(ops.cross_entropy_forward(losses, tl, dtg, rows, v, s).is_ok());
      EXPECT_TRUE(
          ops.cross_entropy_backward(tl, losses2, tl, dtg, rows, v, 1.0f / rows, s).is_ok());
      return {{"losses", a.download_f32(losses, rows)}, {"fused losses", a.download_f32(losses2, rows)},
              {"dlogits in place", a.download(tl, n)}};
    }, static_cast<std::uint64_t>(600 + rows));
  }
}

// ---- the Llama family's ops ----

TEST_P(OpsCudaTest, EmbeddingWithoutPositions) {
  const DType d = dt();
  for (auto [b, t, c, v] : {std::tuple{2, 7, 13, 11}, std::tuple{2, 256, 2048, 32000}}) {
    compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
      gpu::Stream& s = ops.device().compute_stream();
      std::vector<std::int32_t> tok(static_cast<std::size_t>(b) * t);
      for (auto& x : tok) x = static_cast<std::int32_t>(g() % static_cast<std::uint64_t>(v / 3 + 1));
      Vec wte = random_vector(g, static_cast<std::size_t>(v) * c, -1, 1);
      Vec r = random_vector(g, tok.size() * c, -1, 1);
      auto* dtok = a.upload_i32(tok);
      Tensor twte = a.upload(wte, d), dout = a.upload(r, d), dwte = a.upload(wte, d);
      Tensor out = a.zeros(tok.size() * c, d);
      EXPECT_TRUE(ops.embedding_forward(out, dtok, twte, Tensor{nullptr, d}, b, t, c, v, s).is_ok());
      EXPECT_TRUE(
          ops.embedding_backward(dwte, Tensor{nullptr, d}, dout, dtok, b, t, c, v, s).is_ok());
      return {{"out", a.download(out, tok.size() * c)}, {"dwte", a.download(dwte, wte.size())}};
    }, static_cast<std::uint64_t>(700 + t));
  }
}

// The table in slices (vocabulary chunks) and the LM head's strided block copies.
TEST_P(OpsCudaTest, EmbeddingSlicesAndCopyBlock) {
  const DType d = dt();
  for (auto [b, t, c, v, first, rows] :
       {std::tuple{2, 7, 13, 11, 4, 5}, std::tuple{1, 64, 3072, 128256, 96192, 32064}}) {
    compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
      gpu::Stream& s = ops.device().compute_stream();
      std::vector<std::int32_t> tok(static_cast<std::size_t>(b) * t);
      for (auto& x : tok) x = static_cast<std::int32_t>(g() % static_cast<std::uint64_t>(v));
      tok[0] = first;  // at least one in the slice, twice
      tok[1] = first;
      Vec part = random_vector(g, static_cast<std::size_t>(rows) * c, -1, 1);
      Vec r = random_vector(g, tok.size() * c, -1, 1);
      Vec base = random_vector(g, tok.size() * c, -1, 1);
      auto* dtok = a.upload_i32(tok);
      Tensor tpart = a.upload(part, d), dout = a.upload(r, d), dpart = a.upload(part, d);
      Tensor out = a.upload(base, d);
      EXPECT_TRUE(ops.embedding_forward(out, dtok, tpart, Tensor{nullptr, d}, b, t, c, v, s, first,
                                        rows).is_ok());
      EXPECT_TRUE(ops.embedding_backward(dpart, Tensor{nullptr, d}, dout, dtok, b, t, c, v, s,
                                         first, rows).is_ok());
      // out's columns [3, 3 + 5) into a (rows, 5) block and back at column 1.
      const std::int64_t n = static_cast<std::int64_t>(tok.size());
      Tensor block = a.zeros(tok.size() * 5, d);
      const std::size_t es = dtype_size(d);
      EXPECT_TRUE(ops.copy_block(block, 5, Tensor{static_cast<std::byte*>(out.data) + 3 * es, d}, c,
                                 n, 5, s).is_ok());
      EXPECT_TRUE(ops.copy_block(Tensor{static_cast<std::byte*>(out.data) + es, d}, c, block, 5, n,
                                 5, s).is_ok());
      return {{"out", a.download(out, tok.size() * c)},
              {"dpart", a.download(dpart, part.size())},
              {"block", a.download(block, tok.size() * 5)}};
    }, static_cast<std::uint64_t>(750 + t));
  }
}

TEST_P(OpsCudaTest, RmsNorm) {
  const DType d = dt();
  for (auto [rows, dim] : {std::pair{7, 37}, std::pair{1024, 2048}, std::pair{4096, 128}}) {
    compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
      gpu::Stream& s = ops.device().compute_stream();
      const std::size_t n = static_cast<std::size_t>(rows) * dim;
      Vec x = random_vector(g, n, -2, 2), w = random_vector(g, dim, 0.5, 1.5);
      Vec r = random_vector(g, n, -1, 1), dx0 = random_vector(g, n, -1, 1);
      Tensor tx = a.upload(x, d), tw = a.upload(w, d), dout = a.upload(r, d);
      Tensor dx = a.upload(dx0, d), dw = a.upload(w, d);
      Tensor out = a.zeros(n, d);
      float* rstd = a.zeros_f32(rows);
      EXPECT_TRUE(ops.rmsnorm_forward(out, rstd, tx, tw, 1e-6f, rows, dim, s).is_ok());
      EXPECT_TRUE(ops.rmsnorm_backward(dx, Accumulate::kAdd, dw, dout, tx, tw, rstd, rows, dim, s)
                      .is_ok());
      return {{"out", a.download(out, n)}, {"rstd", a.download_f32(rstd, rows)},
              {"dx", a.download(dx, n)}, {"dweight", a.download(dw, dim)}};
    }, static_cast<std::uint64_t>(800 + rows));
  }
}

TEST_P(OpsCudaTest, RopeInsideFusedQkv) {
  const DType d = dt();
  // (batch, seq, q heads, kv heads, head_dim, pos_offset): Llama-3.2-1B-like rows; a decode row.
  for (auto [b, t, qh, kvh, hd, pos0] : {std::tuple{2, 9, 3, 1, 8, 5},
                                         std::tuple{2, 256, 32, 8, 64, 0},
                                         std::tuple{4, 1, 16, 8, 128, 4000}}) {
    compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
      gpu::Stream& s = ops.device().compute_stream();
      const int stride = (qh + 2 * kvh) * hd;
      const std::size_t n = static_cast<std::size_t>(b) * t * stride;
      Vec inv(hd / 2);
      for (int i = 0; i < hd / 2; ++i) inv[i] = std::pow(500000.0, -2.0 * i / hd);
      float* dinv = a.upload_f32(inv);
      Vec x = random_vector(g, n, -2, 2), r = random_vector(g, n, -1, 1);
      Tensor tx = a.upload(x, d), dx = a.upload(r, d);
      const std::size_t es = dtype_size(d);
      auto at = [&](Tensor base, std::size_t elems) {
        return Tensor{static_cast<char*>(base.data) + elems * es, d};
      };
      EXPECT_TRUE(ops.rope_forward(tx, dinv, b, t, qh, hd, stride, pos0, s).is_ok());
      EXPECT_TRUE(ops.rope_forward(at(tx, qh * hd), dinv, b, t, kvh, hd, stride, pos0, s).is_ok());
      EXPECT_TRUE(ops.rope_backward(dx, dinv, b, t, qh, hd, stride, pos0, s).is_ok());
      EXPECT_TRUE(
          ops.rope_backward(at(dx, qh * hd), dinv, b, t, kvh, hd, stride, pos0, s).is_ok());
      return {{"rope forward", a.download(tx, n)}, {"rope backward", a.download(dx, n)}};
    }, static_cast<std::uint64_t>(900 + t));
  }
}

TEST_P(OpsCudaTest, SwigluFused) {
  const DType d = dt();
  for (auto [rows, dim] : {std::pair{7, 37}, std::pair{1024, 8192}}) {
    compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
      gpu::Stream& s = ops.device().compute_stream();
      const std::size_t n_in = static_cast<std::size_t>(rows) * 2 * dim;
      const std::size_t n_out = static_cast<std::size_t>(rows) * dim;
      Vec in = random_vector(g, n_in, -6, 6), r = random_vector(g, n_out, -1, 1);
      Tensor tin = a.upload(in, d), dout = a.upload(r, d);
      Tensor out = a.zeros(n_out, d), dgu = a.zeros(n_in, d);
      const std::size_t es = dtype_size(d);
      const Tensor up{static_cast<char*>(tin.data) + dim * es, d};
      const Tensor dup{static_cast<char*>(dgu.data) + dim * es, d};
      EXPECT_TRUE(ops.swiglu_forward(out, tin, up, rows, dim, 2 * dim, s).is_ok());
      EXPECT_TRUE(ops.swiglu_backward(dgu, dup, dout, tin, up, rows, dim, 2 * dim, s).is_ok());
      return {{"swiglu", a.download(out, n_out)}, {"d[gate|up]", a.download(dgu, n_in)}};
    }, static_cast<std::uint64_t>(1000 + rows));
  }
}

TEST_P(OpsCudaTest, GqaAttention) {
  const DType d = dt();
  // (batch, seq, q heads, kv heads, head_dim): MHA, GQA with odd sizes, Llama-3.2-1B-like
  // (32 -> 8, 64), Qwen3-like head_dim 128 (16 -> 8), MQA past several tiles.
  for (auto [b, t, qh, kvh, hd] : {std::tuple{2, 1, 2, 2, 6}, std::tuple{1, 70, 6, 2, 12},
                                   std::tuple{2, 257, 32, 8, 64}, std::tuple{1, 300, 16, 8, 128},
                                   std::tuple{1, 1024, 4, 1, 32}}) {
    compare([=](Ops& ops, DeviceArrays& a, std::mt19937_64& g) -> Outputs {
      gpu::Stream& s = ops.device().compute_stream();
      const int stride = (qh + 2 * kvh) * hd;
      const std::size_t nqkv = static_cast<std::size_t>(b) * t * stride;
      const std::size_t nout = static_cast<std::size_t>(b) * t * qh * hd;
      const std::size_t nl = static_cast<std::size_t>(b) * qh * t;
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      Vec qkv = random_vector(g, nqkv, -1, 1), r = random_vector(g, nout, -1, 1);
      Vec d0 = random_vector(g, nqkv, -1, 1);
      Tensor tq = a.upload(qkv, d), dout = a.upload(r, d), dqkv = a.upload(d0, d);
      Tensor out = a.zeros(nout, d);
      float* lse = a.zeros_f32(nl);
      float* delta = a.zeros_f32(nl);
      const std::size_t es = dtype_size(d);
      auto at = [&](Tensor base, std::size_t elems) {
        return Tensor{static_cast<char*>(base.data) + elems * es, d};
      };
      const std::size_t ko = static_cast<std::size_t>(qh) * hd, vo = ko + kvh * hd;
      EXPECT_TRUE(ops.gqa_attention_forward(out, lse, tq, at(tq, ko), at(tq, vo), b, t, t, qh, kvh,
                                            hd, stride, stride, scale, s).is_ok());
      EXPECT_TRUE(ops.gqa_attention_backward(dqkv, at(dqkv, ko), at(dqkv, vo), Accumulate::kAdd,
                                             delta, dout, tq, at(tq, ko), at(tq, vo), out, lse, b,
                                             t, qh, kvh, hd, stride, stride, scale, s).is_ok());
      // One decode step over the first t - 1 positions as the cache plus the last one.
      Tensor out1 = a.zeros(static_cast<std::size_t>(qh) * hd, d);
      float* lse1 = a.zeros_f32(qh);
      EXPECT_TRUE(ops.gqa_attention_forward(out1, lse1, at(tq, (t - 1) * stride), at(tq, ko),
                                            at(tq, vo), 1, 1, t, qh, kvh, hd, stride, stride,
                                            scale, s).is_ok());
      return {{"out", a.download(out, nout)}, {"lse", a.download_f32(lse, nl)},
              {"dqkv", a.download(dqkv, nqkv)},
              {"decode out", a.download(out1, static_cast<std::size_t>(qh) * hd)},
              {"decode lse", a.download_f32(lse1, qh)}};
    }, static_cast<std::uint64_t>(1100 + t));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OpsCudaTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& p) {
                           return std::string(dtype_name(p.param));
                         });

// The CUDA backend's own bounds come through the same checks as every other argument.
TEST(OpsCudaErrors, RejectsWhatTheKernelsCannotTakeNamingIt) {
  auto cuda = gpu::create_cuda_device(0, 1ull << 30);
  if (!cuda.is_ok()) GTEST_SKIP() << "skipped: " << cuda.status().message();
  auto o = Ops::create(**cuda);
  ASSERT_TRUE(o.is_ok()) << o.status().message();
  Ops& ops = **o;
  gpu::Stream& s = (*cuda)->compute_stream();
  auto buf = (*cuda)->allocate(1 << 20);
  ASSERT_TRUE(buf.is_ok());
  const Tensor t{buf->data(), DType::kF32};
  float* f = static_cast<float*>(buf->data());
  Status st = ops.gqa_attention_forward(t, f, t, t, t, 1, 2, 2, 2, 1, 256, 512, 256, 0.1f, s);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("head_dim 256 exceeds this backend's 128"), std::string::npos)
      << st.message();
  st = ops.rmsnorm_forward(t, f, t, Tensor{buf->data(), DType::kBF16}, 1e-6f, 2, 4, s);
  EXPECT_NE(st.message().find("rmsnorm_forward: weight is bf16 but must be fp32"),
            std::string::npos) << st.message();
  st = ops.attention_forward(t, f, t, 1, 4, 512, 2, s);
  EXPECT_NE(st.message().find("head_dim 256 exceeds"), std::string::npos) << st.message();
  EXPECT_TRUE((*cuda)->synchronize().is_ok());
}

}  // namespace
}  // namespace tz::ops
