// The model tests' harness for the Llama family (llama_test.cc, lora_test.cc, vocab_chunks_test.cc)
// beside the families' common one (model_harness.h): a ModelDesc from a config.json, AdamW, a tiny
// model on the real engine (ranks as threads).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
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

}  // namespace tz::model::testing
