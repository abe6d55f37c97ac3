// The GPT-2 model through the real engine (stage 0, fp32, one HostDevice rank unless stated):
// the whole model's gradient against central finite differences of its own forward; activation
// checkpointing bit-identical to kept activations; a 2-layer model learning a repeating pattern;
// HF's initialisation; the input checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "model_harness.h"

namespace tz::model {
namespace {

using testing::random_ids;
using testing::random_weights;
using testing::read_weights;
using testing::Weights;
using testing::with_model;
using testing::write_weights;

constexpr std::uint64_t kSeed = 20261201;

// d(mean loss)/d(w) from one SGD step with lr 1 (w_before - w_after) against central differences
// (L(w + h) - L(w - h)) / 2h of the forward-only loss, for a sample of every tensor's elements.
// T = 5 is odd and below the model's 7 positions, heads = 2 with head_dim 4, vocab 11 is odd.
TEST(Gpt2Test, GradientMatchesCentralFiniteDifferences) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const std::string name = "gpt2:layers=2,heads=2,embd=8,vocab=11,seq=7";
  Gpt2Options options;
  options.micro_batch = 2;
  options.seq = 5;
  const Gpt2Shape shape = parse_model(name).value();
  const Weights w0 = random_weights(shape, kSeed);
  const std::vector<std::int32_t> tokens = random_ids(10, shape.vocab, kSeed + 1);
  const std::vector<std::int32_t> targets = random_ids(10, shape.vocab, kSeed + 2);
  int checked = 0;
  Status s = with_model(testing::config_json(testing::kSgd1), name, options,
                        [&](zero::Engine& engine, Gpt2& gpt) -> Status {
    TZ_RETURN_IF_ERROR(write_weights(engine, gpt, w0));
    TZ_ASSIGN_OR_RETURN(const double eval0, gpt.eval_loss(tokens, targets));
    // Finite differences first (the step below changes the weights).
    constexpr double kH = 1e-3;
    std::mt19937_64 pick(kSeed + 3);
    struct Probe {
      std::size_t u, t, i;
      double fd;
    };
    std::vector<Probe> probes;
    for (std::size_t u = 0; u < w0.size(); ++u) {
      for (std::size_t t = 0; t < w0[u].size(); ++t) {
        std::vector<float> v = w0[u][t];
        const std::size_t samples = std::min<std::size_t>(v.size(), 12);
        std::uniform_int_distribution<std::size_t> index(0, v.size() - 1);
        for (std::size_t k = 0; k < samples; ++k) {
          const std::size_t i = samples == v.size() ? k : index(pick);
          const float orig = v[i];
          v[i] = static_cast<float>(orig + kH);
          TZ_RETURN_IF_ERROR(engine.set_tensor(gpt.unit(u), t, v));
          TZ_ASSIGN_OR_RETURN(const double plus, gpt.eval_loss(tokens, targets));
          v[i] = static_cast<float>(orig - kH);
          TZ_RETURN_IF_ERROR(engine.set_tensor(gpt.unit(u), t, v));
          TZ_ASSIGN_OR_RETURN(const double minus, gpt.eval_loss(tokens, targets));
          v[i] = orig;
          // The perturbed values as fp32 stored them, for the exact step.
          const double step = static_cast<double>(static_cast<float>(orig + kH)) -
                              static_cast<double>(static_cast<float>(orig - kH));
          probes.push_back({u, t, i, (plus - minus) / step});
        }
        TZ_RETURN_IF_ERROR(engine.set_tensor(gpt.unit(u), t, v));
      }
    }
    TZ_ASSIGN_OR_RETURN(const double loss, gpt.train_micro_batch(tokens, targets));
    EXPECT_NEAR(loss, eval0, 1e-6 * std::abs(eval0)) << "train and eval forwards disagree";
    TZ_ASSIGN_OR_RETURN(const zero::StepReport report, engine.step());
    EXPECT_FALSE(report.skipped);
    TZ_ASSIGN_OR_RETURN(const Weights w1, read_weights(engine, gpt));
    const std::vector<zero::UnitSpec> specs = unit_specs(shape);
    double worst = 0;
    for (const Probe& p : probes) {
      const double g = static_cast<double>(w0[p.u][p.t][p.i]) - static_cast<double>(w1[p.u][p.t][p.i]);
      const double err = std::abs(g - p.fd);
      const double tol = 2e-4 + 1e-2 * std::abs(p.fd);
      worst = std::max(worst, err / tol);
      EXPECT_LE(err, tol) << specs[p.u].name << "." << specs[p.u].tensors[p.t].name << "[" << p.i
                          << "]: gradient " << g << ", finite difference " << p.fd;
      ++checked;
    }
    std::printf("%d gradients checked, worst error / tolerance %.3f\n", checked, worst);
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_GT(checked, 200);
}

// Recomputing each block in backward from its kept input gives the same bits as keeping every
// activation: same loss, same gradient (read as w_before - w_after of one SGD lr-1 step), also
// accumulated over two micro-batches.
TEST(Gpt2Test, CheckpointingGivesBitIdenticalGradients) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const std::string name = "gpt2:layers=3,heads=3,embd=24,vocab=13,seq=9";
  const Gpt2Shape shape = parse_model(name).value();
  const Weights w0 = random_weights(shape, kSeed);
  const std::vector<std::int32_t> tokens = random_ids(2 * 2 * 9, shape.vocab, kSeed + 1);
  const std::vector<std::int32_t> targets = random_ids(2 * 2 * 9, shape.vocab, kSeed + 2);
  Weights after[2];
  double losses[2][2] = {};
  for (int ckpt = 0; ckpt <= 1; ++ckpt) {
    Gpt2Options options;
    options.micro_batch = 2;
    options.checkpointing = ckpt;
    Status s = with_model(testing::config_json(testing::kSgd1, 0, false, 0.0, 2), name,
                          options, [&](zero::Engine& engine, Gpt2& gpt) -> Status {
      EXPECT_EQ(gpt.options().checkpointing, ckpt);
      TZ_RETURN_IF_ERROR(write_weights(engine, gpt, w0));
      for (int b = 0; b < 2; ++b) {
        const std::span<const std::int32_t> tok(tokens.data() + b * 18, 18);
        const std::span<const std::int32_t> tgt(targets.data() + b * 18, 18);
        TZ_ASSIGN_OR_RETURN(losses[ckpt][b], gpt.train_micro_batch(tok, tgt));
      }
      TZ_RETURN_IF_ERROR(engine.step().status());
      TZ_ASSIGN_OR_RETURN(after[ckpt], read_weights(engine, gpt));
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  EXPECT_EQ(std::memcmp(&losses[0], &losses[1], sizeof(losses[0])), 0);
  const std::vector<zero::UnitSpec> specs = unit_specs(shape);
  std::size_t changed = 0;
  for (std::size_t u = 0; u < w0.size(); ++u) {
    for (std::size_t t = 0; t < w0[u].size(); ++t) {
      ASSERT_EQ(std::memcmp(after[0][u][t].data(), after[1][u][t].data(),
                            after[0][u][t].size() * sizeof(float)),
                0)
          << specs[u].name << "." << specs[u].tensors[t].name;
      for (std::size_t i = 0; i < w0[u][t].size(); ++i) changed += after[0][u][t][i] != w0[u][t][i];
    }
  }
  EXPECT_GT(changed, shape.param_count() * 9 / 10) << "the gradient should reach nearly every weight";
}

// A 2-layer model learns a sequence repeating with period 7 in which one token (1) is followed
// by two different ones, so it needs attention to the token before: from log(16) = 2.77 to below
// 0.15 within 150 AdamW steps (measured: see docs/model.md).
TEST(Gpt2Test, LossFallsOnRepeatingPattern) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const std::string name = "gpt2:layers=2,heads=2,embd=32,vocab=16,seq=32";
  Gpt2Options options;
  options.micro_batch = 4;
  const std::vector<std::int32_t> pattern = {3, 1, 4, 1, 5, 9, 2};
  const std::string adam = "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.0}}";
  constexpr int kSteps = 150;
  constexpr double kTarget = 0.15;
  std::vector<double> curve;
  Status s = with_model(testing::config_json(adam, 0, false, 1.0), name, options,
                        [&](zero::Engine& engine, Gpt2& gpt) -> Status {
    (void)engine;
    TZ_RETURN_IF_ERROR(gpt.init_weights(kSeed));
    std::mt19937_64 rng(kSeed);
    std::uniform_int_distribution<std::size_t> offset(0, pattern.size() - 1);
    std::vector<std::int32_t> tokens(4 * 32), targets(4 * 32);
    for (int step = 0; step < kSteps; ++step) {
      for (int b = 0; b < 4; ++b) {
        const std::size_t o = offset(rng);
        for (std::size_t t = 0; t < 32; ++t) {
          tokens[static_cast<std::size_t>(b) * 32 + t] = pattern[(o + t) % pattern.size()];
          targets[static_cast<std::size_t>(b) * 32 + t] = pattern[(o + t + 1) % pattern.size()];
        }
      }
      TZ_ASSIGN_OR_RETURN(const double loss, gpt.train_micro_batch(tokens, targets));
      TZ_RETURN_IF_ERROR(engine.step().status());
      curve.push_back(loss);
    }
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  for (std::size_t i = 0; i < curve.size(); i += 25) std::printf("step %zu loss %.4f\n", i, curve[i]);
  std::printf("last loss %.4f\n", curve.back());
  EXPECT_NEAR(curve.front(), std::log(16.0), 0.3);
  EXPECT_LT(curve.back(), kTarget);
}

// HF's init: matrices and embeddings normal(0, 0.02), residual projections normal(0,
// 0.02/sqrt(2L)), biases 0, LayerNorm weights 1; seeded; the same for 1 rank and 2 ranks.
TEST(Gpt2Test, InitWeightsIsHfsAndSeeded) {
  const std::string name = "gpt2:layers=2,heads=4,embd=64,vocab=300,seq=64";
  const Gpt2Shape shape = parse_model(name).value();
  const auto init = [&](std::uint64_t seed, int ranks, int stage) {
    Weights w;
    std::uint64_t hash = 0;
    Status s = with_model(testing::config_json(testing::kSgd1, stage), name, {},
                          [&](zero::Engine& engine, Gpt2& gpt) -> Status {
      TZ_RETURN_IF_ERROR(gpt.init_weights(seed));
      TZ_ASSIGN_OR_RETURN(hash, engine.params_xxh3());
      if (engine.rank() == 0) {
        TZ_ASSIGN_OR_RETURN(w, read_weights(engine, gpt));
      } else {
        TZ_RETURN_IF_ERROR(read_weights(engine, gpt).status());
      }
      return Status::ok();
    }, ranks);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return std::make_pair(w, hash);
  };
  const auto [w, hash] = init(7, 1, 0);
  ASSERT_FALSE(w.empty());
  const std::vector<zero::UnitSpec> specs = unit_specs(shape);
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
      const std::string& tn = specs[u].tensors[t].name;
      const std::vector<float>& v = w[u][t];
      double sum = 0, sq = 0;
      for (float x : v) {
        sum += x;
        sq += static_cast<double>(x) * x;
      }
      const double n = static_cast<double>(v.size());
      const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
      if (tn.ends_with(".bias")) {
        EXPECT_EQ(sq, 0.0) << specs[u].name << "." << tn;
      } else if (tn.starts_with("ln_")) {
        EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 1.0f; })) << tn;
      } else {
        const double want = tn.ends_with("c_proj.weight") ? 0.02 / std::sqrt(4.0) : 0.02;
        // n >= 4096 samples: the sample sd is within 5% of sigma far beyond 3 standard errors.
        EXPECT_NEAR(sd, want, 0.05 * want) << specs[u].name << "." << tn;
        EXPECT_NEAR(mean, 0.0, 4 * want / std::sqrt(n)) << specs[u].name << "." << tn;
      }
    }
  }
  EXPECT_EQ(init(7, 1, 0).second, hash) << "same seed, same weights";
  EXPECT_NE(init(8, 1, 0).second, hash) << "another seed, other weights";
  EXPECT_EQ(init(7, 2, 3).second, hash) << "2 ranks at stage 3 hold the same weights as 1";
}

TEST(Gpt2Test, RejectsBadOptionsAndInputs) {
  const std::string name = "gpt2:layers=1,heads=1,embd=8,vocab=10,seq=6";
  Gpt2Options too_long;
  too_long.seq = 7;
  Status s = with_model(testing::config_json(testing::kSgd1), name, too_long,
                        [](zero::Engine&, Gpt2&) { return Status::ok(); });
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("seq 7"), std::string::npos) << s.message();

  Gpt2Options options;
  options.micro_batch = 1;
  s = with_model(testing::config_json(testing::kSgd1), name, options,
                 [](zero::Engine&, Gpt2& gpt) -> Status {
    TZ_RETURN_IF_ERROR(gpt.init_weights(1));
    std::vector<std::int32_t> ok(6, 3), bad(6, 3), short_batch(5, 3);
    bad[4] = 10;
    Status e = gpt.train_micro_batch(short_batch, short_batch).status();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(e.message().find("B*T"), std::string::npos) << e.message();
    e = gpt.eval_loss(ok, bad).status();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(e.message().find("targets[4] = 10"), std::string::npos) << e.message();
    e = gpt.last_logits(std::vector<std::int32_t>(7, 1)).status();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    e = gpt.last_logits({}).status();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    // The model still works after rejected calls, and last_logits is the last row of logits.
    TZ_ASSIGN_OR_RETURN(const std::vector<float> last, gpt.last_logits(std::span(ok).first(4)));
    TZ_ASSIGN_OR_RETURN(const std::vector<float> all, gpt.logits(std::span(ok).first(4), 1, 4));
    EXPECT_EQ(last.size(), 10u);
    for (std::size_t i = 0; i < 10; ++i) EXPECT_NEAR(last[i], all[30 + i], 1e-5 * (1 + std::abs(all[30 + i])));
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(Gpt2Test, ActivationBytesShrinkWithCheckpointing) {
  const Gpt2Shape shape = parse_model("gpt2-350m").value();
  Gpt2Options on, off;
  on.checkpointing = 1;
  off.checkpointing = 0;
  EXPECT_TRUE(checkpointing_enabled(shape, Gpt2Options{}));
  EXPECT_FALSE(checkpointing_enabled(parse_model("gpt2-124m").value(), Gpt2Options{}));
  const std::uint64_t with = Gpt2::activation_bytes(shape, on, DType::kBF16);
  const std::uint64_t without = Gpt2::activation_bytes(shape, off, DType::kBF16);
  // Without: per block 16 (B*T, C) tensors (input included); with: one input each plus one
  // block's 15 for the recompute. Both add the logits (B*T, V) and the backward's scratch.
  EXPECT_LT(with, without / 3);
  const std::uint64_t bt = 4 * 1024, c = 1024;
  EXPECT_GE(without, 24 * 16 * bt * c * 2);
  EXPECT_GE(with, bt * 50257 * 2);
}

}  // namespace
}  // namespace tz::model
