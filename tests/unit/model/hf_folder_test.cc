// Hugging Face folders of the Llama family through the engine: a folder written by tierzero (one
// file, or shards with an index) reads back bit for bit; the tokenizer files are copied; every bad
// input is one line naming the file (and the tensor) and leaves the weights as they were.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/dtype.h"
#include "core/safetensors.h"
#include "model/factory.h"
#include "model/hf_folder.h"
#include "model/llama.h"
#include "zero/engine.h"

#include "model_harness.h"

namespace tz::model {
namespace {

namespace fs = std::filesystem;
using testing::read_weights;  // model_harness.h
using testing::Weights;

// Qwen2-like (q/k/v biases) with an untied head, so the folder holds every kind of tensor.
nlohmann::json tiny_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 23,
    "max_position_embeddings": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2})");
}

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/tz_hf_folder_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
}

// A source folder: config.json and a tokenizer file, no weights yet.
std::string source_folder(const std::string& name) {
  const std::string dir = temp_dir(name);
  write_text(dir + "/config.json", tiny_config().dump(2));
  write_text(dir + "/tokenizer.json", "{\"version\": \"1.0\"}\n");
  write_text(dir + "/generation_config.json", "{\"do_sample\": false}\n");
  return dir;
}

using NetFn = std::function<Status(zero::Engine&, Model&)>;

Status with_net(const ModelDesc& desc, const NetFn& fn) {
  ConfigLoad load = load_config_text(
      "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"SGD\", \"params\": "
      "{\"lr\": 1.0}}, \"zero_optimization\": {\"stage\": 0}}");
  if (!load.ok()) return load.status();
  ModelOptions o;
  o.micro_batch = 1;
  o.seq = 4;
  o.cpu_threads = 1;
  zero::EngineOptions eo;
  eo.config = load.config;
  eo.activation_bytes = activation_bytes(desc, o, DType::kF32);
  return zero::run_local_ranks(1, 64u << 20, [&](int, gpu::Device& dev, comm::Comm& comm) {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine, zero::Engine::create(eo, dev, comm));
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<Model> net, create_model(desc, o, *engine));
    TZ_RETURN_IF_ERROR(engine->finalize());
    return fn(*engine, *net);
  });
}

Status set_random(zero::Engine& engine, const Model& net, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<zero::UnitSpec>& specs = net.unit_specs();
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
      std::vector<float> v(specs[u].tensors[t].numel());
      for (float& x : v) x = normal(rng);
      TZ_RETURN_IF_ERROR(engine.set_tensor(net.unit(u), t, v));
    }
  }
  return Status::ok();
}

bool same_bits(const Weights& a, const Weights& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t u = 0; u < a.size(); ++u) {
    if (a[u].size() != b[u].size()) return false;
    for (std::size_t t = 0; t < a[u].size(); ++t) {
      if (a[u][t].size() != b[u][t].size() ||
          std::memcmp(a[u][t].data(), b[u][t].data(), a[u][t].size() * sizeof(float)) != 0) {
        return false;
      }
    }
  }
  return true;
}

// Saves random weights from a model of `source` into `out` (shards of `shard_bytes`), returns them.
Weights save_random(const std::string& source, const std::string& out, std::uint64_t shard_bytes) {
  const ModelDesc desc = resolve_model(source).value();
  Weights saved;
  const Status s = with_net(desc, [&](zero::Engine& engine, Model& net) -> Status {
    TZ_RETURN_IF_ERROR(set_random(engine, net, 99));
    TZ_ASSIGN_OR_RETURN(saved, read_weights(engine, net));
    if (shard_bytes == 0) return net.save_weights(out);
    const LlamaConfig& c = std::get<LlamaConfig>(desc.arch);
    std::vector<zero::UnitId> units;
    for (std::size_t u = 0; u < net.unit_count(); ++u) units.push_back(net.unit(u));
    return save_hf_weights_folder(engine, net.unit_specs(), units, out,
                                  llama_hf_config(c, DType::kF32), DType::kF32, source,
                                  shard_bytes);
  });
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return saved;
}

// Loads `dir` into a fresh model of it: the weights, or the load's error (the weights then must be
// the ones before the load, all zero).
Result<Weights> load(const std::string& dir) {
  TZ_ASSIGN_OR_RETURN(const ModelDesc desc, resolve_model(dir));
  Weights loaded;
  Status load_status;
  TZ_RETURN_IF_ERROR(with_net(desc, [&](zero::Engine& engine, Model& net) -> Status {
    TZ_ASSIGN_OR_RETURN(const Weights before, read_weights(engine, net));
    load_status = net.load_weights(dir);
    TZ_ASSIGN_OR_RETURN(loaded, read_weights(engine, net));
    if (!load_status.is_ok()) {
      EXPECT_TRUE(same_bits(before, loaded)) << "a failed load changed weights";
    }
    return Status::ok();
  }));
  TZ_RETURN_IF_ERROR(load_status);
  return loaded;
}

TEST(HfFolderTest, SingleFileRoundTripIsBitExactAndCopiesTheTokenizer) {
  const std::string src = source_folder("src1");
  const std::string out = temp_dir("out1");
  const Weights saved = save_random(src, out, 0);
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(out + "/generation_config.json"));
  std::ifstream cfg(out + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(cfg);
  EXPECT_EQ(config["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(config["eos_token_id"], 2) << "the source's keys are kept";
  EXPECT_EQ(config["torch_dtype"], "float32");
  const Result<Weights> loaded = load(out);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_TRUE(same_bits(saved, *loaded));
}

TEST(HfFolderTest, ShardedRoundTripIsBitExact) {
  const std::string src = source_folder("src2");
  const std::string out = temp_dir("out2");
  const Weights saved = save_random(src, out, 4096);
  std::ifstream idx(out + "/model.safetensors.index.json");
  ASSERT_TRUE(idx.good());
  const nlohmann::json index = nlohmann::json::parse(idx);
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  EXPECT_GE(shards.size(), 3u);
  EXPECT_TRUE(shards.contains("model-00001-of-0000" + std::to_string(shards.size()) + ".safetensors"));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  const Result<Weights> loaded = load(out);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_TRUE(same_bits(saved, *loaded));
}

// Saved as bf16, the folder reads back as exactly the fp32 weights rounded to bf16.
TEST(HfFolderTest, Bf16SaveReadsBackAsTheRounding) {
  const std::string src = source_folder("src4");
  const std::string out = temp_dir("out4");
  const ModelDesc desc = resolve_model(src).value();
  Weights saved;
  const Status s = with_net(desc, [&](zero::Engine& engine, Model& net) -> Status {
    TZ_RETURN_IF_ERROR(set_random(engine, net, 7));
    TZ_ASSIGN_OR_RETURN(saved, read_weights(engine, net));
    return net.save_weights(out, DType::kBF16);
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  std::ifstream cfg(out + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(cfg)["torch_dtype"], "bfloat16");
  for (auto& unit : saved) {
    for (auto& tensor : unit) {
      for (float& x : tensor) x = bf16_to_f32(f32_to_bf16(x));
    }
  }
  const Result<Weights> loaded = load(out);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_TRUE(same_bits(saved, *loaded));
}

// A one-file folder whose tensors are the model's, with `edit` applied to the list first.
std::string folder_with(const std::string& name,
                        const std::function<void(std::vector<SafetensorsTensorSpec>&)>& edit) {
  const std::string dir = source_folder(name);
  const LlamaConfig c = llama_config_from_json(tiny_config(), "x").value();
  std::vector<SafetensorsTensorSpec> specs;
  for (const zero::UnitSpec& u : unit_specs(c)) {
    for (const zero::TensorSpec& t : u.tensors) specs.push_back({t.name, DType::kBF16, t.shape});
  }
  edit(specs);
  SafetensorsWriter w = SafetensorsWriter::create(dir + "/model.safetensors", specs).value();
  for (const SafetensorsTensorSpec& t : specs) {
    std::uint64_t n = 1;
    for (const std::int64_t d : t.shape) n *= static_cast<std::uint64_t>(d);
    EXPECT_TRUE(w.write_f32(t.name, std::vector<float>(n, 0.5f)).is_ok());
  }
  EXPECT_TRUE(w.finish().is_ok());
  return dir;
}

void expect_one_line(const Status& s, const std::vector<std::string>& parts) {
  ASSERT_FALSE(s.is_ok());
  const std::string m = s.message();
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << m << " lacks " << p;
}

TEST(HfFolderTest, Bf16FolderLoads) {
  const std::string dir = folder_with("bf16", [](auto&) {});
  const Result<Weights> w = load(dir);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(w->front().front().front(), 0.5f);
}

TEST(HfFolderTest, BadInputIsOneLineNamingTheFile) {
  // No config.json.
  const std::string empty = temp_dir("empty");
  expect_one_line(resolve_model(empty).status(), {empty + "/config.json"});
  // A missing tensor, by name.
  const std::string missing = folder_with("missing", [](auto& specs) {
    specs.erase(specs.begin() + 4);  // k_proj.weight (after q_proj weight and bias)
  });
  expect_one_line(load(missing).status(),
                  {missing + "/model.safetensors", "model.layers.0.self_attn.k_proj.weight", "missing"});
  // A wrong shape: name, expected, found.
  const std::string shape = folder_with("shape", [](auto& specs) { specs[1].shape = {16, 17}; });
  expect_one_line(load(shape).status(),
                  {shape + "/model.safetensors", "model.layers.0.input_layernorm.weight",
                   "expected [16]", "found [16, 17]"});
  // An unexpected tensor.
  const std::string extra = folder_with("extra", [](auto& specs) {
    specs.push_back({"model.layers.9.mlp.up_proj.weight", DType::kF32, {2}});
  });
  expect_one_line(load(extra).status(), {extra + "/model.safetensors", "model.layers.9.mlp.up_proj.weight"});
  // A truncated file.
  const std::string cut = folder_with("cut", [](auto&) {});
  fs::resize_file(cut + "/model.safetensors", fs::file_size(cut + "/model.safetensors") - 10);
  const Status truncated = load(cut).status();
  expect_one_line(truncated, {cut + "/model.safetensors"});
  EXPECT_EQ(truncated.code(), ErrorCode::kCorrupt);
  // A corrupt header.
  const std::string bad = folder_with("corrupt", [](auto&) {});
  {
    std::fstream f(bad + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("#####", 5);
  }
  expect_one_line(load(bad).status(), {bad + "/model.safetensors"});
  // An unsupported dtype (I32), written by hand.
  const std::string i32 = source_folder("i32");
  {
    std::string header = R"({"model.embed_tokens.weight":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})";
    while (header.size() % 8 != 0) header += ' ';
    std::ofstream f(i32 + "/model.safetensors", std::ios::binary);
    const std::uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
    f.write("\0\0\0\0", 4);
  }
  expect_one_line(load(i32).status(), {i32 + "/model.safetensors", "I32"});
  // An index naming a shard that is not there.
  const std::string src = source_folder("src3");
  const std::string sharded = temp_dir("sharded");
  save_random(src, sharded, 4096);
  for (const fs::directory_entry& e : fs::directory_iterator(sharded)) {
    if (e.path().filename().string().starts_with("model-00002-of-")) fs::remove(e.path());
  }
  expect_one_line(load(sharded).status(), {sharded + "/model.safetensors.index.json", "model-00002-of-"});
}

}  // namespace
}  // namespace tz::model
