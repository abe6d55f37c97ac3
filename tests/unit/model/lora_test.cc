// LoRA on the Llama family: the --lora spec and PEFT's adapter_config.json with every refusal (one
// line each); a training step of a tiny Llama with adapters on every linear module against the
// float64 reference (loss, adapter gradients from its central differences, the base untouched);
// stage 3 and checkpointing against stage 0; the PEFT folder round trip (bit-equal adapters,
// the same loss); merge-into against W + (alpha / r) B A computed here; an adapter of another
// base shape refused with nothing set; PEFT's initialisation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/safetensors.h"
#include "model/factory.h"
#include "model/llama.h"
#include "model/lora.h"
#include "zero/engine.h"

#include "llama_harness.h"
#include "llama_reference.h"

namespace tz::model {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace): the shared harness

namespace fs = std::filesystem;
using testing::Reference;
using testing::Weights;

constexpr std::uint64_t kSeed = 20261228;

// GQA (2 heads over 1 KV head), q/k/v/o and MLP biases, untied head: every module shape differs.
nlohmann::json tiny_llama(int hidden = 16) {
  nlohmann::json j = testing::tiny_untied_llama();
  j["hidden_size"] = hidden;
  return j;
}

// The harness's with_net with this file's engine seed (the adapters' init and dropout draw on it).
Status with_net_seeded(const std::string& config, const ModelDesc& desc,
                       const ModelOptions& options, const NetFn& fn, int ranks = 1) {
  return with_net(config, desc, options, fn, ranks, kSeed);
}

LoraSpec spec_of(const ModelDesc& desc, const std::string& text) {
  Result<LoraSpec> s = parse_lora(desc, text);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return *s;
}

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() /
                       ("tz_lora_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

void expect_one_line(const Status& s, const std::vector<std::string>& want) {
  ASSERT_FALSE(s.is_ok());
  const std::string msg = s.message();
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const std::string& w : want) EXPECT_NE(msg.find(w), std::string::npos) << msg;
}

// --- The spec and the adapter config ---------------------------------------------------------

TEST(LoraSpecTest, ParsesKeysDefaultsAndTargetOrder) {
  const ModelDesc desc = desc_of(tiny_llama(), "tiny");
  const LoraSpec a = spec_of(desc, "r=8,alpha=16,targets=v_proj,q_proj,down_proj,dropout=0.05");
  EXPECT_EQ(a.r, 8);
  EXPECT_EQ(a.alpha, 16.0);
  EXPECT_EQ(a.scale(), 2.0);
  EXPECT_EQ(a.dropout, 0.05);
  EXPECT_EQ(a.targets, (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  const LoraSpec b = spec_of(desc, "r=4");
  EXPECT_EQ(b.alpha, 4.0);
  EXPECT_EQ(b.targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(b.dropout, 0.0);
  EXPECT_EQ(spec_of(desc, "targets=all-linear,r=2").targets.size(), 7u);
}

TEST(LoraSpecTest, RefusesBadSpecsInOneLine) {
  const ModelDesc desc = desc_of(tiny_llama(), "tiny");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"r=0", {"--lora", "r is 0"}},
      {"r=-4,targets=q_proj", {"r is -4"}},
      {"alpha=8", {"'r' is missing"}},
      {"r=x", {"r is 'x'"}},
      {"r=4,rank=3", {"unknown key 'rank'"}},
      {"r=4,targets=q_proj,c_attn", {"target module 'c_attn'", "tiny", "q_proj"}},
      {"r=4,targets=lm_head", {"target module 'lm_head'"}},
      {"r=4,dropout=1", {"dropout"}},
      {"r=4,alpha=0", {"alpha"}},
      {"r=4,r=5", {"'r' given twice"}},
      {"r=4,,alpha=2", {"empty item"}},
      {"r=4,q_proj", {"'q_proj' is not key=value"}},
  };
  for (const auto& [text, want] : cases) {
    SCOPED_TRACE(text);
    expect_one_line(parse_lora(desc, text).status(), want);
  }
  // GPT-2 has no adapters (yet).
  Result<ModelDesc> gpt2 = resolve_model("gpt2:layers=1,heads=2,embd=16,vocab=32,seq=8");
  ASSERT_TRUE(gpt2.is_ok());
  expect_one_line(parse_lora(*gpt2, "r=4").status(), {"Llama family"});
}

TEST(LoraSpecTest, ReadsPeftConfigsAndRefusesVariantsByName) {
  const ModelDesc desc = desc_of(tiny_llama(), "tiny");
  const fs::path dir = temp_dir("config");
  const nlohmann::json good = nlohmann::json::parse(R"({
    "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
    "lora_dropout": 0.1, "target_modules": ["down_proj", "q_proj", "v_proj"], "bias": "none",
    "modules_to_save": null, "use_dora": false, "use_rslora": false, "fan_in_fan_out": false,
    "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": null,
    "init_lora_weights": true, "base_model_name_or_path": "x"})");
  write_text(dir / "adapter_config.json", good.dump());
  const Result<LoraSpec> s = read_adapter(desc, dir.string());
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->r, 4);
  EXPECT_EQ(s->scale(), 2.0);
  EXPECT_EQ(s->dropout, 0.1);
  EXPECT_EQ(s->targets, (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  // Our own writer's JSON reads back as the same spec.
  write_text(dir / "adapter_config.json", adapter_config_json(*s, "tiny").dump());
  const Result<LoraSpec> back = read_adapter(desc, dir.string());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->targets, s->targets);
  EXPECT_EQ(back->alpha, s->alpha);

  struct Case {
    std::function<void(nlohmann::json&)> change;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& j) { j["bias"] = "all"; }, {"'bias'", "\"all\"", "none"}},
      {[](nlohmann::json& j) { j["modules_to_save"] = {"lm_head"}; }, {"modules_to_save"}},
      {[](nlohmann::json& j) { j["use_dora"] = true; }, {"DoRA"}},
      {[](nlohmann::json& j) { j["use_rslora"] = true; }, {"rsLoRA"}},
      {[](nlohmann::json& j) { j["peft_type"] = "ADALORA"; }, {"ADALORA", "not supported"}},
      {[](nlohmann::json& j) { j["peft_type"] = "IA3"; }, {"IA3"}},
      {[](nlohmann::json& j) { j["rank_pattern"] = {{"q_proj", 8}}; }, {"rank_pattern"}},
      {[](nlohmann::json& j) { j["init_lora_weights"] = "pissa"; }, {"init_lora_weights"}},
      {[](nlohmann::json& j) { j["r"] = 0; }, {"r is 0"}},
      {[](nlohmann::json& j) { j["target_modules"] = {"q_proj", "c_fc"}; },
       {"target module 'c_fc'"}},
      {[](nlohmann::json& j) { j["target_modules"] = ".*proj"; }, {"regular expression"}},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.change(j);
    SCOPED_TRACE(j.dump());
    write_text(dir / "adapter_config.json", j.dump());
    const Status st = read_adapter(desc, dir.string()).status();
    expect_one_line(st, c.want);
    EXPECT_NE(st.message().find("adapter_config.json"), std::string::npos) << st.message();
  }
  fs::remove(dir / "adapter_config.json");
  expect_one_line(read_adapter(desc, dir.string()).status(), {"no such file"});
  fs::remove_all(dir);
}

// --- Training through the engine -------------------------------------------------------------

// The loss of B=2 sequences of T=5 with adapters on every linear module against the float64
// reference; the adapters' d(loss)/d(w) from one SGD lr-1 step against its central differences;
// the frozen base unchanged by the step.
TEST(LoraTest, StepMatchesAFloat64Reference) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  ModelDesc desc = desc_of(tiny_llama(), "tiny");
  desc.lora = spec_of(desc, "r=3,alpha=4.5,targets=all-linear");
  const LlamaConfig& c = std::get<LlamaConfig>(desc.arch);
  const std::vector<zero::UnitSpec> specs = unit_specs(desc);
  const Weights w0 = random_weights(specs, kSeed);
  constexpr int kB = 2, kT = 5;
  const std::vector<std::int32_t> tokens = random_ids(kB * kT, c.vocab, kSeed + 1);
  const std::vector<std::int32_t> targets = random_ids(kB * kT, c.vocab, kSeed + 2);
  Reference ref(c, specs, w0);
  ref.lora = &*desc.lora;
  const double ref_loss = ref.loss(tokens, targets, kB, kT);
  for (const int ckpt : {0, 1}) {
    SCOPED_TRACE(ckpt);
    ModelOptions o;
    o.micro_batch = kB;
    o.seq = kT;
    o.checkpointing = ckpt;
    int checked = 0;
    const Status s = with_net_seeded(config_json(kSgd1, 0), desc, o, [&](zero::Engine& engine, Model& net) -> Status {
      EXPECT_TRUE(net.has_adapter());
      TZ_ASSIGN_OR_RETURN(const SgdStep step, sgd1_step(engine, net, w0, tokens, targets, ref_loss));
      double worst = 0;
      for (std::size_t u = 0; u < specs.size(); ++u) {
        if (specs[u].frozen) {
          EXPECT_EQ(step.w1[u], w0[u]) << specs[u].name << ": a frozen unit changed";
          continue;
        }
        for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
          const std::string& tn = specs[u].tensors[t].name;
          for (std::size_t i = 0; i < ref.p[tn].size(); i += 5) {
            const double g =
                static_cast<double>(w0[u][t][i]) - static_cast<double>(step.w1[u][t][i]);
            worst = std::max(worst, expect_gradient_matches(ref, tokens, targets, kB, kT, tn, i, g));
            ++checked;
          }
        }
      }
      std::printf("checkpointing %d: loss %.9f (reference %.9f), %d adapter gradients, worst "
                  "error/tolerance %.3f\n", ckpt, step.loss, ref_loss, checked, worst);
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_GT(checked, 150);
  }
}

// Stage 0 on one rank, stage 3 on two and checkpointing: identical losses and adapter bits over
// three AdamW steps with clipping (with dropout, whose masks the recompute draws again).
TEST(LoraTest, Stage3AndCheckpointingGiveStage0sAdapters) {
  for (const char* text : {"r=2,alpha=4,targets=q_proj,v_proj,down_proj",
                           "r=2,targets=o_proj,gate_proj,up_proj,dropout=0.25"}) {
    SCOPED_TRACE(text);
    ModelDesc desc = desc_of(tiny_llama(), "tiny");
    desc.lora = spec_of(desc, text);
    const ThreeSteps s0 = expect_stage3_and_checkpointing_give_stage0s(desc, kSeed, kSeed);
    ASSERT_EQ(s0.losses.size(), 3u);
    EXPECT_NE(s0.losses[1], s0.losses[0]) << "the adapters train";
    EXPECT_NE(s0.hash, s0.init_hash) << "the steps changed the adapters";
  }
}

// A spec built in code (not parsed) is checked when the model is created: the numbers as the
// parser checks them, one line naming the model and the key, and at least one target.
TEST(LoraTest, CreateRefusesASpecBuiltInCodeWithBadValues) {
  const ModelDesc base = desc_of(tiny_llama(), "tiny");
  ModelOptions o;
  o.micro_batch = 1;
  o.seq = 4;
  const auto create = [&](const std::function<void(LoraSpec&)>& edit) {
    ModelDesc desc = base;
    desc.lora = spec_of(base, "r=2");
    edit(*desc.lora);
    return with_net_seeded(config_json(kSgd1, 0), desc, o,
                           [](zero::Engine&, Model&) { return Status::ok(); });
  };
  EXPECT_TRUE(create([](LoraSpec&) {}).is_ok());
  const std::pair<std::function<void(LoraSpec&)>, std::string> bad[] = {
      {[](LoraSpec& s) { s.r = 0; }, "model tiny: LoRA: r is 0"},
      {[](LoraSpec& s) { s.alpha = 0; }, "model tiny: LoRA: alpha is 0"},
      {[](LoraSpec& s) { s.dropout = 1; }, "model tiny: LoRA: dropout is 1"},
      {[](LoraSpec& s) { s.targets.clear(); }, "model tiny: LoRA needs a target module"},
  };
  for (const auto& [edit, want] : bad) {
    const Status s = create(edit);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << want;
    EXPECT_NE(s.message().find(want), std::string::npos) << s.to_string();
  }
}

// PEFT's init: lora_A uniform in [-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_, a = sqrt(5)) with
// the uniform's spread, lora_B zero; so a fresh adapter leaves the base's loss unchanged.
TEST(LoraTest, InitIsPefts) {
  nlohmann::json j = tiny_llama(64);
  ModelDesc desc = desc_of(j, "wide");
  desc.lora = spec_of(desc, "r=8,targets=all-linear");
  ModelOptions o;
  o.micro_batch = 1;
  o.seq = 4;
  const Status s = with_net_seeded(config_json(kSgd1, 0), desc, o, [&](zero::Engine& engine, Model& net) -> Status {
    TZ_RETURN_IF_ERROR(net.init_weights(7));
    TZ_ASSIGN_OR_RETURN(const Weights w, read_weights(engine, net));
    const std::vector<zero::UnitSpec>& specs = net.unit_specs();
    int adapters = 0;
    for (std::size_t u = 0; u < specs.size(); ++u) {
      for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
        const zero::TensorSpec& ts = specs[u].tensors[t];
        const std::vector<float>& v = w[u][t];
        if (ts.name.ends_with("lora_B.weight")) {
          EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; })) << ts.name;
        } else if (ts.name.ends_with("lora_A.weight")) {
          ++adapters;
          const double bound = 1.0 / std::sqrt(static_cast<double>(ts.shape[1]));
          double sq = 0;
          for (const float x : v) {
            EXPECT_LT(std::abs(x), bound) << ts.name;
            sq += static_cast<double>(x) * x;
          }
          // A uniform's standard deviation is bound / sqrt(3).
          EXPECT_NEAR(std::sqrt(sq / static_cast<double>(v.size())), bound / std::sqrt(3.0),
                      0.1 * bound / std::sqrt(3.0)) << ts.name;
        }
      }
    }
    EXPECT_EQ(adapters, 14);
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
}

// --- PEFT folders in and out ------------------------------------------------------------------

// A trained adapter saved as a PEFT folder loads bit-equal into a fresh model (config and tensors)
// with the same loss; merge-into writes W + (alpha / r) B A for the targets and the base elsewhere.
TEST(LoraTest, AdapterRoundTripAndMerge) {
  ModelDesc desc = desc_of(tiny_llama(), "tiny");
  desc.lora = spec_of(desc, "r=2,alpha=3,targets=q_proj,v_proj,down_proj");
  const std::vector<zero::UnitSpec> specs = unit_specs(desc);
  const Weights w0 = random_weights(specs, kSeed + 9);
  const std::vector<std::int32_t> tokens = random_ids(12, desc.vocab, kSeed + 10);
  const std::vector<std::int32_t> targets = random_ids(12, desc.vocab, kSeed + 11);
  const fs::path dir = temp_dir("roundtrip");
  const fs::path adapter = dir / "adapter", merged = dir / "merged";
  ModelOptions o;
  o.micro_batch = 2;
  o.seq = 6;
  Weights trained;
  double trained_loss = 0;
  Status s = with_net_seeded(config_json(kAdamW, 0), desc, o, [&](zero::Engine& engine, Model& net) -> Status {
    TZ_RETURN_IF_ERROR(write_weights(engine, net, w0));
    TZ_RETURN_IF_ERROR(net.train_micro_batch(tokens, targets).status());
    TZ_RETURN_IF_ERROR(engine.step().status());
    TZ_ASSIGN_OR_RETURN(trained, read_weights(engine, net));
    TZ_ASSIGN_OR_RETURN(trained_loss, net.eval_loss(tokens, targets));
    TZ_RETURN_IF_ERROR(net.save_weights(adapter.string()));
    return net.save_merged(merged.string(), DType::kF32);
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_TRUE(fs::exists(adapter / "adapter_config.json"));
  ASSERT_TRUE(fs::exists(adapter / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(adapter / "model.safetensors")) << "the base is not copied";

  // PEFT's names and shapes in the file.
  {
    Result<SafetensorsReader> r = SafetensorsReader::open((adapter / "adapter_model.safetensors").string());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const SafetensorsEntry* e =
        r->find("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->shape, (std::vector<std::int64_t>{16, 2}));
    EXPECT_NE(r->find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), nullptr);
    EXPECT_EQ(r->entries().size(), 12u);
  }

  // Load: the spec from the folder, the base as before, the adapters from the file.
  ModelDesc loaded = desc_of(tiny_llama(), "tiny");
  Result<LoraSpec> read = read_adapter(loaded, adapter.string());
  ASSERT_TRUE(read.is_ok()) << read.status().to_string();
  loaded.lora = *read;
  s = with_net_seeded(config_json(kAdamW, 0), loaded, o, [&](zero::Engine& engine, Model& net) -> Status {
    TZ_RETURN_IF_ERROR(write_weights(engine, net, w0));
    TZ_RETURN_IF_ERROR(net.load_adapter(adapter.string()));
    TZ_ASSIGN_OR_RETURN(const Weights w, read_weights(engine, net));
    for (std::size_t u = 0; u < specs.size(); ++u) {
      if (specs[u].frozen) continue;
      EXPECT_EQ(w[u], trained[u]) << specs[u].name << ": not bit-equal";
    }
    TZ_ASSIGN_OR_RETURN(const double loss, net.eval_loss(tokens, targets));
    EXPECT_EQ(loss, trained_loss);
    // The spec read from the folder names it: init_weights starts the adapters from its file.
    TZ_RETURN_IF_ERROR(net.init_weights(99));
    TZ_ASSIGN_OR_RETURN(const Weights again, read_weights(engine, net));
    for (std::size_t u = 0; u < specs.size(); ++u) {
      if (specs[u].frozen) continue;
      EXPECT_EQ(again[u], trained[u]) << specs[u].name << ": not from the file";
    }
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();

  // The merged folder: a base model of the same config (no adapters) whose targeted weights are
  // W + 1.5 B A, computed here in double from the trained tensors.
  Result<SafetensorsReader> m = SafetensorsReader::open((merged / "model.safetensors").string());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE(fs::exists(merged / "config.json"));
  std::map<std::string, std::vector<float>> by_name;
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
      by_name[specs[u].tensors[t].name] = trained[u][t];
    }
  }
  int merged_checked = 0;
  for (std::size_t u = 0; u < specs.size(); ++u) {
    if (!specs[u].frozen) continue;
    for (const zero::TensorSpec& ts : specs[u].tensors) {
      const SafetensorsEntry* e = m->find(ts.name);
      ASSERT_NE(e, nullptr) << ts.name;
      std::vector<float> got(ts.numel());
      ASSERT_TRUE(m->read_f32(*e, got).is_ok());
      std::vector<double> want(by_name[ts.name].begin(), by_name[ts.name].end());
      for (const char* module : {"q_proj", "v_proj", "down_proj"}) {
        if (!ts.name.ends_with(std::string(".") + module + ".weight")) continue;
        const int layer = ts.name.find("layers.1.") != std::string::npos ? 1 : 0;
        const std::vector<float>& a = by_name[llama_lora_tensor_name(layer, module, false)];
        const std::vector<float>& b = by_name[llama_lora_tensor_name(layer, module, true)];
        const std::int64_t out = ts.shape[0], in = ts.shape[1];
        for (std::int64_t r = 0; r < out; ++r) {
          for (std::int64_t col = 0; col < in; ++col) {
            double sum = 0;
            for (int k = 0; k < 2; ++k) sum += double(b[r * 2 + k]) * a[k * in + col];
            want[r * in + col] += 1.5 * sum;
          }
        }
        ++merged_checked;
      }
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << ts.name << "[" << i << "]";
      }
    }
  }
  EXPECT_EQ(merged_checked, 6);
  EXPECT_EQ(m->find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), nullptr);

  // An adapter made for another base shape (hidden 24): refused in one line, nothing set.
  ModelDesc other = desc_of(tiny_llama(24), "wider");
  other.lora = *read;
  other.lora->adapter.clear();  // start as PEFT does, then load the folder explicitly
  s = with_net_seeded(config_json(kAdamW, 0), other, o, [&](zero::Engine& engine, Model& net) -> Status {
    TZ_RETURN_IF_ERROR(net.init_weights(5));
    TZ_ASSIGN_OR_RETURN(const Weights before, read_weights(engine, net));
    const Status bad = net.load_adapter(adapter.string());
    expect_one_line(bad, {"adapter_model.safetensors", "wrong shape", "another base shape"});
    TZ_ASSIGN_OR_RETURN(const Weights after, read_weights(engine, net));
    EXPECT_EQ(before, after) << "nothing set";
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tz::model
