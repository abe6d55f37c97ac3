// The model tests' harness for the Llama family (llama_test.cc, lora_test.cc): a ModelDesc from
// a config.json, a DeepSpeed config with one optimizer and stage, a tiny model on the real engine
// (ranks as threads), random weights in and out, random token ids.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "llama_reference.h"
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

inline std::string config_json(const std::string& optimizer, int stage, double clip = 0.0) {
  return "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1, "
         "\"gradient_clipping\": " +
         std::to_string(clip) + ", \"optimizer\": " + optimizer +
         ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) + "}}";
}
inline const char* const kSgd1 = "{\"type\": \"SGD\", \"params\": {\"lr\": 1.0}}";
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

// Base weights far from HF's init and adapters with B non-zero, so every adapter tensor carries a
// sizable gradient: matrices normal(0, 0.3), norms 1 + normal(0, 0.2), biases normal(0, 0.1),
// lora_A and lora_B normal(0, 0.3).
inline Weights random_weights(const std::vector<zero::UnitSpec>& specs, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Weights w(specs.size());
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (const zero::TensorSpec& t : specs[u].tensors) {
      std::vector<float> v(t.numel());
      const bool norm = t.name.ends_with("norm.weight");
      const bool bias = t.name.ends_with(".bias");
      for (float& x : v) {
        const double z = normal(rng);
        x = static_cast<float>(bias ? 0.1 * z : norm ? 1.0 + 0.2 * z : 0.3 * z);
      }
      w[u].push_back(std::move(v));
    }
  }
  return w;
}

inline Status write_weights(zero::Engine& engine, const Model& net, const Weights& w) {
  for (std::size_t u = 0; u < w.size(); ++u) {
    for (std::size_t t = 0; t < w[u].size(); ++t) {
      TZ_RETURN_IF_ERROR(engine.set_tensor(net.unit(u), t, w[u][t]));
    }
  }
  return Status::ok();
}

inline Result<Weights> read_weights(zero::Engine& engine, const Model& net) {
  const std::vector<zero::UnitSpec>& specs = net.unit_specs();
  Weights w(specs.size());
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
      std::vector<float> v(specs[u].tensors[t].numel());
      TZ_RETURN_IF_ERROR(engine.get_tensor(net.unit(u), t, v));
      w[u].push_back(std::move(v));
    }
  }
  return w;
}

inline std::vector<std::int32_t> random_ids(std::size_t n, int vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = id(rng);
  return v;
}

}  // namespace tz::model::testing
