// The piece checksums step() takes of what it writes (Shard::*_sums, cpu::PieceSums): each
// equals XXH3-64 of that piece of the block as the step left it, padding past the shard
// included, for any piece size, tiling and thread count; asking for them changes no bit of the
// update; bad requests are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/xxhash.h"
#include "cpu/optimizer.h"
#include "test_util.h"

namespace tz::cpu::test {
namespace {

// One shard's blocks: each array is the start of a block `pad` bytes longer than the shard's
// elements, the padding random (it is hashed as it is).
struct Blocks {
  std::size_t n;
  DType state_dtype;
  std::vector<std::uint8_t> param, grad, state[2], copy;

  Blocks(std::size_t n_, DType s, std::size_t pad, std::mt19937_64& rng)
      : n(n_), state_dtype(s), param(n_ * 4 + pad), grad(n_ * 2), copy(n_ * 2 + pad) {
    for (auto& st : state) st.resize(n_ * dtype_size(s) + pad);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto* b : {&param, &state[0], &state[1], &copy}) {
      for (auto& x : *b) x = static_cast<std::uint8_t>(byte(rng));
    }
    for (std::size_t i = 0; i < n; ++i) {
      store_element(param.data(), DType::kF32, i, normal(rng));
      store_element(grad.data(), DType::kBF16, i, normal(rng));
      store_element(state[0].data(), s, i, normal(rng) * 0.1f);
      store_element(state[1].data(), s, i, std::fabs(normal(rng)) * 0.01f);
    }
  }
  Shard shard() {
    Shard sh;
    sh.param = reinterpret_cast<float*>(param.data());
    sh.grad = grad.data();
    sh.state[0] = state[0].data();
    sh.state[1] = state[1].data();
    sh.param_copy = copy.data();
    sh.n = n;
    return sh;
  }
  bool operator==(const Blocks& o) const {
    return param == o.param && state[0] == o.state[0] && state[1] == o.state[1] && copy == o.copy;
  }
};

// Sums asked for every array of every shard, `piece` bytes a piece.
struct Sums {
  std::vector<std::vector<std::uint64_t>> sums;  // per shard, 4 arrays
  void ask(Shard& s, Blocks& b, std::size_t piece) {
    auto one = [&](std::vector<std::uint8_t>& block) {
      sums.emplace_back((block.size() + piece - 1) / piece, 0);
      return PieceSums{sums.back().data(), block.size(), piece};
    };
    s.param_sums = one(b.param);
    s.state_sums[0] = one(b.state[0]);
    s.state_sums[1] = one(b.state[1]);
    s.copy_sums = one(b.copy);
  }
};

void expect_sums_of(const std::vector<std::uint8_t>& block, const std::vector<std::uint64_t>& sums,
                    std::size_t piece, const char* what) {
  for (std::size_t k = 0; k < sums.size(); ++k) {
    const std::size_t len = std::min(piece, block.size() - k * piece);
    ASSERT_EQ(sums[k], XXH3_64bits(block.data() + k * piece, len)) << what << " piece " << k;
  }
}

TEST(OptimizerSums, EachSumIsThePiecesHashAndTheUpdateIsUnchanged) {
  std::mt19937_64 rng(test_seed(31));
  const std::vector<std::size_t> sizes = {1, 5000, 70000, 300001};
  for (DType state_dtype : {DType::kF32, DType::kBF16}) {
    OptimizerSpec spec = OptimizerSpec::adamw(1e-3, 0.01);
    spec.state_dtype = state_dtype;
    std::vector<Blocks> start;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      start.emplace_back(sizes[i], state_dtype, 4096 * (i % 2), rng);
    }
    // 12 KiB pieces are no power of two: the fp32 and 16-bit arrays' pieces meet every 6144
    // elements.
    for (std::size_t piece : {std::size_t{4096}, std::size_t{12288}, std::size_t{1} << 20}) {
      for (auto [threads, tile] : {std::pair{1, 16384}, std::pair{2, 16384}, std::pair{7, 64}}) {
        SCOPED_TRACE(std::string(dtype_name(state_dtype)) + " piece " + std::to_string(piece) +
                     " threads " + std::to_string(threads) + " tile " + std::to_string(tile));
        OptimizerOptions o;
        o.threads = threads;
        o.tile_elems = static_cast<std::size_t>(tile);
        Result<CpuOptimizer> opt = CpuOptimizer::create(spec, o);
        ASSERT_TRUE(opt.is_ok()) << opt.status().to_string();
        std::vector<Blocks> plain = start, hashed = start;
        std::vector<Shard> plain_views, hashed_views;
        Sums sums;
        for (std::size_t i = 0; i < start.size(); ++i) {
          plain_views.push_back(plain[i].shard());
          hashed_views.push_back(hashed[i].shard());
          sums.ask(hashed_views.back(), hashed[i], piece);
        }
        StepArgs a;
        a.step = 3;
        a.grad_dtype = DType::kBF16;
        ASSERT_TRUE(opt->step(plain_views, a).is_ok());
        ASSERT_TRUE(opt->step(hashed_views, a).is_ok());
        for (std::size_t i = 0; i < start.size(); ++i) {
          ASSERT_FALSE(hashed[i] == start[i]);
          ASSERT_TRUE(hashed[i] == plain[i]) << "shard " << i << ": the sums changed the update";
          const std::vector<std::uint64_t>* s = &sums.sums[4 * i];
          expect_sums_of(hashed[i].param, s[0], piece, "param");
          expect_sums_of(hashed[i].state[0], s[1], piece, "state 0");
          expect_sums_of(hashed[i].state[1], s[2], piece, "state 1");
          expect_sums_of(hashed[i].copy, s[3], piece, "copy");
        }
      }
    }
  }
}

TEST(OptimizerSums, BadRequestsAreRefused) {
  std::mt19937_64 rng(test_seed(32));
  Result<CpuOptimizer> opt = CpuOptimizer::create(OptimizerSpec::adamw(), {});
  ASSERT_TRUE(opt.is_ok());
  Blocks b(1000, DType::kF32, 0, rng);
  std::vector<std::uint64_t> sums(64);
  StepArgs a;
  a.grad_dtype = DType::kBF16;
  auto refused = [&](Shard s, const char* why) {
    Status st = opt->step({&s, 1}, a);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << why;
    EXPECT_NE(st.to_string().find(why), std::string::npos) << st.to_string();
  };
  Shard s = b.shard();
  s.param_sums = {sums.data(), b.param.size(), 4098};
  refused(s, "piece_bytes must be a positive multiple");
  s = b.shard();
  s.state_sums[0] = {sums.data(), 100, 4096};
  refused(s, "block_bytes is smaller than the shard");
  s = b.shard();
  s.param_copy = nullptr;
  s.copy_sums = {sums.data(), b.copy.size(), 4096};
  refused(s, "sums of a missing param_copy");
  s = b.shard();
  s.n = 0;
  s.param_sums = {sums.data(), b.param.size(), 4096};
  refused(s, "sums of an empty shard");
  Result<CpuOptimizer> sgd = CpuOptimizer::create(OptimizerSpec::sgd(0.1), {});
  ASSERT_TRUE(sgd.is_ok());
  s = b.shard();
  s.state_sums[0] = {sums.data(), b.state[0].size(), 4096};
  Status st = sgd->step({&s, 1}, a);
  EXPECT_NE(st.to_string().find("sums of a state not kept"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace tz::cpu::test
