// Hugging Face's side of GPT-2: the tensor names GPT2LMHeadModel saves ("transformer.h.3.attn.
// c_attn.weight"), the buffers and tied copies it may save beside them, and its config.json, so
// weights move both ways between tierzero and transformers.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/status.h"
#include "model/gpt2.h"

namespace tz::model {

inline constexpr std::string_view kHfPrefix = "transformer.";

// The name without the "transformer." prefix of tensor `tensor` of unit `unit` ("wte.weight",
// "h.3.ln_1.bias", "ln_f.weight").
std::string hf_tensor_name(const zero::UnitSpec& unit, const zero::TensorSpec& tensor);

// A name with its "transformer." prefix removed (unchanged when it has none).
std::string_view strip_hf_prefix(std::string_view name);

// True for tensors a GPT-2 file may hold that are not parameters of their own: the tied LM head
// ("lm_head.weight", a copy of wte) and the attention mask buffers older transformers saved
// ("h.{i}.attn.bias", "h.{i}.attn.masked_bias"). `name` is without the prefix.
bool is_hf_non_parameter(std::string_view name);

// HF's GPT2Config for `shape` as config.json holds it (no dropout, gelu_new, eps 1e-5, tied head;
// torch_dtype names `dtype`).
nlohmann::ordered_json hf_config(const Gpt2Shape& shape, DType dtype);

// The shape a config.json describes (n_layer, n_head, n_embd, vocab_size, n_positions), named
// "gpt2:layers=...,seq=..."; kInvalidArgument naming `origin` and the key for a missing or bad
// key, or an architecture tierzero does not compute (activation_function other than gelu_new,
// n_inner other than 4 n_embd, layer_norm_epsilon other than 1e-5, untied embeddings).
Result<Gpt2Shape> shape_from_hf_config(const nlohmann::json& config, std::string_view origin);

// config.json in the directory of `weights_path`.
std::string hf_config_path(const std::string& weights_path);

// Reads `path` (a config.json) and returns its shape; kNotFound when the file does not exist,
// kInvalidArgument (naming the file) when it does not parse or describe a GPT-2 tierzero computes.
Result<Gpt2Shape> read_hf_config(const std::string& path);

// kInvalidArgument "<path>: tensor '<name>': element <i> is NaN (or inf, -inf); weights must
// be finite" for the first non-finite value of a tensor being loaded, OK otherwise. `values` are
// the tensor's elements from `first_elem` on (i counts from the tensor's start).
Status check_finite_weights(std::span<const float> values, const std::string& path,
                            std::string_view name, std::uint64_t first_elem = 0);

// Loads the GPT-2 weights in the safetensors file `path` into the engine's master weights, unit
// by unit and tensor by tensor (one tensor in host memory at a time). Accepts HF's names with or
// without "transformer.", fp32 / fp16 / bf16 tensors, and the non-parameters above (lm_head.weight
// must have wte's shape; its values are wte's). Every tensor is checked before the first is set:
// a missing or unexpected tensor, one given twice (with and without the prefix) or a shape other
// than the model's is kInvalidArgument, and a malformed file kCorrupt (core/safetensors.h), each
// one line naming the file and the tensor; a NaN or Inf value is refused naming the tensor
// (check_finite_weights). Each rank reads only the elements it keeps (load_tensor_part in
// model/hf_folder.h); not collective, so on a NaN only the ranks whose part holds it fail.
Status load_hf_weights(zero::Engine& engine, const Gpt2Shape& shape,
                       const std::vector<zero::UnitSpec>& specs,
                       const std::vector<zero::UnitId>& units, const std::string& path);

// Writes the engine's master weights to `path` as `dtype` with HF's names ("transformer."
// prefixed, data in unit order) and metadata {"format": "pt"}, then config.json beside it.
// Collective: every rank gathers each tensor; rank 0 writes, and keeps going through the
// gathers after a write error so the ranks stay paired, returning that error at the end.
Status save_hf_weights(zero::Engine& engine, const Gpt2Shape& shape,
                       const std::vector<zero::UnitSpec>& specs,
                       const std::vector<zero::UnitId>& units, const std::string& path,
                       DType dtype);

}  // namespace tz::model
