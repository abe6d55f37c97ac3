// The GPT-2 family as Hugging Face's GPT2LMHeadModel computes it (learned positions, pre-LN blocks
// with eps 1e-5, fused QKV, causal attention scaled by 1/sqrt(head_dim), gelu_new, 4x MLP, final
// LayerNorm, LM head tied to the token embedding, no dropout), written against the ZeRO engine's
// model API (zero/engine.h): it registers its parameters as units, gathers them, computes on the
// engine's compute stream with ops/, hands back full gradients and never sees shards or ranks.
//
// Units, in registration (= forward) order, with HF's tensor names and shapes (Conv1D weights are
// stored (in, out) as HF does):
//   "wte"   wte.weight (vocab, embd), wpe.weight (seq, embd)   -- wte is also the LM head
//   "h.{i}" ln_1.weight, ln_1.bias (embd); attn.c_attn.weight (embd, 3 embd), attn.c_attn.bias;
//           attn.c_proj.weight (embd, embd), attn.c_proj.bias; ln_2.weight, ln_2.bias;
//           mlp.c_fc.weight (embd, 4 embd), mlp.c_fc.bias; mlp.c_proj.weight (4 embd, embd),
//           mlp.c_proj.bias
//   "ln_f"  ln_f.weight, ln_f.bias (embd)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/model.h"
#include "zero/engine.h"

namespace tz::model {

// The shape of a GPT-2 model. `seq` is the number of learned positions (HF's n_positions).
struct Gpt2Shape {
  std::string name;  // the preset name or the custom spec it was parsed from
  int layers = 0;
  int heads = 0;
  int embd = 0;
  int vocab = 0;
  int seq = 0;
  // Parameters with the LM head counted once (it is wte): 124,439,808 for gpt2-124m.
  std::uint64_t param_count() const;
  int head_dim() const { return embd / heads; }
};

// "gpt2-124m" | "gpt2-350m" | "gpt2-774m" | "gpt2-1.5b" (HF's gpt2, gpt2-medium, gpt2-large,
// gpt2-xl: vocab 50257, seq 1024), or a custom shape "gpt2:layers=4,heads=4,embd=256,vocab=256,
// seq=256" (every key required once, in any order). kInvalidArgument naming the field for an
// unknown name or key, a missing, repeated, zero, negative or non-numeric value, or embd not
// divisible by heads.
Result<Gpt2Shape> parse_model(std::string_view name);

// The preset names parse_model accepts, for help texts.
std::vector<std::string> preset_names();

// The units of `shape` in registration order, with their tensors (names and shapes as above).
std::vector<zero::UnitSpec> unit_specs(const Gpt2Shape& shape);

// GPT-2's options are the interface's (model/model.h).
using Gpt2Options = ModelOptions;

// Whether `options` turn activation checkpointing on for `shape` (resolves -1).
bool checkpointing_enabled(const Gpt2Shape& shape, const Gpt2Options& options);

class Gpt2 final : public Model {
 public:
  // Activation bytes the model allocates on the device per micro-batch (for
  // EngineOptions::activation_bytes): kept activations (every block's, or only the block inputs
  // with checkpointing, plus one block's for the recompute), one micro-batch's logits and the
  // backward's scratch. Exactly what the model allocates.
  static std::uint64_t activation_bytes(const Gpt2Shape& shape, const Gpt2Options& options,
                                        DType compute);
  // Registers the units with `engine` (before engine.finalize()); keeps a reference to it, which
  // must outlive the model. kInvalidArgument for options that do not fit the shape (micro_batch
  // < 1, seq < 0 or above shape.seq); the engine's registration errors.
  static Result<std::unique_ptr<Gpt2>> create(const Gpt2Shape& shape, const Gpt2Options& options,
                                              zero::Engine& engine);
  ~Gpt2() override;
  Gpt2(const Gpt2&) = delete;
  Gpt2& operator=(const Gpt2&) = delete;

  // HF's initialisation from `seed` (the same values on every rank and for every world size):
  // every Linear/Conv1D weight and both embeddings normal(0, 0.02), the residual projections
  // (attn.c_proj.weight, mlp.c_proj.weight) normal(0, 0.02/sqrt(2*layers)), biases 0, LayerNorm
  // weights 1 and biases 0. After engine.finalize(); collective; tensor by tensor.
  Status init_weights(std::uint64_t seed) override;
  // Loads HF GPT-2 weights (model/safetensors.h for the accepted files and the errors, each
  // naming the file and the tensor). Collective: every rank reads the file.
  Status load_safetensors(const std::string& path);
  // Writes the master weights to `path` (HF's names with the "transformer." prefix, Conv1D
  // weights (in, out), as `dtype`) and HF's config.json into the same directory, so that
  // transformers.GPT2LMHeadModel.from_pretrained(dir) loads them when `path` is
  // dir/model.safetensors. Collective (every rank gathers), rank 0 writes.
  Status save_safetensors(const std::string& path, DType dtype = DType::kF32);
  // Model's: a file `path` (load_safetensors) or a folder holding config.json and
  // model.safetensors; save writes the file `path` (save_safetensors).
  Status load_weights(const std::string& path) override;
  Status save_weights(const std::string& path, DType dtype = DType::kF32) override;

  // One micro-batch of B*T tokens and targets (host int32, row-major (B, T), B = micro_batch,
  // T = seq; every id in [0, vocab)): forward, loss, backward, reduce of every unit. Returns the
  // micro-batch's mean cross-entropy (unscaled). kInvalidArgument for a wrong size or an id out
  // of range; the engine's and the kernels' errors.
  Result<double> train_micro_batch(std::span<const std::int32_t> tokens,
                                   std::span<const std::int32_t> targets) override;
  // Forward only: the mean cross-entropy (validation). Gathers and releases; no gradient.
  Result<double> eval_loss(std::span<const std::int32_t> tokens,
                           std::span<const std::int32_t> targets) override;
  // Forward only on one sequence (batch 1, 1 <= length <= seq): the fp32 logits of its last
  // position (vocab values).
  Result<std::vector<float>> last_logits(std::span<const std::int32_t> tokens) override;
  // Forward only on `batch` sequences of `length` tokens (row-major): every position's fp32
  // logits, (batch, length, vocab). batch <= micro_batch, length <= seq. For comparisons with
  // other implementations (bench/model_vs_hf.sh) and tests.
  Result<std::vector<float>> logits(std::span<const std::int32_t> tokens, int batch,
                                    int length) override;

  const Gpt2Shape& shape() const;
  const Gpt2Options& options() const override;  // with seq and checkpointing resolved
  zero::UnitId unit(std::size_t index) const override;  // units in registration order
  const std::string& name() const override;
  int vocab() const override;
  std::size_t unit_count() const override;
  const std::vector<zero::UnitSpec>& unit_specs() const override;

 private:
  struct Impl;
  explicit Gpt2(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tz::model
