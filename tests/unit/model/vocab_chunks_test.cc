// The Llama family's vocabulary chunks (model/llama.h, llama_vocab_chunks): the rule against
// published shapes (counts derived here from their sizes), and tiny models forced to 3 chunks of a
// vocabulary 3 does not divide, tied and untied, against the same models as one unit: the same
// initial weights, the same losses and updated weights over 3 AdamW steps on stage 0 and on stage 3
// with 2 ranks, the same logits and cached decoding, the same Hugging Face folder byte for byte,
// a folder loaded across the chunks read back bit for bit, and LoRA on a chunked frozen base (its
// losses, and its merged folder byte for byte).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/factory.h"
#include "model/hf_folder.h"
#include "model/llama.h"
#include "model/lora.h"
#include "zero/engine.h"

#include "llama_harness.h"

namespace tz::model {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace): the shared harness

constexpr std::uint64_t kSeed = 20261204;

// Untied Llama (GQA, biases) with vocab 19 = 7 + 7 + 5.
nlohmann::json untied_llama() { return tiny_untied_llama(); }
// Tied Qwen2 (q/k/v biases) with vocab 17 = 6 + 6 + 5.
nlohmann::json tied_qwen2() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "hidden_size": 16, "intermediate_size": 20, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 17,
    "max_position_embeddings": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": true})");
}

ModelDesc with_chunks(ModelDesc desc, int chunks) {
  std::get<LlamaConfig>(desc.arch).vocab_chunks = chunks;
  return desc;
}

// Every HF tensor of the model whole (split ones joined), by name.
Result<std::map<std::string, std::vector<float>>> whole_weights(zero::Engine& engine,
                                                                const Model& net) {
  TZ_ASSIGN_OR_RETURN(const Weights w, read_weights(engine, net));
  std::map<std::string, std::vector<float>> out;
  for (const HfTensor& t : hf_tensors(net.unit_specs())) {
    std::vector<float>& v = out[t.name];
    for (const HfTensorPart& p : t.parts) {
      v.insert(v.end(), w[p.unit][p.tensor].begin(), w[p.unit][p.tensor].end());
    }
  }
  return out;
}

// Sets every HF tensor of the model from `whole` (split ones by their parts' rows).
Status set_whole_weights(zero::Engine& engine, const Model& net,
                         const std::map<std::string, std::vector<float>>& whole) {
  for (const HfTensor& t : hf_tensors(net.unit_specs())) {
    for (const HfTensorPart& p : t.parts) {
      const std::vector<float>& v = whole.at(t.name);
      TZ_RETURN_IF_ERROR(engine.set_tensor(
          net.unit(p.unit), p.tensor,
          std::span<const float>(v).subspan(p.first_elem, p.numel)));
    }
  }
  return Status::ok();
}

// |got - want| <= rel * (|want| + the tensor's RMS): fp32 rounding of sums taken in another order,
// relative to the tensor's scale.
void expect_near_rel(const std::vector<float>& got, const std::vector<float>& want, double rel,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double sq = 0;
  for (const float x : want) sq += static_cast<double>(x) * x;
  const double rms = std::sqrt(sq / static_cast<double>(want.size()));
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * (rms + std::abs(want[i]))) << what << " [" << i << "]";
  }
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(VocabChunksTest, RuleOnPublishedShapes) {
  // llama-3.2-3b: a layer is q 3072x3072, k and v 1024x3072, o 3072x3072, MLP 3 x 8192x3072 and
  // two norms = 100,669,440 parameters = 32,770 rows of 3072, so 128,256 rows take 4 chunks of
  // 32,064; the embedding (394 M) is 3.9 layers.
  const LlamaConfig l3b = parse_llama_model("llama-3.2-3b").value();
  EXPECT_EQ(l3b.layer_param_count(), 100669440u);
  const VocabChunks c3b = llama_vocab_chunks(l3b);
  EXPECT_EQ(c3b.count, 4);
  EXPECT_EQ(c3b.rows, 32064);
  const std::vector<zero::UnitSpec> specs = unit_specs(l3b);
  ASSERT_EQ(specs.size(), 4u + 28u + 1u);  // tied: no lm_head units
  std::int64_t rows = 0;
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(specs[static_cast<std::size_t>(c)].name, "embed." + std::to_string(c));
    EXPECT_LE(specs[static_cast<std::size_t>(c)].tensors[0].numel(), l3b.layer_param_count());
    rows += specs[static_cast<std::size_t>(c)].tensors[0].shape[0];
  }
  EXPECT_EQ(rows, 128256);
  // llama-3.1-8b, untied: layer 218,112,000 = 53,250 rows of 4096; 128,256 rows in 3 chunks, the
  // head too.
  const LlamaConfig l8b = parse_llama_model("llama-3.1-8b").value();
  EXPECT_EQ(llama_vocab_chunks(l8b).count, 3);
  const std::vector<zero::UnitSpec> s8 = unit_specs(l8b);
  EXPECT_EQ(s8.back().name, "lm_head.2");
  EXPECT_EQ(s8[3 + 32].name, "norm");
  EXPECT_EQ(s8[3 + 32].tensors.size(), 1u);
  // Small embeddings stay one unit: bench/llama_vs_hf.sh's speed shape (24.6 M, under 64 Mi
  // parameters though 4x its layer) and a tiny model.
  const LlamaConfig speed =
      parse_llama_model("llama:layers=12,heads=12,kv_heads=4,embd=768,ffn=2048,vocab=32000,seq=256")
          .value();
  EXPECT_EQ(llama_vocab_chunks(speed).count, 1);
  EXPECT_EQ(unit_specs(speed).front().name, "embed");
  const ModelDesc tiny = desc_of(untied_llama(), "tiny");
  EXPECT_EQ(llama_vocab_chunks(std::get<LlamaConfig>(tiny.arch)).count, 1);
  // Forced: 3 chunks of 19 rows are 7, 7, 5; more chunks than rows are as many as rows.
  const VocabChunks forced = llama_vocab_chunks(std::get<LlamaConfig>(with_chunks(tiny, 3).arch));
  EXPECT_EQ(forced.count, 3);
  EXPECT_EQ(forced.rows, 7);
  EXPECT_EQ(forced.size(2, 19), 5);
  EXPECT_EQ(llama_vocab_chunks(std::get<LlamaConfig>(with_chunks(tiny, 40).arch)).count, 19);
  EXPECT_EQ(llama_vocab_chunks(std::get<LlamaConfig>(with_chunks(tiny, 10).arch)).count, 10);
}

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> initial, trained;
  std::vector<float> logits, decoded;
};

// init_weights (kept), then `start`'s weights and 3 AdamW steps with clipping (2 sequences of 6
// tokens), the weights after, then the logits of a batch and the last logits of cached decoding.
RunResult train(const ModelDesc& desc, int stage, int ranks,
                const std::map<std::string, std::vector<float>>& start) {
  const std::vector<std::int32_t> tokens = random_ids(3 * 12, desc.vocab, kSeed + 1);
  const std::vector<std::int32_t> targets = random_ids(3 * 12, desc.vocab, kSeed + 2);
  ModelOptions o;
  o.micro_batch = 2;
  o.seq = 6;
  RunResult out;
  const Status s = with_net(config_json(kAdamW, stage, false, 0.5), desc, o,
                            [&](zero::Engine& engine, Model& net) -> Status {
    TZ_RETURN_IF_ERROR(net.init_weights(kSeed));
    TZ_ASSIGN_OR_RETURN(auto initial, whole_weights(engine, net));
    TZ_RETURN_IF_ERROR(set_whole_weights(engine, net, start));
    std::vector<double> losses;
    for (int step = 0; step < 3; ++step) {
      TZ_ASSIGN_OR_RETURN(const double l,
                          net.train_micro_batch(std::span(tokens).subspan(step * 12, 12),
                                                std::span(targets).subspan(step * 12, 12)));
      losses.push_back(l);
      TZ_RETURN_IF_ERROR(engine.step().status());
    }
    TZ_ASSIGN_OR_RETURN(auto trained, whole_weights(engine, net));
    TZ_ASSIGN_OR_RETURN(std::vector<float> logits,
                        net.logits(std::span(tokens).subspan(0, 12), 2, 6));
    TZ_ASSIGN_OR_RETURN(std::vector<float> decoded,
                        net.decode(std::span(tokens).subspan(0, 5), /*start_over=*/true));
    TZ_ASSIGN_OR_RETURN(decoded, net.decode(std::span(tokens).subspan(5, 1), false));
    if (engine.rank() == 0) {
      out = RunResult{losses, std::move(initial), std::move(trained), std::move(logits),
                std::move(decoded)};
    }
    return Status::ok();
  }, ranks);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

TEST(VocabChunksTest, ThreeChunksTrainAsOneUnit) {
  for (const auto& [name, json] :
       {std::pair{"untied llama", untied_llama()}, std::pair{"tied qwen2", tied_qwen2()}}) {
    SCOPED_TRACE(name);
    const ModelDesc one = desc_of(json, name);
    const ModelDesc three = with_chunks(one, 3);
    // Two more embedding units; untied, the head's three chunks leave the norm unit.
    ASSERT_EQ(unit_specs(three).size(),
              unit_specs(one).size() + (json["tie_word_embeddings"] ? 2u : 5u));
    // The harness's random weights (far from the init's scale, so every tensor trains).
    std::map<std::string, std::vector<float>> start;
    {
      const std::vector<zero::UnitSpec> specs = unit_specs(one);
      const Weights w = random_weights(specs, kSeed + 7);
      for (std::size_t u = 0; u < specs.size(); ++u) {
        for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
          start[specs[u].tensors[t].name] = w[u][t];
        }
      }
    }
    const RunResult want = train(one, 0, 1, start);
    ASSERT_EQ(want.losses.size(), 3u);
    EXPECT_NE(want.trained, start) << "the weights train";
    for (const auto& [stage, ranks] : {std::pair{0, 1}, std::pair{3, 2}}) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      const RunResult got = train(three, stage, ranks, start);
      ASSERT_EQ(got.losses.size(), 3u);
      EXPECT_EQ(got.initial, want.initial) << "init_weights gives the same weights";
      for (int i = 0; i < 3; ++i) {
        EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * want.losses[i]) << "step " << i;
      }
      ASSERT_EQ(got.trained.size(), want.trained.size());
      for (const auto& [tensor, values] : want.trained) {
        expect_near_rel(got.trained.at(tensor), values, 1e-5, tensor);
      }
      expect_near_rel(got.logits, want.logits, 1e-5, "logits");
      expect_near_rel(got.decoded, want.decoded, 1e-5, "decoded logits");
    }
  }
}

// A folder saved from the chunked model is the one-unit model's byte for byte; loaded into the
// chunked model on stage 3 (each rank reading its part of every chunk), it reads back bit for bit.
TEST(VocabChunksTest, FoldersAreTheOneUnitModels) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tz_vocab_chunks_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  for (const auto& [name, json] :
       {std::pair{"untied", untied_llama()}, std::pair{"tied", tied_qwen2()}}) {
    SCOPED_TRACE(name);
    const ModelDesc one = desc_of(json, name);
    const ModelDesc three = with_chunks(one, 3);
    ModelOptions o;
    o.micro_batch = 1;
    o.seq = 4;
    const std::string one_dir = (dir / (std::string(name) + "_one")).string();
    const std::string three_dir = (dir / (std::string(name) + "_three")).string();
    std::map<std::string, std::vector<float>> saved;
    Status s = with_net(config_json(kSgd1, 0), one, o, [&](zero::Engine& engine, Model& net) {
      TZ_RETURN_IF_ERROR(write_weights(engine, net, random_weights(net.unit_specs(), kSeed)));
      TZ_ASSIGN_OR_RETURN(saved, whole_weights(engine, net));
      return net.save_weights(one_dir);
    });
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    s = with_net(config_json(kSgd1, 3), three, o, [&](zero::Engine& engine, Model& net) {
      TZ_RETURN_IF_ERROR(net.load_weights(one_dir));
      TZ_ASSIGN_OR_RETURN(const auto loaded, whole_weights(engine, net));
      EXPECT_EQ(loaded, saved);
      return net.save_weights(three_dir);
    }, 2);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    const std::string want = file_bytes(one_dir + "/model.safetensors");
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(file_bytes(three_dir + "/model.safetensors"), want);
    EXPECT_EQ(file_bytes(three_dir + "/config.json"), file_bytes(one_dir + "/config.json"));
  }
  std::filesystem::remove_all(dir);
}

// LoRA on a chunked base: the chunks are frozen units like the rest of the base, and the adapters
// train as on the one-unit base.
TEST(VocabChunksTest, LoraOnAChunkedFrozenBase) {
  for (const auto& [name, json] :
       {std::pair{"untied", untied_llama()}, std::pair{"tied", tied_qwen2()}}) {
    SCOPED_TRACE(name);
    const auto run = [&](int chunks) {
      ModelDesc desc = with_chunks(desc_of(json, name), chunks);
      desc.lora = parse_lora(desc, "r=2,alpha=4,targets=all-linear").value();
      const std::vector<std::int32_t> tokens = random_ids(24, desc.vocab, kSeed + 3);
      ModelOptions o;
      o.micro_batch = 2;
      o.seq = 6;
      std::vector<double> losses;
      const Status s = with_net(config_json(kAdamW, 3), desc, o,
                                [&](zero::Engine& engine, Model& net) -> Status {
        for (std::size_t u = 0; u < net.unit_count(); ++u) {
          const zero::UnitSpec& spec = net.unit_specs()[u];
          EXPECT_EQ(spec.frozen, !spec.name.ends_with(".lora")) << spec.name;
        }
        TZ_RETURN_IF_ERROR(net.init_weights(kSeed));
        std::vector<double> mine;
        for (int step = 0; step < 2; ++step) {
          TZ_ASSIGN_OR_RETURN(const double l,
                              net.train_micro_batch(std::span(tokens).subspan(step * 12, 12),
                                                    std::span(tokens).subspan(12 - step * 12, 12)));
          mine.push_back(l);
          TZ_RETURN_IF_ERROR(engine.step().status());
        }
        if (engine.rank() == 0) losses = mine;
        return Status::ok();
      }, 2);
      EXPECT_TRUE(s.is_ok()) << s.to_string();
      return losses;
    };
    const std::vector<double> one = run(1), three = run(3);
    ASSERT_EQ(one.size(), 2u);
    ASSERT_EQ(three.size(), 2u);
    for (int i = 0; i < 2; ++i) EXPECT_NEAR(three[i], one[i], 1e-5 * one[i]) << "step " << i;

    // The merged folder (--merge-into) of the same base and adapters, byte for byte.
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("tz_vocab_chunks_merge_" + std::to_string(::getpid()));
    std::map<std::string, std::vector<float>> weights;
    const auto merged = [&](int chunks) {
      ModelDesc desc = with_chunks(desc_of(json, name), chunks);
      desc.lora = parse_lora(desc, "r=2,alpha=4,targets=all-linear").value();
      if (weights.empty()) {
        const std::vector<zero::UnitSpec> specs = unit_specs(desc);
        const Weights w = random_weights(specs, kSeed + 9);
        for (std::size_t u = 0; u < specs.size(); ++u) {
          for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
            weights[specs[u].tensors[t].name] = w[u][t];
          }
        }
      }
      ModelOptions o;
      o.micro_batch = 1;
      o.seq = 4;
      const std::string out = (dir / std::to_string(chunks)).string();
      const Status s = with_net(config_json(kAdamW, 3), desc, o,
                                [&](zero::Engine& engine, Model& net) -> Status {
        TZ_RETURN_IF_ERROR(set_whole_weights(engine, net, weights));
        return net.save_merged(out, DType::kF32);
      }, 2);
      EXPECT_TRUE(s.is_ok()) << s.to_string();
      return file_bytes(out + "/model.safetensors");
    };
    const std::string want = merged(1);
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(merged(3), want);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace tz::model
