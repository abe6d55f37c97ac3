// The Llama family on ops/ and the engine's model API (model/llama.h): the activation layout, the
// forward and backward of the embedding, the blocks (kept or recomputed), the final RMSNorm and the
// LM head with the fused cross-entropy, and incremental decoding over a key/value cache. The
// micro-batch protocol is GPT-2's (model/gpt2.cc): gather, compute on the compute stream,
// release; grad, reduce.
#include "model/llama.h"
#include "model/llama_impl.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "core/assert.h"
#include "core/output_file.h"
#include "core/safetensors.h"
#include "model/hf_folder.h"
#include "model/init.h"
#include "ops/ops.h"

namespace tz::model {

Llama::Llama(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Llama::~Llama() {
  if (impl_ && !impl_->acts.empty()) impl_->stream().synchronize().ignore();
}

std::uint64_t Llama::activation_bytes(const LlamaConfig& config, const ModelOptions& options,
                                      DType compute, const LoraSpec* lora) {
  return make_layout(config, resolve(config, options), compute, lora).total;
}

Result<std::unique_ptr<Llama>> Llama::create(const LlamaConfig& config,
                                             const ModelOptions& options, zero::Engine& engine,
                                             const LoraSpec* lora) {
  if (options.micro_batch < 1) {
    return Status::invalid_argument("model " + config.name + ": micro_batch must be >= 1, not " +
                                    std::to_string(options.micro_batch));
  }
  if (options.seq < 0 || options.seq > config.positions) {
    return Status::invalid_argument("model " + config.name + ": seq " +
                                    std::to_string(options.seq) + " must be in [1, " +
                                    std::to_string(config.positions) +
                                    "] (max_position_embeddings)");
  }
  if (options.cpu_threads < 0) {
    return Status::invalid_argument("model " + config.name + ": cpu_threads must be >= 0");
  }
  const ModelOptions resolved = resolve(config, options);
  if (config.sliding_window && *config.sliding_window < resolved.seq) {
    return Status::invalid_argument(
        "model " + config.name + ": key 'sliding_window' is " +
        std::to_string(*config.sliding_window) + ", shorter than the sequence of " +
        std::to_string(resolved.seq) + " tokens; tierzero computes full causal attention only "
        "(use --seq " + std::to_string(*config.sliding_window) + " or less)");
  }
  auto impl = std::make_unique<Impl>(config, resolved, engine);
  if (lora != nullptr) {
    // A parsed spec was checked against the family's modules; one built in code is checked here
    // for its numbers and a target.
    TZ_RETURN_IF_ERROR(check_lora_values(*lora, "model " + config.name + ": LoRA"));
    if (lora->targets.empty()) {
      return Status::invalid_argument("model " + config.name + ": LoRA needs a target module");
    }
    impl->lora = *lora;
  }
  impl->specs = model::unit_specs(config);
  impl->chunks = llama_vocab_chunks(config);
  impl->bi = block_index(impl->specs[static_cast<std::size_t>(impl->chunks.count)]);
  impl->all_specs = model::unit_specs(config, lora);
  impl->lora_a.fill(-1);
  impl->lora_b.fill(-1);
  for (const zero::UnitSpec& spec : impl->all_specs) {
    TZ_ASSIGN_OR_RETURN(const zero::UnitId id, engine.register_unit(spec));
    impl->all_units.push_back(id);
    if (spec.name.ends_with(".lora")) {
      impl->lora_units.push_back(id);
      impl->lora_specs.push_back(spec);
    } else {
      impl->units.push_back(id);
    }
  }
  if (lora != nullptr) {
    // Tensor indices of each module's A and B inside a layer's adapter unit (the same in every
    // layer).
    const std::span<const std::string_view> names = llama_lora_modules();
    const zero::UnitSpec& first = impl->lora_specs.front();
    for (std::size_t t = 0; t < first.tensors.size(); ++t) {
      for (int k = 0; k < kLoraModules; ++k) {
        const std::string module = "." + std::string(names[static_cast<std::size_t>(k)]) + ".";
        if (first.tensors[t].name.find(module) == std::string::npos) continue;
        (first.tensors[t].name.ends_with("lora_A.weight") ? impl->lora_a : impl->lora_b)
            [static_cast<std::size_t>(k)] = static_cast<int>(t);
      }
    }
  }
  TZ_ASSIGN_OR_RETURN(impl->ops, ops::Ops::create(engine.device(), ops::OpsOptions{options.cpu_threads}));
  impl->layout = make_layout(config, impl->options, impl->act, lora);
  impl->inv_freq = rope_inv_freq(config);
  return std::unique_ptr<Llama>(new Llama(std::move(impl)));
}

Status Llama::init_weights(std::uint64_t seed) {
  Impl& m = *impl_;
  TZ_RETURN_IF_ERROR(m.init_adapters(seed));
  // Each tensor's values come from the stream of its (unit, tensor) in the model without
  // vocabulary chunks, a chunk taking its rows' elements of it: the same weights whatever the
  // chunking.
  LlamaConfig whole = m.config;
  whole.vocab_chunks = 1;
  std::map<std::string, std::pair<std::size_t, std::size_t>, std::less<>> stream_of;
  const std::vector<zero::UnitSpec> whole_specs = model::unit_specs(whole);
  for (std::size_t u = 0; u < whole_specs.size(); ++u) {
    for (std::size_t t = 0; t < whole_specs[u].tensors.size(); ++t) {
      stream_of.emplace(whole_specs[u].tensors[t].name, std::pair{u, t});
    }
  }
  std::vector<float> values;
  for (const HfTensor& tensor : hf_tensors(m.specs)) {
    const std::string& name = tensor.name;
    const auto [su, st] = stream_of.at(name);
    for (const HfTensorPart& part : tensor.parts) {
      values.assign(part.numel, 0.0f);
      if (name.ends_with(".bias")) {
        // zero
      } else if (name.ends_with("norm.weight") || name.ends_with("layernorm.weight")) {
        std::fill(values.begin(), values.end(), 1.0f);
      } else {
        fill_normal(values, m.config.initializer_range, seed, su, st, part.first_elem);
      }
      Status s = m.engine.set_tensor(m.units[part.unit], part.tensor, values);
      if (!s.is_ok()) return std::move(s).with_context("init of " + name);
    }
  }
  return Status::ok();
}

Status Llama::load_weights(const std::string& path) {
  Impl& m = *impl_;
  TZ_RETURN_IF_ERROR(load_hf_weights_folder(
      m.engine, m.specs, m.units, path,
      m.config.tie_word_embeddings ? std::vector<std::string>{"lm_head.weight"}
                                   : std::vector<std::string>{}));
  return m.init_adapters(m.engine.options().seed);
}

Status Llama::save_weights(const std::string& path, DType dtype) {
  Impl& m = *impl_;
  if (m.lora) return save_adapter(path, dtype);
  // The folder the model came from (its tokenizer files are copied), if it came from one.
  std::error_code ec;
  const std::string source =
      std::filesystem::is_directory(m.config.name, ec) ? m.config.name : std::string();
  return save_hf_weights_folder(m.engine, m.specs, m.units, path,
                                llama_hf_config(m.config, dtype), dtype, source);
}

Result<double> Llama::train_micro_batch(std::span<const std::int32_t> tokens,
                                        std::span<const std::int32_t> targets) {
  return impl_->train(tokens, targets);
}

Result<double> Llama::eval_loss(std::span<const std::int32_t> tokens,
                                std::span<const std::int32_t> targets) {
  Impl& m = *impl_;
  TZ_RETURN_IF_ERROR(m.check_batch(tokens, targets, "eval_loss"));
  const std::int64_t b = m.options.micro_batch, t = m.options.seq;
  TZ_RETURN_IF_ERROR(m.upload(tokens, targets));
  TZ_RETURN_IF_ERROR(m.forward_trunk(b, t));
  TZ_RETURN_IF_ERROR(m.head_forward(0, b * t));
  TZ_RETURN_IF_ERROR(m.ops->cross_entropy_forward(m.f(m.layout.losses), m.a(m.layout.logits),
                                                  m.ids(m.layout.targets), b * t, m.config.vocab,
                                                  m.stream()));
  return m.mean_loss(static_cast<std::size_t>(b * t));
}

Result<std::vector<float>> Llama::logits(std::span<const std::int32_t> tokens, int batch,
                                         int length) {
  Impl& m = *impl_;
  TZ_RETURN_IF_ERROR(check_logits_request(m.config.name, m.options.micro_batch, m.options.seq,
                                          tokens.size(), batch, length));
  TZ_RETURN_IF_ERROR(m.upload(tokens, {}));
  TZ_RETURN_IF_ERROR(m.forward_trunk(batch, length));
  TZ_RETURN_IF_ERROR(m.head_forward(0, static_cast<std::int64_t>(tokens.size())));
  return m.download_logits(tokens.size());
}

Result<std::vector<float>> Llama::last_logits(std::span<const std::int32_t> tokens) {
  Impl& m = *impl_;
  TZ_RETURN_IF_ERROR(check_last_logits_request(m.config.name, m.options.seq, tokens.size()));
  const auto n = static_cast<std::int64_t>(tokens.size());
  TZ_RETURN_IF_ERROR(m.upload(tokens, {}));
  TZ_RETURN_IF_ERROR(m.forward_trunk(1, n));
  TZ_RETURN_IF_ERROR(m.head_forward(n - 1, 1));
  return m.download_logits(1);
}

Result<std::vector<float>> Llama::decode(std::span<const std::int32_t> tokens, bool start_over) {
  return impl_->decode(tokens, start_over);
}

const LlamaConfig& Llama::config() const { return impl_->config; }
const std::string& Llama::name() const { return impl_->config.name; }
int Llama::vocab() const { return impl_->config.vocab; }
const ModelOptions& Llama::options() const { return impl_->options; }
std::size_t Llama::unit_count() const { return impl_->all_units.size(); }
zero::UnitId Llama::unit(std::size_t index) const {
  TZ_ASSERT(index < impl_->all_units.size(), "unit index out of range");
  return impl_->all_units[index];
}
const std::vector<zero::UnitSpec>& Llama::unit_specs() const { return impl_->all_specs; }

bool Llama::has_adapter() const { return impl_->lora.has_value(); }

}  // namespace tz::model
