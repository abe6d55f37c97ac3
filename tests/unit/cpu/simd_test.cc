// Every compiled SIMD target the CPU supports against the scalar reference, bit for bit: the
// optimizer updates over all dtype combinations (with tails and special values) and the 16-bit
// conversions against core/dtype.h (exhaustive for 16-bit inputs, random and edge cases for
// fp32 inputs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/optimizer.h"
#include "cpu/simd.h"
#include "cpu/simd_kernels.h"
#include "test_util.h"

namespace tz::cpu::test {
namespace {

// Restores automatic dispatch when a test ends, whatever it forced.
struct AutoTarget {
  ~AutoTarget() { set_simd_target("auto").ignore(); }
};

std::vector<std::string> targets_to_test() {
  std::vector<std::string> out;
  for (const detail::KernelTable* t : detail::supported_simd_kernels()) out.emplace_back(t->name);
  return out;
}

TEST(SimdDispatch, ReportsTargets) {
  const std::vector<std::string> compiled = simd_targets_compiled();
  const std::vector<std::string> supported = simd_targets_supported();
  ASSERT_FALSE(supported.empty());
  // AVX2 and AVX-512 (Highway's AVX3) code paths are in the binary whatever this CPU is.
  EXPECT_NE(std::find(compiled.begin(), compiled.end(), "AVX2"), compiled.end());
  EXPECT_NE(std::find(compiled.begin(), compiled.end(), "AVX3"), compiled.end());
  EXPECT_NE(std::find(compiled.begin(), compiled.end(), "reference"), compiled.end());
  const std::string active = simd_dispatch_target();
  EXPECT_NE(std::find(compiled.begin(), compiled.end(), active), compiled.end()) << active;
  std::printf("dispatch: %s; compiled:", active.c_str());
  for (const auto& c : compiled) std::printf(" %s", c.c_str());
  std::printf("; CPU supports:");
  for (const auto& s : supported) std::printf(" %s", s.c_str());
  std::printf("\n");

  AutoTarget restore;
  EXPECT_EQ(set_simd_target("NEON_SVE_9000").code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(set_simd_target("reference").is_ok());
  EXPECT_EQ(simd_dispatch_target(), "reference");
  ASSERT_TRUE(set_simd_target("auto").is_ok());
  EXPECT_EQ(simd_dispatch_target(), active);
}

std::vector<float> conversion_inputs(std::mt19937_64& rng) {
  std::vector<float> in;
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(),
                  f32_from_bits(0x7f800001u) /* signalling NaN */, f32_from_bits(0xffbfffffu),
                  65504.0f, 65519.99f, 65520.0f, -65520.0f, 6.1035156e-05f /* fp16 min normal */,
                  5.9604645e-08f /* fp16 min subnormal */, 2.9802322e-08f /* 2^-25: ties to 0 */,
                  2.9802326e-08f, 1e-45f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::min(), 1.0f, 1.00390625f /* bf16 halfway */,
                  1.01171875f, -3.3895314e38f}) {
    in.push_back(x);
  }
  // Halfway and near-halfway patterns for both 16-bit formats, then random bit patterns.
  for (int i = 0; i < 4096; ++i) {
    const std::uint32_t hi = static_cast<std::uint32_t>(rng());
    in.push_back(f32_from_bits((hi & 0xffff0000u) | 0x8000u));
    in.push_back(f32_from_bits((hi & 0xffffe000u) | 0x1000u));
    in.push_back(f32_from_bits((hi & 0xffffe000u) | 0x0fffu));
  }
  for (int i = 0; i < 200000; ++i) in.push_back(f32_from_bits(static_cast<std::uint32_t>(rng())));
  // fp16 subnormal and overflow ranges, densely.
  for (std::uint32_t b = 0x33000000u - 64; b < 0x38800000u + 64; b += 997) {
    in.push_back(f32_from_bits(b));
    in.push_back(f32_from_bits(b | 0x80000000u));
  }
  for (std::uint32_t b = 0x477fe000u; b < 0x47800100u; ++b) in.push_back(f32_from_bits(b));
  in.push_back(1.5f);  // odd length: a tail
  return in;
}

TEST(SimdConversions, Fp32To16MatchesCoreBitForBit) {
  std::mt19937_64 rng(test_seed(1234));
  const std::vector<float> in = conversion_inputs(rng);
  AutoTarget restore;
  for (const std::string& target : targets_to_test()) {
    SCOPED_TRACE(target);
    ASSERT_TRUE(set_simd_target(target).is_ok());
    std::vector<std::uint16_t> out(in.size());
    convert_f32_to_16(in.data(), out.data(), DType::kBF16, in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(out[i], f32_to_bf16(in[i]).bits) << "bf16 of bits 0x" << std::hex
                                                 << f32_bits(in[i]);
    }
    convert_f32_to_16(in.data(), out.data(), DType::kF16, in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(out[i], f32_to_fp16(in[i]).bits) << "fp16 of bits 0x" << std::hex
                                                 << f32_bits(in[i]);
    }
  }
}

TEST(SimdConversions, SixteenBitToFp32ExhaustiveMatchesCore) {
  std::vector<std::uint16_t> all(65536 + 3);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  AutoTarget restore;
  for (const std::string& target : targets_to_test()) {
    SCOPED_TRACE(target);
    ASSERT_TRUE(set_simd_target(target).is_ok());
    std::vector<float> out(all.size());
    convert_16_to_f32(all.data(), DType::kBF16, out.data(), all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(f32_bits(out[i]), f32_bits(bf16_to_f32(bf16{all[i]}))) << "bf16 0x" << std::hex
                                                                       << all[i];
    }
    convert_16_to_f32(all.data(), DType::kF16, out.data(), all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(f32_bits(out[i]), f32_bits(fp16_to_f32(fp16{all[i]}))) << "fp16 0x" << std::hex
                                                                       << all[i];
    }
  }
}

struct SpecCase {
  const char* name;
  OptimizerSpec spec;
};

std::vector<SpecCase> spec_cases() {
  std::vector<SpecCase> out;
  out.push_back({"adamw", OptimizerSpec::adamw(1e-3, 0.01)});
  out.push_back({"adam_l2", OptimizerSpec::adam(1e-3, 0.01)});
  OptimizerSpec nobc = OptimizerSpec::adamw(1e-3, 0.0);
  nobc.bias_correction = false;
  out.push_back({"adamw_no_bias_correction", nobc});
  OptimizerSpec bf16_states = OptimizerSpec::adamw(1e-3, 0.01);
  bf16_states.state_dtype = DType::kBF16;
  out.push_back({"adamw_bf16_states", bf16_states});
  out.push_back({"sgd", OptimizerSpec::sgd(0.1)});
  OptimizerSpec sgd_m = OptimizerSpec::sgd(0.1, 0.9, true);
  sgd_m.weight_decay = 1e-4;
  out.push_back({"sgd_nesterov", sgd_m});
  OptimizerSpec sgd_d = OptimizerSpec::sgd(0.1, 0.9);
  sgd_d.dampening = 0.1;
  out.push_back({"sgd_dampening", sgd_d});
  out.push_back({"lion", OptimizerSpec::lion(1e-4, 0.1)});
  OptimizerSpec ada = OptimizerSpec::adagrad(1e-2, 0.01);
  ada.weight_decay = 1e-3;
  out.push_back({"adagrad", ada});
  return out;
}

// Fills a shard with random inputs that include the special values.
void fill(ShardBuffers& b, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t i = 0; i < b.n(); ++i) {
    b.param[i] = normal(rng);
    float g = random_grad(rng, GradClass::kMixed);
    if (i % 101 == 7) g = std::numeric_limits<float>::infinity();
    if (i % 103 == 5) g = std::numeric_limits<float>::quiet_NaN();
    b.set_grad(i, g);
    b.set_state(0, i, normal(rng) * 0.1f);
    b.set_state(1, i, std::fabs(normal(rng)) * 0.01f);
  }
}

// The optimizer step through each SIMD target equals reference_step (scalar loops over the
// functors) bit for bit, for every grad dtype, copy dtype and a range of lengths.
TEST(SimdOptimizers, EveryTargetMatchesScalarReferenceBitwise) {
  const std::uint64_t seed = test_seed(77);
  AutoTarget restore;
  const std::vector<std::string> targets = targets_to_test();
  int compared = 0;
  for (const SpecCase& sc : spec_cases()) {
    // One optimizer per spec: the SIMD table is looked up at each step, so it follows
    // set_simd_target (creating an arena per combination would dominate the test's time).
    OptimizerOptions o;
    o.threads = 1;
    Result<CpuOptimizer> opt = CpuOptimizer::create(sc.spec, o);
    ASSERT_TRUE(opt.is_ok());
    for (DType gd : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int copy = 0; copy < 3; ++copy) {
        for (std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{33},
                              std::size_t{1000}}) {
          SCOPED_TRACE(std::string(sc.name) + " grad=" + std::string(dtype_name(gd)) +
                       " copy=" + std::to_string(copy) + " n=" + std::to_string(n));
          const DType cd = copy == 2 ? DType::kF16 : DType::kBF16;
          std::mt19937_64 rng(seed + n);
          ShardBuffers ref(n, gd, sc.spec.state_dtype, cd);
          fill(ref, rng);
          StepArgs a;
          a.step = 3;
          a.grad_dtype = gd;
          a.copy_dtype = cd;
          a.grad_multiplier = 0.5f;
          for (const std::string& target : targets) {
            SCOPED_TRACE(target);
            ShardBuffers got = ref;
            ASSERT_TRUE(set_simd_target(target).is_ok());
            Shard s = got.shard(copy != 0);
            ASSERT_TRUE(opt->step({&s, 1}, a).is_ok());
            ShardBuffers want = ref;
            Shard w = want.shard(copy != 0);
            ASSERT_TRUE(reference_step(sc.spec, {&w, 1}, a).is_ok());
            ASSERT_EQ(0, std::memcmp(got.param.data(), want.param.data(), 4 * n)) << "param";
            ASSERT_EQ(got.state0, want.state0) << "state 0";
            ASSERT_EQ(got.state1, want.state1) << "state 1";
            if (copy != 0) {
              ASSERT_EQ(got.copy, want.copy) << "copy";
            }
            ++compared;
          }
        }
      }
    }
  }
  std::printf("compared %d target x case combinations bit for bit\n", compared);
}

// Adam's denominator sqrt(v) / sqrt(1 - beta2^t) + eps, whose division by the step's constant
// the kernels do by a reciprocal and a fused correction (div_by_constant), over second moments
// from subnormal to huge and every step from 1 to 300 for three beta2: bit for bit against the
// reference's division on every target, in fp32 and bf16 states.
TEST(SimdOptimizers, AdamDenominatorMatchesReferenceOverStepsAndScales) {
  AutoTarget restore;
  const std::vector<std::string> targets = targets_to_test();
  constexpr std::size_t n = 1024;
  int compared = 0;
  for (const float beta2 : {0.999f, 0.95f, 0.9999f}) {
    for (const DType sd : {DType::kF32, DType::kBF16}) {
      OptimizerSpec spec = OptimizerSpec::adamw(1e-3, 0.01);
      spec.beta2 = beta2;
      spec.state_dtype = sd;
      OptimizerOptions o;
      o.threads = 1;
      Result<CpuOptimizer> opt = CpuOptimizer::create(spec, o);
      ASSERT_TRUE(opt.is_ok());
      std::mt19937_64 rng(test_seed(31) + static_cast<std::uint64_t>(beta2 * 1e4));
      std::uniform_real_distribution<float> mant(1.0f, 2.0f);
      ShardBuffers ref(n, DType::kF32, sd, DType::kBF16);
      for (std::size_t i = 0; i < n; ++i) {
        ref.param[i] = mant(rng) - 1.5f;
        ref.set_grad(i, (mant(rng) - 1.5f) * std::ldexp(1.0f, static_cast<int>(i % 40) - 30));
        ref.set_state(0, i, (mant(rng) - 1.5f) * 1e-3f);
        // v from 2^-149 (subnormal) up to 2^100: sqrt(v) covers normal roots of every size.
        ref.set_state(1, i, std::ldexp(mant(rng), static_cast<int>(i % 250) - 149));
      }
      for (std::int64_t step = 1; step <= 300; ++step) {
        SCOPED_TRACE("beta2 " + std::to_string(beta2) + " states " + std::string(dtype_name(sd)) +
                     " step " + std::to_string(step));
        StepArgs a;
        a.step = step;
        a.grad_dtype = DType::kF32;
        for (const std::string& target : targets) {
          SCOPED_TRACE(target);
          ShardBuffers got = ref;
          ASSERT_TRUE(set_simd_target(target).is_ok());
          Shard s = got.shard(false);
          ASSERT_TRUE(opt->step({&s, 1}, a).is_ok());
          ShardBuffers want = ref;
          Shard w = want.shard(false);
          ASSERT_TRUE(reference_step(spec, {&w, 1}, a).is_ok());
          ASSERT_EQ(0, std::memcmp(got.param.data(), want.param.data(), 4 * n)) << "param";
          ASSERT_EQ(got.state1, want.state1) << "state 1";
          ++compared;
        }
      }
    }
  }
  std::printf("compared %d target x step x beta2 x state-dtype updates bit for bit\n", compared);
}

// The ceiling kernel (bench) moves the same bytes as an update and computes p + g per stream.
TEST(SimdStream, EveryTargetMatchesReference) {
  std::mt19937_64 rng(test_seed(5));
  constexpr std::size_t kN = 1003;
  for (const detail::KernelTable* table : detail::supported_simd_kernels()) {
    SCOPED_TRACE(table->name);
    ShardBuffers a(kN, DType::kBF16, DType::kF32, DType::kBF16);
    fill(a, rng);
    ShardBuffers b = a;
    detail::StreamKernel k;
    k.grad_dtype = DType::kBF16;
    detail::Tile ta{a.param.data(), a.grad.data(), {a.state0.data(), a.state1.data()},
                    a.copy.data(), kN};
    detail::Tile tb{b.param.data(), b.grad.data(), {b.state0.data(), b.state1.data()},
                    b.copy.data(), kN};
    table->stream(k, &ta, 1);
    detail::reference_kernels().stream(k, &tb, 1);
    ASSERT_EQ(0, std::memcmp(a.param.data(), b.param.data(), 4 * kN));
    ASSERT_EQ(a.state0, b.state0);
    ASSERT_EQ(a.copy, b.copy);
  }
}

}  // namespace
}  // namespace tz::cpu::test
