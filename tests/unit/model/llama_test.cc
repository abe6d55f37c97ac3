// The Llama family: config.json parsing (both rope forms, every refusal), the llama3 rotary
// frequencies against an independent computation, tiny Llama / Qwen2 / Qwen3 models through the
// real engine against a float64 reference written here (loss) and its central finite differences
// (gradients), stage 0 against stage 3, checkpointing, and KV-cache decoding against full
// forwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "model/factory.h"
#include "model/llama.h"
#include "model/sampling.h"
#include "zero/engine.h"

#include "llama_harness.h"
#include "llama_reference.h"

namespace tz::model {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace): the shared harness

constexpr std::uint64_t kSeed = 20261203;


// --- Configs ---------------------------------------------------------------------------------

// Llama with GQA (2 heads over 1 KV head), q/k/v/o and MLP biases, untied head, llama3 rope
// scaling whose three frequency bands each hold one of head_dim 8's four frequencies (theta 10:
// wavelengths 6.3, 11.2, 19.9, 35.3 against 32/4 = 8 and 32/1 = 32).
nlohmann::json tiny_llama() {
  nlohmann::json j = tiny_untied_llama();
  j["rope_scaling"] = nlohmann::json::parse(R"({"rope_type": "llama3", "factor": 4.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32})");
  return j;
}
// Qwen2: q/k/v biases (no o bias), GQA 4 over 2, tied head.
nlohmann::json tiny_qwen2() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "hidden_size": 16, "intermediate_size": 20, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 17,
    "max_position_embeddings": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "use_sliding_window": false, "sliding_window": 4, "tie_word_embeddings": true})");
}
// Qwen3 in transformers 5's form (rope_parameters): q/k norms, head_dim 12 != 16 / 2, tied.
nlohmann::json tiny_qwen3() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
    "hidden_size": 16, "intermediate_size": 20, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 12, "vocab_size": 13,
    "max_position_embeddings": 16, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0},
    "attention_bias": false, "tie_word_embeddings": true})");
}

using testing::Reference;  // the float64 reference (llama_reference.h)

// --- Config parsing --------------------------------------------------------------------------

TEST(LlamaConfigTest, BothRopeFormsGiveTheSameModel) {
  nlohmann::json top = tiny_llama();
  nlohmann::json v5 = tiny_llama();
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "llama3"},         {"rope_theta", 10.0},
                           {"factor", 4.0},                 {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},       {"original_max_position_embeddings", 32}};
  const LlamaConfig a = llama_config_from_json(top, "top").value();
  const LlamaConfig b = llama_config_from_json(v5, "v5").value();
  ASSERT_TRUE(a.rope_llama3 && b.rope_llama3);
  EXPECT_EQ(a.rope_theta, 10.0);
  EXPECT_EQ(b.rope_theta, 10.0);
  EXPECT_EQ(rope_inv_freq(a), rope_inv_freq(b));
  // The older "type" key of rope_scaling.
  nlohmann::json old = tiny_llama();
  old["rope_scaling"].erase("rope_type");
  old["rope_scaling"]["type"] = "llama3";
  EXPECT_EQ(rope_inv_freq(llama_config_from_json(old, "old").value()), rope_inv_freq(a));
  EXPECT_EQ(a.kv_heads, 1);
  EXPECT_TRUE(a.qkv_bias && a.o_bias && a.mlp_bias && !a.qk_norm && !a.tie_word_embeddings);
  const LlamaConfig q2 = llama_config_from_json(tiny_qwen2(), "q2").value();
  EXPECT_TRUE(q2.qkv_bias && !q2.o_bias && !q2.mlp_bias && q2.tie_word_embeddings);
  EXPECT_FALSE(q2.sliding_window) << "use_sliding_window false: no window";
  const LlamaConfig q3 = llama_config_from_json(tiny_qwen3(), "q3").value();
  EXPECT_TRUE(q3.qk_norm && !q3.qkv_bias && q3.head_dim == 12 && q3.rope_theta == 1000.0);
}

// Each refusal is one line naming the key and its value.
TEST(LlamaConfigTest, RefusesWhatItDoesNotCompute) {
  struct Case {
    std::function<void(nlohmann::json&)> change;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& j) { j["architectures"] = {"GemmaForCausalLM"}; },
       {"'architectures'", "GemmaForCausalLM"}},
      {[](nlohmann::json& j) { j["model_type"] = "mistral"; }, {"'model_type'", "mistral"}},
      {[](nlohmann::json& j) { j["hidden_act"] = "gelu"; }, {"'hidden_act'", "gelu"}},
      {[](nlohmann::json& j) { j["rope_scaling"]["rope_type"] = "yarn"; },
       {"'rope_scaling.rope_type'", "yarn"}},
      {[](nlohmann::json& j) {
         j.erase("rope_scaling");
         j["rope_parameters"] = {{"rope_type", "dynamic"}, {"rope_theta", 10.0}, {"factor", 2.0}};
       },
       {"'rope_parameters.rope_type'", "dynamic"}},
      {[](nlohmann::json& j) { j["rope_scaling"].erase("factor"); }, {"'rope_scaling.factor'"}},
      {[](nlohmann::json& j) { j["num_key_value_heads"] = 3; }, {"'num_key_value_heads'", "3"}},
      {[](nlohmann::json& j) { j["head_dim"] = 7; }, {"'head_dim'", "7"}},
      {[](nlohmann::json& j) { j.erase("hidden_size"); }, {"'hidden_size'", "missing"}},
      {[](nlohmann::json& j) { j["attention_dropout"] = 0.1; }, {"'attention_dropout'", "0.1"}},
  };
  for (const Case& c : cases) {
    nlohmann::json j = tiny_llama();
    c.change(j);
    const Result<LlamaConfig> r = llama_config_from_json(j, "dir/config.json");
    ASSERT_FALSE(r.is_ok()) << j.dump();
    const std::string msg = r.status().message();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("dir/config.json"), std::string::npos) << msg;
    for (const std::string& w : c.want) EXPECT_NE(msg.find(w), std::string::npos) << msg;
  }
}

// Mistral's sliding window applies whenever set: shorter than the sequence is refused at create.
TEST(LlamaConfigTest, RefusesASlidingWindowShorterThanTheSequence) {
  nlohmann::json j = tiny_llama();
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["sliding_window"] = 4;
  const ModelDesc desc = desc_of(j, "mistral");
  ASSERT_TRUE(std::get<LlamaConfig>(desc.arch).sliding_window);
  ModelOptions o;
  o.micro_batch = 1;
  o.seq = 8;
  const Status s = with_net(config_json(kSgd1, 0), desc, o,
                            [](zero::Engine&, Model&) { return Status::ok(); });
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("'sliding_window' is 4"), std::string::npos) << s.message();
  o.seq = 4;
  EXPECT_TRUE(with_net(config_json(kSgd1, 0), desc, o,
                       [](zero::Engine&, Model&) { return Status::ok(); })
                  .is_ok());
}

TEST(LlamaConfigTest, PresetsAndCustomShapes) {
  // Parameter counts of the published models (embedding and untied head included).
  EXPECT_EQ(parse_llama_model("llama-3.2-1b")->param_count(), 1235814400u);
  EXPECT_EQ(parse_llama_model("llama-3.2-3b")->param_count(), 3212749824u);
  EXPECT_EQ(parse_llama_model("llama-3.1-8b")->param_count(), 8030261248u);
  EXPECT_EQ(parse_llama_model("qwen3-0.6b")->param_count(), 596049920u);
  EXPECT_EQ(parse_llama_model("mistral-7b")->param_count(), 7248023552u);
  const LlamaConfig c =
      parse_llama_model("llama:layers=2,heads=4,kv_heads=2,embd=32,ffn=64,vocab=100,seq=64").value();
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.kv_heads, 2);
  EXPECT_EQ(parse_llama_model("gpt2-124m").status().code(), ErrorCode::kNotFound);
  const Status bad = parse_llama_model("llama:layers=2,heads=4").status();
  EXPECT_NE(bad.message().find("'kv_heads' is missing"), std::string::npos) << bad.message();
  EXPECT_TRUE(resolve_model("qwen3-4b").is_ok());
  EXPECT_EQ(resolve_model("qwen3-4b")->family, "llama");
  EXPECT_EQ(resolve_model("gpt2-124m")->family, "gpt2");
}

// llama3 scaling against the torch.where formulation computed here: the published Llama 3.1
// config (every band populated) and the tiny one (one frequency in each band).
TEST(LlamaConfigTest, Llama3InvFreqMatchesAnIndependentComputation) {
  for (const LlamaConfig& c : {parse_llama_model("llama-3.1-8b").value(),
                               llama_config_from_json(tiny_llama(), "tiny").value()}) {
    const std::vector<double> want = Reference(c, {}, {}).inv_freq();
    const std::vector<float> got = rope_inv_freq(c);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-6 * want[i]) << c.name << " i=" << i;
    }
  }
  // Spot values of the published config: the highest frequency is unscaled, the lowest divided
  // by the factor 8.
  const std::vector<float> f = rope_inv_freq(parse_llama_model("llama-3.1-8b").value());
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[63], std::pow(500000.0, -126.0 / 128) / 8, 1e-12);
}

// --- Forward and backward through the engine -------------------------------------------------

struct Family {
  const char* name;
  nlohmann::json (*config)();
};
const Family kFamilies[] = {{"llama", tiny_llama}, {"qwen2", tiny_qwen2}, {"qwen3", tiny_qwen3}};

// The loss of B=2 sequences of T=5 against the float64 reference; d(loss)/d(w) from one SGD lr-1
// step against central differences of the reference.
TEST(LlamaTest, LossAndGradientsMatchAFloat64Reference) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  for (const Family& fam : kFamilies) {
    SCOPED_TRACE(fam.name);
    const ModelDesc desc = desc_of(fam.config(), fam.name);
    const LlamaConfig& c = std::get<LlamaConfig>(desc.arch);
    const std::vector<zero::UnitSpec> specs = unit_specs(c);
    const Weights w0 = random_weights(specs, kSeed);
    constexpr int kB = 2, kT = 5;
    const std::vector<std::int32_t> tokens = random_ids(kB * kT, c.vocab, kSeed + 1);
    const std::vector<std::int32_t> targets = random_ids(kB * kT, c.vocab, kSeed + 2);
    Reference ref(c, specs, w0);
    const double ref_loss = ref.loss(tokens, targets, kB, kT);
    ModelOptions o;
    o.micro_batch = kB;
    o.seq = kT;
    int checked = 0;
    const Status s = with_net(config_json(kSgd1, 0), desc, o, [&](zero::Engine& engine, Model& net) -> Status {
      TZ_ASSIGN_OR_RETURN(const SgdStep step, sgd1_step(engine, net, w0, tokens, targets, ref_loss));
      std::mt19937_64 pick(kSeed + 3);
      double worst = 0;
      for (std::size_t u = 0; u < specs.size(); ++u) {
        for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
          const std::string& tn = specs[u].tensors[t].name;
          const std::size_t n = ref.p[tn].size(), samples = std::min<std::size_t>(n, 6);
          std::uniform_int_distribution<std::size_t> index(0, n - 1);
          for (std::size_t k = 0; k < samples; ++k) {
            const std::size_t i = samples == n ? k : index(pick);
            const double g =
                static_cast<double>(w0[u][t][i]) - static_cast<double>(step.w1[u][t][i]);
            worst = std::max(worst, expect_gradient_matches(ref, tokens, targets, kB, kT, tn, i, g));
            ++checked;
          }
        }
      }
      std::printf("%s: loss %.9f (reference %.9f), %d gradients, worst error/tolerance %.3f\n",
                  fam.name, step.loss, ref_loss, checked, worst);
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_GT(checked, 60);
  }
}

// Stage 0 on one rank and stage 3 on two (each rank the same micro-batch, so the mean gradient is
// the one rank's), with checkpointing on and off: identical losses and final weights over three
// AdamW steps with clipping.
TEST(LlamaTest, Stage3AndCheckpointingGiveStage0sLossesAndWeights) {
  for (const Family& fam : kFamilies) {
    SCOPED_TRACE(fam.name);
    const ModelDesc desc = desc_of(fam.config(), fam.name);
    const ThreeSteps s0 =
        expect_stage3_and_checkpointing_give_stage0s(desc, kSeed, zero::EngineOptions{}.seed);
    ASSERT_EQ(s0.losses.size(), 3u);
    EXPECT_LT(s0.losses[2], s0.losses[0]) << "the loss falls";
    EXPECT_NE(s0.hash, s0.init_hash) << "the steps changed the weights";
  }
}

// transformers' init: Linear weights and the embedding normal(0, initializer_range), biases 0,
// norm weights 1.
TEST(LlamaTest, InitWeightsIsTransformers) {
  nlohmann::json j = tiny_llama();
  j["hidden_size"] = 64;
  j["intermediate_size"] = 96;
  j["initializer_range"] = 0.05;
  const ModelDesc desc = desc_of(j, "init");
  ModelOptions o;
  o.micro_batch = 1;
  o.seq = 4;
  const Status s = with_net(config_json(kSgd1, 0), desc, o, [&](zero::Engine& engine, Model& net) -> Status {
    TZ_RETURN_IF_ERROR(net.init_weights(3));
    TZ_ASSIGN_OR_RETURN(const Weights w, read_weights(engine, net));
    const std::vector<zero::UnitSpec>& specs = net.unit_specs();
    for (std::size_t u = 0; u < specs.size(); ++u) {
      for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
        const std::string& tn = specs[u].tensors[t].name;
        const std::vector<float>& v = w[u][t];
        double sum = 0, sq = 0;
        for (const float x : v) {
          sum += x;
          sq += static_cast<double>(x) * x;
        }
        const double n = static_cast<double>(v.size());
        if (tn.ends_with(".bias")) {
          EXPECT_EQ(sq, 0.0) << tn;
        } else if (tn.ends_with("norm.weight")) {
          EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 1.0f; })) << tn;
        } else {
          const double sd = std::sqrt(sq / n - (sum / n) * (sum / n));
          EXPECT_NEAR(sd, 0.05, 0.1 * 0.05) << tn;
        }
      }
    }
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
}

// Decoding over the key/value cache gives the logits full forwards give, token by token, and
// greedy generation with the cache equals generation by full forwards.
TEST(LlamaTest, KvCacheDecodingMatchesFullForwards) {
  for (const Family& fam : kFamilies) {
    SCOPED_TRACE(fam.name);
    const ModelDesc desc = desc_of(fam.config(), fam.name);
    const std::vector<std::int32_t> seq = random_ids(12, desc.vocab, kSeed + 6);
    ModelOptions o;
    o.micro_batch = 1;
    o.seq = 12;
    const Status s = with_net(config_json(kSgd1, 0), desc, o, [&](zero::Engine& engine, Model& net) -> Status {
      TZ_RETURN_IF_ERROR(write_weights(engine, net, random_weights(net.unit_specs(), kSeed)));
      EXPECT_TRUE(net.has_kv_cache());
      TZ_ASSIGN_OR_RETURN(std::vector<float> got,
                          net.decode(std::span(seq).subspan(0, 4), /*start_over=*/true));
      for (std::size_t n = 4; n <= seq.size(); ++n) {
        TZ_ASSIGN_OR_RETURN(const std::vector<float> want, net.last_logits(std::span(seq).subspan(0, n)));
        EXPECT_EQ(got.size(), want.size());
        for (std::size_t i = 0; i < want.size(); ++i) {
          EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << "prefix " << n << " id " << i;
        }
        if (n < seq.size()) {
          TZ_ASSIGN_OR_RETURN(got, net.decode(std::span(seq).subspan(n, 1), /*start_over=*/false));
        }
      }
      // Past the cache: refused, naming the positions.
      const Status full = net.decode(std::span(seq).subspan(0, 1), false).status();
      EXPECT_FALSE(full.is_ok());
      // Greedy with the cache against greedy by full forwards.
      TZ_ASSIGN_OR_RETURN(const std::vector<std::int32_t> cached,
                          generate(net, std::span(seq).subspan(0, 3), 9, SamplingOptions{0.0, 0, 1}));
      std::vector<std::int32_t> context(seq.begin(), seq.begin() + 3);
      for (int i = 0; i < 9; ++i) {
        TZ_ASSIGN_OR_RETURN(const std::vector<float> l, net.last_logits(context));
        context.push_back(static_cast<std::int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
      }
      EXPECT_EQ(cached, std::vector<std::int32_t>(context.begin() + 3, context.end()));
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
}

}  // namespace
}  // namespace tz::model
