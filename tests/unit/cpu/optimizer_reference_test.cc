// Each optimizer against a float64 reference written from its paper's definition (not from our
// code): Adam/AdamW (Kingma & Ba; Loshchilov & Hutter), SGD with momentum and Nesterov
// (Sutskever et al., PyTorch's dampening), Lion (Chen et al.), Adagrad (Duchi et al.). The
// optimizer under test is the real CpuOptimizer (SIMD dispatch, two threads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/optimizer.h"
#include "test_util.h"

namespace tz::cpu::test {
namespace {

// The fp32 optimizer's hyperparameters are fp32 values: the reference uses the same (float)
// betas and eps, widened to double, and keeps lr and everything else in double.
double f(double x) { return static_cast<double>(static_cast<float>(x)); }

struct AdamRef {
  double lr, b1, b2, eps, wd;
  bool decoupled, bias_correction;
  // Kingma & Ba, Algorithm 1; AdamW per Loshchilov & Hutter (decay applied to p directly).
  void step(int t, double g, double& p, double& m, double& v) const {
    if (!decoupled && wd != 0) g += wd * p;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mhat = bias_correction ? m / (1 - std::pow(b1, t)) : m;
    const double vhat = bias_correction ? v / (1 - std::pow(b2, t)) : v;
    if (decoupled) p -= lr * wd * p;
    p -= lr * mhat / (std::sqrt(vhat) + eps);
  }
};

CpuOptimizer make(const OptimizerSpec& spec, int threads = 2) {
  OptimizerOptions o;
  o.threads = threads;
  o.tile_elems = 1024;  // several tiles even for small tests
  Result<CpuOptimizer> r = CpuOptimizer::create(spec, o);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return std::move(r).value();
}

struct AdamCase {
  const char* name;
  bool decoupled;
  bool bias_correction;
  double wd;
};

const AdamCase kAdamCases[] = {
    {"adamw", true, true, 0.01},
    {"adam_l2", false, true, 0.01},
    {"adamw_no_bias_correction", true, false, 0.1},
    {"adam_plain", false, true, 0.0},
};

// One step on random inputs of every gradient class: p within 2 ulp of the float64 result;
// m and v within 2 ulp plus the rounding of the two terms they sum (m's terms may cancel).
TEST(AdamReference, OneStepWithinTwoUlp) {
  const std::uint64_t seed = test_seed(42);
  std::mt19937_64 rng(seed);
  constexpr std::size_t kN = 3001;  // odd: exercises SIMD tails
  double worst_p = 0;
  double worst_update = 0;  // fraction of the update-dominated bound used
  for (const AdamCase& ac : kAdamCases) {
    OptimizerSpec spec =
        ac.decoupled ? OptimizerSpec::adamw(1e-3, ac.wd) : OptimizerSpec::adam(1e-3, ac.wd);
    spec.bias_correction = ac.bias_correction;
    CpuOptimizer opt = make(spec);
    for (DType gd : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int fresh = 0; fresh < 2; ++fresh) {
        for (int gc = 0; gc <= static_cast<int>(GradClass::kMixed); ++gc) {
          const GradClass cls = static_cast<GradClass>(gc);
          SCOPED_TRACE(std::string(ac.name) + " grad=" + std::string(dtype_name(gd)) +
                       " class=" + grad_class_name(cls) + (fresh ? " fresh" : " mid-training"));
          const int t = fresh ? 1 : 37;
          const float multiplier = gc % 2 == 0 ? 1.0f : 0.37f;
          ShardBuffers b(kN, gd, DType::kF32, DType::kBF16);
          std::normal_distribution<float> normal(0.0f, 1.0f);
          std::vector<double> p(kN), m(kN), v(kN), g(kN);
          for (std::size_t i = 0; i < kN; ++i) {
            b.param[i] = i % 97 == 0 ? 0.0f : normal(rng);
            p[i] = b.param[i];
            g[i] = static_cast<double>(b.set_grad(i, random_grad(rng, cls))) * multiplier;
            m[i] = fresh ? 0.0f : b.set_state(0, i, normal(rng) * 0.1f);
            v[i] = fresh ? 0.0f : b.set_state(1, i, std::fabs(normal(rng)) * 0.01f);
          }
          Shard s = b.shard(true);
          StepArgs a;
          a.step = t;
          a.grad_dtype = gd;
          a.grad_multiplier = multiplier;
          ASSERT_TRUE(opt.step({&s, 1}, a).is_ok());
          const AdamRef ref{1e-3, f(0.9), f(0.999), f(1e-8), ac.wd, ac.decoupled,
                            ac.bias_correction};
          for (std::size_t i = 0; i < kN; ++i) {
            const double m_old = m[i];
            const double p_old = p[i];
            const double v_old = v[i];
            ref.step(t, g[i], p[i], m[i], v[i]);
            if (std::isinf(g[i])) {  // an fp16 "huge" gradient overflowed to Inf: NaN in both
              ASSERT_TRUE(std::isnan(p[i]) && std::isnan(b.param[i])) << i;
              continue;
            }
            // The parameter is within 2 ulp whenever it dominates its update (|dp| <= |p|/8,
            // every element but those with p near 0). Where the update dominates, p is the
            // update itself, whose ~10 roundings (and the cancellation in m) are bounded here.
            const double p_decayed = ac.decoupled ? p_old * (1 - 1e-3 * ac.wd) : p_old;
            const double delta = std::fabs(p[i] - p_decayed);
            const double ep = ulp_error(b.param[i], p[i]);
            // Adam's L2 term is added to g in fp32 and may cancel with it: g's rounding is
            // relative to |g| + |wd p|, and m's and v's bounds below carry it.
            const double l2 = ac.decoupled ? 0.0 : ac.wd * p_old;
            const double g_abs = std::fabs(g[i]) + std::fabs(l2);
            const double g_eff = std::fabs(g[i] + l2);
            const double term = std::max(std::fabs(f(0.9) * m_old), g_abs * 0.1);
            if (8 * delta <= std::fabs(p[i])) {
              worst_p = std::max(worst_p, ep);
              ASSERT_LE(ep, 2.0) << "p at " << i << ": got " << b.param[i] << " want " << p[i];
            } else {
              // m may be an fp32 subnormal: its rounding is then absolute (half of 2^-149).
              const double m_err = std::ldexp(std::fabs(m[i]) + 8 * term, -24) + std::ldexp(1.0, -149);
              const double denom = delta > 0 ? std::fabs(m[i]) / delta : 0;  // = m / dp
              const double bound = std::ldexp(std::fabs(p[i]), -22) + std::ldexp(delta, -21) +
                                   (denom > 0 ? m_err / denom : 0) + std::ldexp(1.0, -148);
              worst_update = std::max(worst_update, std::fabs(b.param[i] - p[i]) / bound);
              ASSERT_LE(std::fabs(b.param[i] - p[i]), bound)
                  << "update-dominated p at " << i << ": got " << b.param[i] << " want " << p[i];
            }
            // m sums two rounded terms that may cancel: allow their rounding on top of 2 ulp.
            const double em = std::fabs(b.state_at(0, i) - m[i]);
            const double m_bound = 2.0 * (std::fabs(m[i]) + 4.0 * term) * std::ldexp(1.0, -24) +
                                   std::ldexp(1.0, -148);
            ASSERT_LE(em, m_bound) << "m at " << i;
            // v adds two non-negative terms; g itself carries the rounding of the multiplier
            // (and of the L2 term), squared: 3 ulp, absolute once g*g is an fp32 subnormal.
            const double v_bound =
                std::ldexp(6 * std::fabs(v[i]) + 2 * v_old + 0.004 * g_eff * g_abs, -24) +
                                   std::ldexp(1.0, -148);
            ASSERT_LE(std::fabs(b.state_at(1, i) - v[i]), v_bound) << "v at " << i;
            // The 16-bit copy is core's round-to-nearest-even of the fp32 result, bit for bit.
            bf16 c;
            std::memcpy(&c, b.copy.data() + 2 * i, 2);
            ASSERT_EQ(c.bits, f32_to_bf16(b.param[i]).bits) << "copy at " << i;
          }
        }
      }
    }
  }
  std::printf("worst p error after one step: %.3f ulp (param-dominated elements); %.3f of the "
              "bound where the update dominates\n", worst_p, worst_update);
}

// 100 steps with fresh gradients each step: the fp32 run tracks the float64 run. Errors of one
// ulp per step may accumulate, so the bound grows with the step count.
TEST(AdamReference, Tracks100Steps) {
  const std::uint64_t seed = test_seed(7);
  std::mt19937_64 rng(seed);
  constexpr std::size_t kN = 1500;
  constexpr int kSteps = 100;
  for (const AdamCase& ac : kAdamCases) {
    SCOPED_TRACE(ac.name);
    OptimizerSpec spec =
        ac.decoupled ? OptimizerSpec::adamw(1e-2, ac.wd) : OptimizerSpec::adam(1e-2, ac.wd);
    spec.bias_correction = ac.bias_correction;
    ShardBuffers b(kN, DType::kBF16, DType::kF32, DType::kBF16);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<double> p(kN), m(kN, 0.0), v(kN, 0.0);
    std::fill(b.state0.begin(), b.state0.end(), 0);
    std::fill(b.state1.begin(), b.state1.end(), 0);
    for (std::size_t i = 0; i < kN; ++i) p[i] = b.param[i] = normal(rng);
    CpuOptimizer opt = make(spec);
    const AdamRef ref{1e-2, f(0.9), f(0.999), f(1e-8), ac.wd, ac.decoupled, ac.bias_correction};
    for (int t = 1; t <= kSteps; ++t) {
      const float multiplier = 1.0f / 1024.0f;  // a loss scale of 1024, unscaled on the fly
      for (std::size_t i = 0; i < kN; ++i) {
        // A gradient with a drift so the moments and bias correction matter.
        const float g = b.set_grad(i, (normal(rng) + 0.5f * std::sin(0.1f * t)) * 1024.0f);
        ref.step(t, static_cast<double>(g) * multiplier, p[i], m[i], v[i]);
      }
      Shard s = b.shard(false);
      StepArgs a;
      a.step = t;
      a.grad_dtype = DType::kBF16;
      a.grad_multiplier = multiplier;
      ASSERT_TRUE(opt.step({&s, 1}, a).is_ok());
    }
    double worst = 0;
    for (std::size_t i = 0; i < kN; ++i) {
      const double err = std::fabs(b.param[i] - p[i]);
      worst = std::max(worst, err / (std::fabs(p[i]) + 1e-2));
      ASSERT_LE(err, 1e-5 * std::fabs(p[i]) + 1e-6) << "p at " << i;
      ASSERT_NEAR(b.state_at(0, i), m[i], 1e-5 * std::fabs(m[i]) + 1e-6) << "m at " << i;
      ASSERT_NEAR(b.state_at(1, i), v[i], 1e-5 * std::fabs(v[i]) + 1e-9) << "v at " << i;
    }
    std::printf("%s: worst relative p error after %d steps: %.3g\n", ac.name, kSteps, worst);
  }
}

// bf16 states: the update equals float64 Adam whose m and v are rounded to bf16 after each step.
TEST(AdamReference, Bf16StatesMatchRoundedReference) {
  const std::uint64_t seed = test_seed(11);
  std::mt19937_64 rng(seed);
  constexpr std::size_t kN = 2049;
  OptimizerSpec spec = OptimizerSpec::adamw(1e-3, 0.01);
  spec.state_dtype = DType::kBF16;
  ShardBuffers b(kN, DType::kF32, DType::kBF16, DType::kF16);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<double> p(kN), m(kN), v(kN), g(kN);
  for (std::size_t i = 0; i < kN; ++i) {
    // Parameters away from 0 so they dominate the update (the one-step test covers p near 0).
    const float x = normal(rng);
    p[i] = b.param[i] = std::copysign(0.25f + std::fabs(x), x);
    g[i] = b.set_grad(i, normal(rng));
    m[i] = b.set_state(0, i, normal(rng) * 0.1f);
    v[i] = b.set_state(1, i, std::fabs(normal(rng)) * 0.01f);
  }
  CpuOptimizer opt = make(spec);
  Shard s = b.shard(true);
  StepArgs a;
  a.step = 5;
  a.copy_dtype = DType::kF16;
  ASSERT_TRUE(opt.step({&s, 1}, a).is_ok());
  const AdamRef ref{1e-3, f(0.9), f(0.999), f(1e-8), 0.01, true, true};
  for (std::size_t i = 0; i < kN; ++i) {
    ref.step(5, g[i], p[i], m[i], v[i]);
    ASSERT_LE(ulp_error(b.param[i], p[i]), 2.0) << i;
    // The stored states are the bf16 rounding of (within 2 fp32 ulp of) the exact values.
    EXPECT_NEAR(b.state_at(0, i), m[i], std::fabs(m[i]) * std::ldexp(1.0, -8) + 1e-30) << i;
    EXPECT_NEAR(b.state_at(1, i), v[i], std::fabs(v[i]) * std::ldexp(1.0, -8) + 1e-30) << i;
    fp16 c;
    std::memcpy(&c, b.copy.data() + 2 * i, 2);
    ASSERT_EQ(c.bits, f32_to_fp16(b.param[i]).bits) << "fp16 copy at " << i;
  }
}

// The documented bf16-state trade-off (docs/optimizers.md): with beta2 = 0.999 a zero gradient
// cannot lower v (0.1 % is below half a bf16 spacing), with beta2 = 0.99 it can.
TEST(AdamReference, Bf16StatesCannotDecayVAtBeta2_0999) {
  for (double beta2 : {0.999, 0.99}) {
    OptimizerSpec spec = OptimizerSpec::adamw(1e-3, 0.0);
    spec.beta2 = beta2;
    spec.state_dtype = DType::kBF16;
    ShardBuffers b(64, DType::kF32, DType::kBF16, DType::kBF16);
    for (std::size_t i = 0; i < 64; ++i) {
      b.param[i] = 1.0f;
      b.set_grad(i, 0.0f);
      b.set_state(0, i, 0.0f);
      b.set_state(1, i, 1.0f + static_cast<float>(i) / 64.0f);
    }
    const ShardBuffers before = b;
    CpuOptimizer opt = make(spec);
    Shard s = b.shard(false);
    StepArgs a;
    a.step = 10;
    ASSERT_TRUE(opt.step({&s, 1}, a).is_ok());
    int lowered = 0;
    for (std::size_t i = 0; i < 64; ++i) lowered += b.state_at(1, i) < before.state_at(1, i);
    if (beta2 == 0.999) {
      EXPECT_EQ(lowered, 0) << "bf16 v decayed at beta2 = 0.999";
    } else {
      EXPECT_EQ(lowered, 64) << "bf16 v did not decay at beta2 = 0.99";
    }
  }
}

// SGD per PyTorch's definition: buf = g on the first step, then momentum * buf + (1 - damp) * g;
// Nesterov uses g + momentum * buf.
TEST(SgdReference, MomentumNesterovDampeningWeightDecay) {
  const std::uint64_t seed = test_seed(3);
  std::mt19937_64 rng(seed);
  struct Case {
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (const Case& c : {Case{0.0, 0.0, 0.0, false}, Case{0.9, 0.0, 1e-4, false},
                        Case{0.9, 0.0, 0.0, true}, Case{0.5, 0.3, 0.01, false}}) {
    SCOPED_TRACE("momentum=" + std::to_string(c.momentum) + " nesterov=" +
                 std::to_string(c.nesterov));
    constexpr std::size_t kN = 777;
    OptimizerSpec spec = OptimizerSpec::sgd(0.05, c.momentum, c.nesterov);
    spec.dampening = c.dampening;
    spec.weight_decay = c.wd;
    ShardBuffers b(kN, DType::kF32, DType::kF32, DType::kBF16);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<double> p(kN), buf(kN, 0.0);
    for (std::size_t i = 0; i < kN; ++i) p[i] = b.param[i] = normal(rng);
    CpuOptimizer opt = make(spec);
    const double mom = f(c.momentum);
    for (int t = 1; t <= 20; ++t) {
      for (std::size_t i = 0; i < kN; ++i) {
        double g = b.set_grad(i, normal(rng));
        g += f(c.wd) * p[i];
        if (c.momentum != 0) {
          buf[i] = t == 1 ? g : mom * buf[i] + f(1 - c.dampening) * g;
          g = c.nesterov ? g + mom * buf[i] : buf[i];
        }
        p[i] -= f(0.05) * g;
      }
      Shard s = b.shard(true);
      StepArgs a;
      a.step = t;
      ASSERT_TRUE(opt.step({&s, 1}, a).is_ok());
    }
    for (std::size_t i = 0; i < kN; ++i) {
      ASSERT_NEAR(b.param[i], p[i], 2e-6 * (std::fabs(p[i]) + 1)) << i;
      if (c.momentum != 0) {
        ASSERT_NEAR(b.state_at(0, i), buf[i], 2e-6 * (std::fabs(buf[i]) + 1));
      }
    }
  }
}

// Lion (Chen et al. 2023, Program 1): c = b1 m + (1 - b1) g; p -= lr (sign(c) + wd p);
// m = b2 m + (1 - b2) g.
TEST(LionReference, TenSteps) {
  const std::uint64_t seed = test_seed(5);
  std::mt19937_64 rng(seed);
  constexpr std::size_t kN = 1025;
  const double lr = 1e-3, wd = 0.1;
  OptimizerSpec spec = OptimizerSpec::lion(lr, wd);
  ShardBuffers b(kN, DType::kF16, DType::kF32, DType::kBF16);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<double> p(kN), m(kN, 0.0);
  std::fill(b.state0.begin(), b.state0.end(), 0);
  for (std::size_t i = 0; i < kN; ++i) p[i] = b.param[i] = normal(rng);
  CpuOptimizer opt = make(spec);
  const double b1 = f(0.9), b2 = f(0.99);
  for (int t = 1; t <= 10; ++t) {
    for (std::size_t i = 0; i < kN; ++i) {
      const double g = b.set_grad(i, normal(rng));
      const double c = b1 * m[i] + (1 - b1) * g;
      const double sign = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
      p[i] -= lr * (sign + wd * p[i]);
      m[i] = b2 * m[i] + (1 - b2) * g;
    }
    Shard s = b.shard(false);
    StepArgs a;
    a.step = t;
    a.grad_dtype = DType::kF16;
    ASSERT_TRUE(opt.step({&s, 1}, a).is_ok());
  }
  for (std::size_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(b.param[i], p[i], 1e-6 * (std::fabs(p[i]) + 1)) << i;
    ASSERT_NEAR(b.state_at(0, i), m[i], 1e-6 * std::fabs(m[i]) + 2e-8) << i;
  }
}

// Adagrad (Duchi et al. 2011, PyTorch's lr decay): s += g^2; p -= clr g / (sqrt(s) + eps),
// clr = lr / (1 + (t - 1) lr_decay).
TEST(AdagradReference, TenStepsWithLrDecay) {
  const std::uint64_t seed = test_seed(9);
  std::mt19937_64 rng(seed);
  constexpr std::size_t kN = 999;
  const double lr = 0.1, lr_decay = 0.01, wd = 1e-3;
  OptimizerSpec spec = OptimizerSpec::adagrad(lr, lr_decay);
  spec.weight_decay = wd;
  ShardBuffers b(kN, DType::kF32, DType::kF32, DType::kBF16);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<double> p(kN), sum(kN);
  for (std::size_t i = 0; i < kN; ++i) {
    p[i] = b.param[i] = normal(rng);
    sum[i] = b.set_state(0, i, 0.1f);  // initial accumulator value
  }
  CpuOptimizer opt = make(spec);
  for (int t = 1; t <= 10; ++t) {
    const double clr = lr / (1 + (t - 1) * lr_decay);
    for (std::size_t i = 0; i < kN; ++i) {
      double g = b.set_grad(i, normal(rng));
      g += f(wd) * p[i];
      sum[i] += g * g;
      p[i] -= clr * g / (std::sqrt(sum[i]) + f(1e-10));
    }
    Shard s = b.shard(false);
    StepArgs a;
    a.step = t;
    ASSERT_TRUE(opt.step({&s, 1}, a).is_ok());
  }
  for (std::size_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(b.param[i], p[i], 2e-6 * (std::fabs(p[i]) + 1)) << i;
    ASSERT_NEAR(b.state_at(0, i), sum[i], 2e-6 * sum[i]) << i;
  }
}

TEST(OptimizerValidation, RejectsBadArguments) {
  OptimizerSpec bad = OptimizerSpec::adamw();
  bad.beta1 = 1.0;
  EXPECT_EQ(CpuOptimizer::create(bad, {}).status().code(), ErrorCode::kInvalidArgument);
  OptimizerSpec lion_bf16 = OptimizerSpec::lion();
  lion_bf16.state_dtype = DType::kBF16;
  EXPECT_EQ(CpuOptimizer::create(lion_bf16, {}).status().code(), ErrorCode::kInvalidArgument);
  OptimizerSpec nesterov = OptimizerSpec::sgd(0.1, 0.0, true);
  EXPECT_EQ(CpuOptimizer::create(nesterov, {}).status().code(), ErrorCode::kInvalidArgument);

  CpuOptimizer opt = make(OptimizerSpec::adamw());
  ShardBuffers b(8, DType::kF32, DType::kF32, DType::kBF16);
  Shard s = b.shard(false);
  StepArgs a;
  a.step = 0;
  EXPECT_EQ(opt.step({&s, 1}, a).code(), ErrorCode::kInvalidArgument);
  a.step = 1;
  s.state[1] = nullptr;
  const Status st = opt.step({&s, 1}, a);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("shard 0"), std::string::npos) << st.message();
}

TEST(OptimizerConfig, MapsDeepSpeedKeys) {
  Config c;
  c.optimizer.type = "AdamW";
  c.optimizer.lr = 3e-4;
  c.optimizer.betas = {0.8, 0.95};
  c.optimizer.weight_decay = 0.1;
  c.tierzero.state_dtype = "bf16";
  Result<OptimizerSpec> s = spec_from_config(c);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->kind, OptimizerKind::kAdam);
  EXPECT_TRUE(s->decoupled_weight_decay);
  EXPECT_EQ(s->beta2, 0.95);
  EXPECT_EQ(s->state_dtype, DType::kBF16);
  c.optimizer.type = "Adafactor";
  EXPECT_EQ(spec_from_config(c).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace tz::cpu::test
