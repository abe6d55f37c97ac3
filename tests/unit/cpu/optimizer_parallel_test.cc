// Parallel and tensor-list behaviour of CpuOptimizer: bitwise identical results for 1, 2 and 7
// threads and any tile size, and a step over a list of shards equal to one step per shard.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cpu/optimizer.h"
#include "test_util.h"

namespace tz::cpu::test {
namespace {

// A parameter group: shards of very different sizes, including empty and one-element ones.
struct Group {
  std::vector<ShardBuffers> shards;
  Group(const std::vector<std::size_t>& sizes, DType g, DType s, std::mt19937_64& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t n : sizes) {
      ShardBuffers b(n, g, s, DType::kBF16);
      for (std::size_t i = 0; i < n; ++i) {
        b.param[i] = normal(rng);
        b.set_grad(i, random_grad(rng, GradClass::kMixed));
        b.set_state(0, i, normal(rng) * 0.1f);
        b.set_state(1, i, std::fabs(normal(rng)) * 0.01f);
      }
      shards.push_back(std::move(b));
    }
  }
  std::vector<Shard> views() {
    std::vector<Shard> out;
    for (std::size_t i = 0; i < shards.size(); ++i) out.push_back(shards[i].shard(i % 2 == 0));
    return out;
  }
  bool operator==(const Group& o) const {
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const ShardBuffers& a = shards[i];
      const ShardBuffers& b = o.shards[i];
      if (a.n() != 0 && std::memcmp(a.param.data(), b.param.data(), 4 * a.n()) != 0) return false;
      if (a.state0 != b.state0 || a.state1 != b.state1 || a.copy != b.copy) return false;
    }
    return true;
  }
};

const std::vector<std::size_t> kSizes = {0, 1, 3, 64, 100, 4096, 5000, 20011, 7, 70000};

Group run(const Group& start, const OptimizerSpec& spec, int threads, std::size_t tile,
          DType grad_dtype, int steps) {
  Group g = start;
  OptimizerOptions o;
  o.threads = threads;
  o.tile_elems = tile;
  Result<CpuOptimizer> opt = CpuOptimizer::create(spec, o);
  EXPECT_TRUE(opt.is_ok()) << opt.status().to_string();
  EXPECT_EQ(opt->threads(), threads);
  std::vector<Shard> views = g.views();
  for (int t = 1; t <= steps; ++t) {
    StepArgs a;
    a.step = t;
    a.grad_dtype = grad_dtype;
    a.grad_multiplier = 0.25f;
    EXPECT_TRUE(opt->step(views, a).is_ok());
  }
  return g;
}

TEST(OptimizerParallel, BitwiseIdenticalFor1_2_7ThreadsAndAnyTiling) {
  std::mt19937_64 rng(test_seed(2024));
  for (OptimizerSpec spec : {OptimizerSpec::adamw(1e-3, 0.01), OptimizerSpec::lion(1e-4, 0.1),
                             OptimizerSpec::sgd(0.1, 0.9)}) {
    SCOPED_TRACE(std::string(optimizer_kind_name(spec.kind)));
    const Group start(kSizes, DType::kBF16, DType::kF32, rng);
    const Group one = run(start, spec, 1, 16384, DType::kBF16, 3);
    EXPECT_FALSE(one == start);  // the step changed something
    EXPECT_TRUE(run(start, spec, 2, 16384, DType::kBF16, 3) == one) << "2 threads";
    EXPECT_TRUE(run(start, spec, 7, 16384, DType::kBF16, 3) == one) << "7 threads";
    EXPECT_TRUE(run(start, spec, 7, 64, DType::kBF16, 3) == one) << "7 threads, 64-element tiles";
    EXPECT_TRUE(run(start, spec, 2, 1 << 20, DType::kBF16, 3) == one) << "one tile per shard";
  }
}

TEST(OptimizerParallel, TensorListStepEqualsPerTensorSteps) {
  std::mt19937_64 rng(test_seed(99));
  OptimizerSpec spec = OptimizerSpec::adamw(1e-3, 0.01);
  spec.state_dtype = DType::kBF16;
  const Group start(kSizes, DType::kF16, DType::kBF16, rng);
  const Group listed = run(start, spec, 2, 4096, DType::kF16, 2);

  Group each = start;
  OptimizerOptions o;
  o.threads = 2;
  o.tile_elems = 4096;
  Result<CpuOptimizer> opt = CpuOptimizer::create(spec, o);
  ASSERT_TRUE(opt.is_ok());
  std::vector<Shard> views = each.views();
  for (int t = 1; t <= 2; ++t) {
    for (const Shard& s : views) {
      StepArgs a;
      a.step = t;
      a.grad_dtype = DType::kF16;
      a.grad_multiplier = 0.25f;
      ASSERT_TRUE(opt->step({&s, 1}, a).is_ok());
    }
  }
  EXPECT_TRUE(each == listed);

  // And the list through the SIMD kernels (runs of tiles with and without a copy in one call)
  // equals the scalar reference, bit for bit.
  Group ref = start;
  std::vector<Shard> ref_views = ref.views();
  for (int t = 1; t <= 2; ++t) {
    StepArgs a;
    a.step = t;
    a.grad_dtype = DType::kF16;
    a.grad_multiplier = 0.25f;
    ASSERT_TRUE(reference_step(spec, ref_views, a).is_ok());
  }
  EXPECT_TRUE(ref == listed);
}

TEST(OptimizerParallel, TrafficBytesPerElement) {
  // The accounting: fp32 Adam 28 bytes; bf16 gradient + bf16 copy 28; fp32 + bf16 copy 30.
  EXPECT_EQ(traffic_bytes_per_element(OptimizerSpec::adamw(), DType::kF32, false, DType::kBF16),
            28u);
  EXPECT_EQ(traffic_bytes_per_element(OptimizerSpec::adamw(), DType::kBF16, true, DType::kBF16),
            28u);
  OptimizerSpec bf16_states = OptimizerSpec::adamw();
  bf16_states.state_dtype = DType::kBF16;
  EXPECT_EQ(traffic_bytes_per_element(bf16_states, DType::kBF16, true, DType::kBF16), 20u);
  EXPECT_EQ(traffic_bytes_per_element(OptimizerSpec::sgd(0.1), DType::kF32, false, DType::kBF16),
            12u);
}

}  // namespace
}  // namespace tz::cpu::test
