// The Llama family as transformers' modeling_llama.py computes it, one implementation driven by
// config.json for LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM:
// token embedding (no learned positions), pre-norm blocks with RMSNorm (rms_norm_eps), grouped-query
// causal attention (num_key_value_heads, head_dim) with rotary embeddings (rope_theta, rope_scaling
// "llama3"), optional q/k/v(/o) biases (attention_bias; Qwen2's q/k/v always), Qwen3's per-head
// q_norm/k_norm, a SwiGLU MLP (gate_proj, up_proj, down_proj, mlp_bias), a final RMSNorm and an LM
// head tied to the embedding or not (tie_word_embeddings). No dropout.
//
// Units, in registration (= forward) order, with HF's tensor names (nn.Linear weights (out, in)):
//   "embed"      model.embed_tokens.weight (vocab, hidden); or, split into C vocabulary chunks
//                (llama_vocab_chunks), "embed.0" .. "embed.{C-1}", each with the tensor
//                model.embed_tokens.weight holding its rows (rows_c, hidden)
//   "layers.{i}" model.layers.{i}.input_layernorm.weight (hidden); self_attn.q_proj.weight
//                (heads*head_dim, hidden) [.bias]; k_proj, v_proj (kv_heads*head_dim, hidden)
//                [.bias]; o_proj.weight (hidden, heads*head_dim) [.bias]; [self_attn.q_norm.weight,
//                k_norm.weight (head_dim)]; post_attention_layernorm.weight; mlp.gate_proj.weight,
//                up_proj.weight (ffn, hidden) [.bias]; mlp.down_proj.weight (hidden, ffn) [.bias]
//   "norm"       model.norm.weight (hidden) [, lm_head.weight (vocab, hidden) when untied]
//   with C chunks and untied, "norm" holds model.norm.weight only and is followed by
//   "lm_head.0" .. "lm_head.{C-1}", each with lm_head.weight holding its rows (rows_c, hidden).
// A Hugging Face tensor split that way is the units' same-named tensors in unit order
// (hf_tensors in model/hf_folder.h): folders and checkpoint exports hold it whole.
//
// With LoRA (model/lora.h, docs/lora.md) every unit above is frozen (zero::UnitSpec::frozen: no
// gradients, no optimizer state) and each "layers.{i}" is followed by its adapters "layers.{i}.lora":
// for each target module in layer order, lora_A (r, in) and lora_B (out, r) with PEFT's names
// (llama_lora_tensor_name). A targeted module computes W x + b + (alpha / r) B A dropout(x);
// backward through the frozen base computes input gradients only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/status.h"
#include "model/lora.h"
#include "model/model.h"
#include "zero/engine.h"

namespace tz::model {

// Rotary scaling of type "llama3" (Llama 3.1+): transformers' _compute_llama3_parameters.
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

// What a config.json of the family says (the keys tierzero computes with).
struct LlamaConfig {
  std::string name;           // the preset, the custom spec or the folder it came from
  std::string architecture = "LlamaForCausalLM";  // LlamaForCausalLM | MistralForCausalLM |
                                                  // Qwen2ForCausalLM | Qwen3ForCausalLM
  std::string model_type = "llama";               // llama | mistral | qwen2 | qwen3
  int layers = 0;             // num_hidden_layers
  int heads = 0;              // num_attention_heads
  int kv_heads = 0;           // num_key_value_heads (heads when absent)
  int hidden = 0;             // hidden_size
  int ffn = 0;                // intermediate_size
  int vocab = 0;              // vocab_size
  int positions = 0;          // max_position_embeddings
  int head_dim = 0;           // head_dim (hidden / heads when absent or null)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_llama3;  // none: the default rope
  bool qkv_bias = false;      // q/k/v_proj biases (attention_bias; always for Qwen2)
  bool o_bias = false;        // o_proj bias (attention_bias for Llama and Qwen3)
  bool mlp_bias = false;
  bool qk_norm = false;       // Qwen3's q_norm/k_norm
  bool tie_word_embeddings = false;
  std::optional<int> sliding_window;  // Mistral's (or Qwen's with use_sliding_window): refused
                                      // when shorter than the sequence trained or sampled
  double initializer_range = 0.02;
  // tierzero's, not a config.json key: how many vocabulary-chunk units hold the embedding (and the
  // untied LM head): 0 = as llama_vocab_chunks decides; >= 1 forces that many (at most vocab;
  // tests run small models with several chunks).
  int vocab_chunks = 0;
  // The config.json the model came from (a folder's, or a preset's published one; written back
  // with tierzero's values on save), or null for custom shapes.
  nlohmann::json source;

  // Parameters, the LM head counted once when tied; one decoder layer's.
  std::uint64_t param_count() const;
  std::uint64_t layer_param_count() const;
};

// Parses a config.json of the family. `origin` names the file in errors. Refused, with one line
// naming the key and its value: another architecture or model_type, hidden_act other than silu,
// a rope type other than default/llama3 (rope_scaling or rope_parameters), a head_dim that is odd,
// heads not a multiple of kv_heads, a missing or non-positive size.
Result<LlamaConfig> llama_config_from_json(const nlohmann::json& config, std::string_view origin);

// HF's config.json for `config` (its source with tierzero's values written over it, or a fresh
// one for presets), with torch_dtype naming `dtype`.
nlohmann::ordered_json llama_hf_config(const LlamaConfig& config, DType dtype);

// "llama-3.2-1b" | "llama-3.2-3b" | "llama-3.1-8b" | "qwen3-0.6b" | "qwen3-4b" | "mistral-7b" (the
// published config.json of each), or "llama:layers=L,heads=H,kv_heads=K,embd=C,ffn=F,vocab=V,
// seq=T[,vocab_chunks=N]" (every key once, vocab_chunks optional: LlamaConfig::vocab_chunks;
// Llama 3 defaults otherwise: rope_theta 500000, eps 1e-5, untied).
// kNotFound when `name` is neither (so the caller may try another family); kInvalidArgument
// naming the field for a bad custom spec.
Result<LlamaConfig> parse_llama_model(std::string_view name);
std::vector<std::string> llama_preset_names();

// The vocabulary chunks of the embedding and the untied LM head (docs/model.md, "Vocabulary
// chunks"): `count` units, chunk c holding the rows [c * rows, min(vocab, (c + 1) * rows)). One
// unit is the largest block of state the engine moves and the optimizer steps at once, and with
// both offloads on NVMe the host tier holds two units of it; a 128 K-token vocabulary would make
// the embedding 4x a decoder layer (llama-3.2-3b: 394 M against 101 M parameters). So an
// embedding above kVocabChunkMinParams parameters and larger than a decoder layer is split into
// chunks of at most a layer's parameters; smaller ones stay one unit (count 1, the units and bits
// of before). LlamaConfig::vocab_chunks forces the count.
inline constexpr std::uint64_t kVocabChunkMinParams = std::uint64_t{64} << 20;
struct VocabChunks {
  int count = 1;
  std::int64_t rows = 0;  // rows per chunk; the last holds the rest
  std::int64_t first(int c) const { return static_cast<std::int64_t>(c) * rows; }
  std::int64_t size(int c, std::int64_t vocab) const {
    return std::min(rows, vocab - first(c));
  }
};
VocabChunks llama_vocab_chunks(const LlamaConfig& config);

// The rotary inverse frequencies (head_dim / 2 values) as transformers computes them: 1 /
// theta^(2i/d), then the llama3 scaling when configured.
std::vector<float> rope_inv_freq(const LlamaConfig& config);

// Input and output features of a layer's LoRA module `module`, an index into
// llama_lora_modules() (q, k, v, o, gate, up, down).
std::pair<std::int64_t, std::int64_t> llama_lora_dims(const LlamaConfig& config, int module);

// The units of `config` in registration order (names and shapes as above); with `lora` the base
// frozen and the adapter units interleaved after their layers.
std::vector<zero::UnitSpec> unit_specs(const LlamaConfig& config);
std::vector<zero::UnitSpec> unit_specs(const LlamaConfig& config, const LoraSpec* lora);

// Whether `options` turn activation checkpointing on (resolves -1: on above GPT-2 small's size).
bool checkpointing_enabled(const LlamaConfig& config, const ModelOptions& options);

class Llama final : public Model {
 public:
  // Device bytes the model allocates per micro-batch (activations, logits, backward scratch).
  static std::uint64_t activation_bytes(const LlamaConfig& config, const ModelOptions& options,
                                        DType compute, const LoraSpec* lora = nullptr);
  // Registers the units with `engine` (before finalize); with `lora` (its targets checked by
  // parse_lora_spec / read_adapter_config) the base frozen and the adapters trainable.
  // kInvalidArgument for options that do not fit (micro_batch < 1, seq outside [0, positions], a
  // sliding window shorter than seq).
  static Result<std::unique_ptr<Llama>> create(const LlamaConfig& config,
                                               const ModelOptions& options, zero::Engine& engine,
                                               const LoraSpec* lora = nullptr);
  ~Llama() override;
  Llama(const Llama&) = delete;
  Llama& operator=(const Llama&) = delete;

  // transformers' _init_weights: every Linear and the embedding normal(0, initializer_range),
  // biases 0, RMSNorm weights 1; adapters as PEFT (lora_A Kaiming-uniform, lora_B 0).
  Status init_weights(std::uint64_t seed) override;
  // A folder (config.json + model.safetensors or an index and its shards) or one safetensors file:
  // the base; adapters then start as PEFT starts them, from the engine's seed.
  Status load_weights(const std::string& path) override;
  // Writes the folder `path`: config.json and the weights (shards with an index above the shard
  // size), and copies the source folder's tokenizer and generation files. With adapters: the
  // PEFT adapter folder instead (save_adapter).
  Status save_weights(const std::string& path, DType dtype = DType::kF32) override;

  bool has_adapter() const override;
  Status load_adapter(const std::string& dir) override;
  // adapter_config.json and adapter_model.safetensors (tensors as `dtype`, PEFT's names).
  Status save_adapter(const std::string& dir, DType dtype = DType::kF32);
  Status save_merged(const std::string& dir, DType dtype) override;

  Result<double> train_micro_batch(std::span<const std::int32_t> tokens,
                                   std::span<const std::int32_t> targets) override;
  Result<double> eval_loss(std::span<const std::int32_t> tokens,
                           std::span<const std::int32_t> targets) override;
  Result<std::vector<float>> last_logits(std::span<const std::int32_t> tokens) override;
  Result<std::vector<float>> logits(std::span<const std::int32_t> tokens, int batch,
                                    int length) override;
  bool has_kv_cache() const override { return true; }
  Result<std::vector<float>> decode(std::span<const std::int32_t> tokens,
                                    bool start_over) override;

  const LlamaConfig& config() const;
  const std::string& name() const override;
  int vocab() const override;
  const ModelOptions& options() const override;
  std::size_t unit_count() const override;
  zero::UnitId unit(std::size_t index) const override;
  const std::vector<zero::UnitSpec>& unit_specs() const override;

 private:
  struct Impl;
  explicit Llama(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tz::model
