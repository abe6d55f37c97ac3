// The one model interface the trainer, sampling, checkpoints and `estimate` use (DESIGN.md,
// "model/"): a decoder-only language model registered with the ZeRO engine as units, with its
// initialisation, weights in and out, one training micro-batch, the validation loss, logits and
// (for the families that keep one) incremental decoding over a key/value cache. GPT-2
// (model/gpt2.h) and the Llama family (model/llama.h) implement it; model/factory.h builds one from
// a preset name, a custom shape or a Hugging Face folder.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "zero/engine.h"

namespace tz::model {

// How a model runs, whatever its family.
struct ModelOptions {
  int micro_batch = 4;     // B: sequences per micro-batch
  int seq = 0;             // T: tokens per sequence; 0 = the model's positions; at most those
  int checkpointing = -1;  // -1: the family's default (on above GPT-2 small's size); 0 off, 1 on
  int cpu_threads = 0;     // threads of the CPU kernels (ops::OpsOptions); 0 = every core. With
                           // several ranks as threads of one process, give each its share.
};

// Whether `options` turn activation checkpointing on for a model of `params` parameters: 0 or 1
// as given; -1 (every family's default) on above GPT-2 small's size (124,439,808 parameters).
inline bool checkpointing_enabled(const ModelOptions& options, std::uint64_t params) {
  if (options.checkpointing >= 0) return options.checkpointing != 0;
  constexpr std::uint64_t kGpt2SmallParams = 124439808;
  return params > kGpt2SmallParams;
}

class Model {
 public:
  virtual ~Model() = default;

  // The family's initialisation as transformers does it, from `seed` (the same values on every
  // rank and for every world size). After engine.finalize(); collective; tensor by tensor.
  virtual Status init_weights(std::uint64_t seed) = 0;
  // Loads weights with Hugging Face's names: a safetensors file, or a folder (config.json plus
  // model.safetensors or the shards of model.safetensors.index.json). Collective.
  virtual Status load_weights(const std::string& path) = 0;
  // Writes the master weights as `dtype` with Hugging Face's names and config.json: GPT-2 to the
  // file `path` (config.json beside it), the Llama family to the folder `path`. Collective (every
  // rank gathers), rank 0 writes.
  virtual Status save_weights(const std::string& path, DType dtype = DType::kF32) = 0;

  // One micro-batch of B*T tokens and targets (host int32, row-major (B, T)): forward, loss,
  // backward, reduce of every unit. Returns the micro-batch's mean cross-entropy (unscaled).
  virtual Result<double> train_micro_batch(std::span<const std::int32_t> tokens,
                                           std::span<const std::int32_t> targets) = 0;
  // Forward only: the mean cross-entropy (validation). No gradient.
  virtual Result<double> eval_loss(std::span<const std::int32_t> tokens,
                                   std::span<const std::int32_t> targets) = 0;
  // Forward only on one sequence (1 <= length <= seq): the fp32 logits of its last position.
  virtual Result<std::vector<float>> last_logits(std::span<const std::int32_t> tokens) = 0;
  // Forward only on `batch` sequences of `length` tokens: every position's fp32 logits
  // (batch, length, vocab). batch <= micro_batch, length <= seq.
  virtual Result<std::vector<float>> logits(std::span<const std::int32_t> tokens, int batch,
                                            int length) = 0;

  // Incremental decoding (batch 1) for models with a key/value cache: appends `tokens` to the
  // cached sequence (emptied first with `start_over`) and returns the last new position's fp32
  // logits; the cached length plus the new tokens is at most seq. Models without a cache return
  // kUnimplemented (sampling then recomputes the context with last_logits).
  virtual bool has_kv_cache() const { return false; }
  virtual Result<std::vector<float>> decode(std::span<const std::int32_t> tokens,
                                            bool start_over) {
    (void)tokens;
    (void)start_over;
    return Status::unavailable("this model keeps no key/value cache");
  }

  // LoRA (model/lora.h, docs/lora.md): a model created with a LoraSpec trains adapters on a frozen
  // base; init_weights and load_weights start them from the spec's PEFT folder (LoraSpec::adapter)
  // or as PEFT initialises them; its save_weights writes the PEFT adapter folder. load_adapter
  // reads a PEFT folder's adapter_model.safetensors into the adapters (none there: unchanged);
  // save_merged writes the base with every adapter merged (W + alpha / r B A) as a Hugging Face
  // folder of `dtype`. Both collective; errors name the file and tensor. Models without adapters
  // refuse both (kInvalidArgument).
  virtual bool has_adapter() const { return false; }
  virtual Status load_adapter(const std::string& dir) {
    return Status::invalid_argument("model " + name() + " has no adapters (--lora): cannot load " +
                                    dir);
  }
  virtual Status save_merged(const std::string& dir, DType dtype) {
    (void)dtype;
    return Status::invalid_argument("model " + name() + " has no adapters (--lora): nothing to "
                                    "merge into " + dir);
  }

  virtual const std::string& name() const = 0;  // the preset, custom spec or folder
  virtual int vocab() const = 0;
  virtual const ModelOptions& options() const = 0;  // with seq and checkpointing resolved
  virtual std::size_t unit_count() const = 0;
  virtual zero::UnitId unit(std::size_t index) const = 0;  // units in registration order
  virtual const std::vector<zero::UnitSpec>& unit_specs() const = 0;
};

}  // namespace tz::model
