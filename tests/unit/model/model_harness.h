// The model tests' harness, every family: a DeepSpeed config, random weights set through the engine
// and read back, random token ids; and for GPT-2 a model on the real engine (HostDevice ranks:
// threads with a LocalComm; an engine from a JSON config, the model registered and finalized,
// then the test's body on every rank). The Llama family's part is llama_harness.h.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/gpt2.h"
#include "model/model.h"
#include "zero/engine.h"

namespace tz::model::testing {

// The engine's config: stage `stage`, fp32 unless bf16, the optimizer as JSON.
inline std::string config_json(const std::string& optimizer, int stage = 0, bool bf16 = false,
                               double clip = 0.0, int accumulation = 1) {
  return "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": " +
         std::to_string(accumulation) + ", \"gradient_clipping\": " + std::to_string(clip) +
         ", \"bf16\": {\"enabled\": " + (bf16 ? "true" : "false") + "}, \"optimizer\": " +
         optimizer + ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) + "}}";
}
// SGD with lr 1 and nothing else: after one step, master_before - master_after is the gradient.
inline const char* const kSgd1 = "{\"type\": \"SGD\", \"params\": {\"lr\": 1.0}}";

using ModelFn = std::function<Status(zero::Engine&, Gpt2&)>;

// Creates engine and model on each of `ranks` ranks and runs `fn` on each; the first error.
inline Status with_model(const std::string& config, const std::string& model_name,
                         const Gpt2Options& options, const ModelFn& fn, int ranks = 1) {
  ConfigLoad load = load_config_text(config);
  if (!load.ok()) return load.status();
  TZ_ASSIGN_OR_RETURN(const Gpt2Shape shape, parse_model(model_name));
  zero::EngineOptions eo;
  eo.config = load.config;
  eo.activation_bytes = Gpt2::activation_bytes(
      shape, options, load.config.bf16 ? DType::kBF16 : DType::kF32);
  return zero::run_local_ranks(ranks, 512u << 20, [&](int, gpu::Device& dev, comm::Comm& comm) {
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<zero::Engine> engine, zero::Engine::create(eo, dev, comm));
    Gpt2Options o = options;
    if (o.cpu_threads == 0) o.cpu_threads = 1;  // ranks share the machine's cores
    TZ_ASSIGN_OR_RETURN(std::unique_ptr<Gpt2> gpt, Gpt2::create(shape, o, *engine));
    TZ_RETURN_IF_ERROR(engine->finalize());
    return fn(*engine, *gpt);
  });
}

// Every tensor's fp32 master weights, unit by unit, in registration order.
using Weights = std::vector<std::vector<std::vector<float>>>;

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

inline Status write_weights(zero::Engine& engine, const Model& net, const Weights& w) {
  for (std::size_t u = 0; u < w.size(); ++u) {
    for (std::size_t t = 0; t < w[u].size(); ++t) {
      TZ_RETURN_IF_ERROR(engine.set_tensor(net.unit(u), t, w[u][t]));
    }
  }
  return Status::ok();
}

// Weights far from HF's small init, so every path of the model carries a sizable gradient:
// matrices normal(0, 0.3), norm weights (GPT-2's ln_*, the Llama family's *norm.weight)
// 1 + normal(0, 0.2), biases normal(0, 0.1); LoRA's lora_A and lora_B are matrices (B non-zero, so
// every adapter tensor has a gradient).
inline Weights random_weights(const std::vector<zero::UnitSpec>& specs, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Weights w(specs.size());
  for (std::size_t u = 0; u < specs.size(); ++u) {
    for (const zero::TensorSpec& t : specs[u].tensors) {
      std::vector<float> v(t.numel());
      const bool norm = t.name.starts_with("ln_") || t.name.ends_with("norm.weight");
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
inline Weights random_weights(const Gpt2Shape& shape, std::uint64_t seed) {
  return random_weights(unit_specs(shape), seed);
}

inline std::vector<std::int32_t> random_ids(std::size_t n, int vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = id(rng);
  return v;
}

}  // namespace tz::model::testing
