// The model tests' harness for the Llama family (llama_test.cc, lora_test.cc, vocab_chunks_test.cc)
// beside the families' common one (model_harness.h): a ModelDesc from a config.json, AdamW, a tiny
// model on the real engine (ranks as threads).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/config.h"
#include "llama_reference.h"
#include "model_harness.h"
#include "model/factory.h"
#include "model/llama.h"
#include "zero/engine.h"

namespace tz::model::testing {

inline ModelDesc desc_of(const nlohmann::json& j, const char* name) {
  Result<LlamaConfig> c = llama_config_from_json(j, name);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  ModelDesc d;
  d.name = name;
  d.family = "llama";
  d.vocab = c->vocab;
  d.seq = c->positions;
  d.arch = *c;
  return d;
}

// A tiny Llama in which every module's shape differs: GQA (2 heads over 1 KV head), q/k/v/o and
// MLP biases, an untied head; hidden 16, head_dim 8, FFN 24, vocabulary 19, 16 positions.
inline nlohmann::json tiny_untied_llama() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 19,
    "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10.0,
    "attention_bias": true, "mlp_bias": true, "tie_word_embeddings": false})");
}

inline const char* const kAdamW =
    "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}";

using NetFn = std::function<Status(zero::Engine&, Model&)>;

inline Status with_net(const std::string& config, const ModelDesc& desc,
                       const ModelOptions& options, const NetFn& fn, int ranks = 1,
                       std::uint64_t seed = zero::EngineOptions{}.seed) {
  ConfigLoad load = load_config_text(config);
  if (!load.ok()) return load.status();
  zero::EngineOptions eo;
  eo.config = load.config;
  eo.activation_bytes = activation_bytes(desc, options, DType::kF32);
  eo.seed = seed;
  return zero::run_local_ranks(ranks, 256u << 20, [&](int, gpu::Device& dev, comm::Comm& comm) {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine, zero::Engine::create(eo, dev, comm));
    ModelOptions o = options;
    o.cpu_threads = 1;
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<Model> net, create_model(desc, o, *engine));
    TZ_RETURN_IF_ERROR(engine->finalize());
    return fn(*engine, *net);
  });
}

// One SGD lr-1 step of `tokens` against `targets` from the weights w0: the evaluated and the
// trained loss each within 2e-6 relative of the reference's `ref_loss`; the trained loss and the
// weights after the step (w0 - w1 is the gradient).
struct SgdStep {
  double loss = 0;
  Weights w1;
};
inline Result<SgdStep> sgd1_step(zero::Engine& engine, Model& net, const Weights& w0,
                                 std::span<const std::int32_t> tokens,
                                 std::span<const std::int32_t> targets, double ref_loss) {
  TZ_RETURN_IF_ERROR(write_weights(engine, net, w0));
  TZ_ASSIGN_OR_RETURN(const double eval, net.eval_loss(tokens, targets));
  EXPECT_NEAR(eval, ref_loss, 2e-6 * ref_loss);
  TZ_ASSIGN_OR_RETURN(const double loss, net.train_micro_batch(tokens, targets));
  EXPECT_NEAR(loss, ref_loss, 2e-6 * ref_loss);
  TZ_RETURN_IF_ERROR(engine.step().status());
  TZ_ASSIGN_OR_RETURN(Weights w1, read_weights(engine, net));
  return SgdStep{loss, std::move(w1)};
}

// The engine's gradient `g` of element i of the reference's tensor `name` against the central
// difference (h 1e-5) of the reference's loss on B x T tokens: |g - fd| <= 1e-5 + 2e-3 |fd|.
// Returns |g - fd| / tolerance.
inline double expect_gradient_matches(Reference& ref, const std::vector<std::int32_t>& tokens,
                                      const std::vector<std::int32_t>& targets, int B, int T,
                                      const std::string& name, std::size_t i, double g) {
  std::vector<double>& values = ref.p[name];
  constexpr double kH = 1e-5;
  const double orig = values[i];
  values[i] = orig + kH;
  const double plus = ref.loss(tokens, targets, B, T);
  values[i] = orig - kH;
  const double minus = ref.loss(tokens, targets, B, T);
  values[i] = orig;
  const double fd = (plus - minus) / (2 * kH);
  const double tol = 1e-5 + 2e-3 * std::abs(fd);
  EXPECT_LE(std::abs(g - fd), tol) << name << "[" << i << "]: gradient " << g << ", reference "
                                   << fd;
  return std::abs(g - fd) / tol;
}

// Rank 0's side of three AdamW steps with clipping (0.5) on micro-batches of 2 sequences of 6
// tokens, from init_weights(seed), the tokens and targets drawn from seed + 4 and seed + 5;
// `engine_seed` is the engine's (LoRA's init and dropout draw on it).
struct ThreeSteps {
  std::vector<double> losses;
  std::uint64_t init_hash = 0;  // params_xxh3 as initialised
  std::uint64_t hash = 0;       // params_xxh3 after the steps
};

inline ThreeSteps three_steps(const ModelDesc& desc, int stage, int ranks, int ckpt,
                              std::uint64_t seed, std::uint64_t engine_seed) {
  const std::vector<std::int32_t> tokens = random_ids(3 * 2 * 6, desc.vocab, seed + 4);
  const std::vector<std::int32_t> targets = random_ids(3 * 2 * 6, desc.vocab, seed + 5);
  ModelOptions o;
  o.micro_batch = 2;
  o.seq = 6;
  o.checkpointing = ckpt;
  ThreeSteps out;
  const Status s = with_net(config_json(kAdamW, stage, false, 0.5), desc, o,
                            [&](zero::Engine& engine, Model& net) -> Status {
    TZ_RETURN_IF_ERROR(net.init_weights(seed));
    TZ_ASSIGN_OR_RETURN(const std::uint64_t h_init, engine.params_xxh3());
    std::vector<double> mine;
    for (int step = 0; step < 3; ++step) {
      const std::span<const std::int32_t> tok(tokens.data() + step * 12, 12);
      const std::span<const std::int32_t> tgt(targets.data() + step * 12, 12);
      TZ_ASSIGN_OR_RETURN(const double l, net.train_micro_batch(tok, tgt));
      mine.push_back(l);
      TZ_RETURN_IF_ERROR(engine.step().status());
    }
    TZ_ASSIGN_OR_RETURN(const std::uint64_t h, engine.params_xxh3());
    if (engine.rank() == 0) out = ThreeSteps{mine, h_init, h};
    return Status::ok();
  }, ranks, engine_seed);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

// Stage 0 on one rank, stage 3 on two (each rank the same micro-batch, so the mean gradient is
// the one rank's) and stage 0 with checkpointing: identical losses and final weights over
// three_steps. Returns stage 0's run.
inline ThreeSteps expect_stage3_and_checkpointing_give_stage0s(const ModelDesc& desc,
                                                               std::uint64_t seed,
                                                               std::uint64_t engine_seed) {
  const ThreeSteps s0 = three_steps(desc, 0, 1, 0, seed, engine_seed);
  const ThreeSteps s3 = three_steps(desc, 3, 2, 0, seed, engine_seed);
  const ThreeSteps ck = three_steps(desc, 0, 1, 1, seed, engine_seed);
  EXPECT_EQ(s0.losses.size(), 3u);
  EXPECT_EQ(s0.losses, s3.losses);
  EXPECT_EQ(s0.losses, ck.losses);
  EXPECT_EQ(s0.hash, s3.hash);
  EXPECT_EQ(s0.hash, ck.hash);
  return s0;
}

}  // namespace tz::model::testing
