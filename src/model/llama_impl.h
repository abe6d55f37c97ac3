// The Llama family's implementation state (model/llama.cc), shared with its LoRA half
// (model/llama_lora.cc): the activation layout, the block tensor index and Llama::Impl with the
// forward, backward and decoding passes. Internal to those two files.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/assert.h"
#include "model/act_bump.h"
#include "model/batch_ids.h"
#include "model/init.h"
#include "model/llama.h"
#include "model/lora.h"
#include "ops/ops.h"

namespace tz::model {
namespace llama_internal {

// LoRA's module kinds in layer order (model/lora.h's llama_lora_modules()).
enum LoraModule : int { kModQ, kModK, kModV, kModO, kModGate, kModUp, kModDown, kLoraModules };

// Which modules carry adapters (by LoraModule), from the spec's target names.
inline std::array<bool, kLoraModules> lora_targeted(const LoraSpec* lora) {
  std::array<bool, kLoraModules> on{};
  if (lora == nullptr) return on;
  const std::span<const std::string_view> names = llama_lora_modules();
  for (int k = 0; k < kLoraModules; ++k) {
    on[static_cast<std::size_t>(k)] =
        std::find(lora->targets.begin(), lora->targets.end(), names[static_cast<std::size_t>(k)]) !=
        lora->targets.end();
  }
  return on;
}

inline ModelOptions resolve(const LlamaConfig& c, ModelOptions o) {
  if (o.seq == 0) o.seq = c.positions;
  o.checkpointing = checkpointing_enabled(c, o) ? 1 : 0;
  return o;
}

// One block's activations (byte offsets): what its backward needs.
struct BlockActs {
  std::size_t ln1, rstd1, q_raw, rstd_q, k_raw, rstd_k, q, k, v, att, lse, res2, ln2, rstd2, gate,
      up, mid;
  // LoRA, per targeted module: the adapter's scaled hidden (alpha / r) A x (rows, r), and with
  // dropout its keep mask (rows, in) of uint8.
  std::array<std::size_t, kLoraModules> lora_u{}, lora_keep{};
};

struct ActLayout {
  std::size_t tokens = 0, targets = 0;
  std::vector<std::size_t> residual;  // L+1 of act (B*T, H)
  std::vector<BlockActs> blocks;      // L sets, or 1 with checkpointing
  std::size_t lnf = 0, rstd_f = 0, logits = 0, losses = 0;
  // With vocabulary chunks: one chunk's logits or their gradient (rows, chunk rows), copied into
  // and out of the columns of logits.
  std::size_t head_tmp = 0;
  // Backward scratch: the residual stream's gradient, the gradient of a norm's output or of the
  // attention output (rows, max(H, Q)), dq, dk, dv, the MLP's three (rows, F), delta, and for
  // q/k norms the gradients of the raw projections.
  std::size_t dres = 0, dc = 0, dq = 0, dk = 0, dv = 0, dq_raw = 0, dk_raw = 0, dg = 0, du = 0,
              dh = 0, delta = 0, inv_freq = 0;
  // LoRA scratch: B's output before it is added (rows, max out), the gradient of the adapter's
  // hidden (rows, r), and with dropout the dropped input and its gradient (rows, max in).
  std::size_t lora_tmp = 0, lora_du = 0, lora_xd = 0, lora_dxd = 0;
  std::size_t total = 0;
};

inline ActLayout make_layout(const LlamaConfig& c, const ModelOptions& o, DType act,
                      const LoraSpec* lora) {
  const std::size_t rows = static_cast<std::size_t>(o.micro_batch) * static_cast<std::size_t>(o.seq);
  const auto h = static_cast<std::size_t>(c.hidden);
  const std::size_t q = static_cast<std::size_t>(c.heads) * static_cast<std::size_t>(c.head_dim);
  const std::size_t kv =
      static_cast<std::size_t>(c.kv_heads) * static_cast<std::size_t>(c.head_dim);
  const auto f = static_cast<std::size_t>(c.ffn);
  const auto v = static_cast<std::size_t>(c.vocab);
  const auto nq = static_cast<std::size_t>(c.heads);
  const auto nkv = static_cast<std::size_t>(c.kv_heads);
  const std::size_t es = dtype_size(act);
  ActLayout l;
  ActBump bump;
  l.tokens = bump.take(rows * 4);
  l.targets = bump.take(rows * 4);
  for (int i = 0; i <= c.layers; ++i) l.residual.push_back(bump.take(rows * h * es));
  const int sets = o.checkpointing != 0 ? 1 : c.layers;
  for (int i = 0; i < sets; ++i) {
    BlockActs b{};
    b.ln1 = bump.take(rows * h * es);
    b.rstd1 = bump.take(rows * 4);
    if (c.qk_norm) {
      b.q_raw = bump.take(rows * q * es);
      b.rstd_q = bump.take(rows * nq * 4);
      b.k_raw = bump.take(rows * kv * es);
      b.rstd_k = bump.take(rows * nkv * 4);
    }
    b.q = bump.take(rows * q * es);
    b.k = bump.take(rows * kv * es);
    b.v = bump.take(rows * kv * es);
    b.att = bump.take(rows * q * es);
    b.lse = bump.take(rows * nq * 4);
    b.res2 = bump.take(rows * h * es);
    b.ln2 = bump.take(rows * h * es);
    b.rstd2 = bump.take(rows * 4);
    b.gate = bump.take(rows * f * es);
    b.up = bump.take(rows * f * es);
    b.mid = bump.take(rows * f * es);
    const std::array<bool, kLoraModules> on = lora_targeted(lora);
    for (int k = 0; k < kLoraModules; ++k) {
      if (!on[static_cast<std::size_t>(k)]) continue;
      b.lora_u[static_cast<std::size_t>(k)] =
          bump.take(rows * static_cast<std::size_t>(lora->r) * es);
      if (lora->dropout > 0) {
        b.lora_keep[static_cast<std::size_t>(k)] =
            bump.take(rows * static_cast<std::size_t>(llama_lora_dims(c, k).first));
      }
    }
    l.blocks.push_back(b);
  }
  l.lnf = bump.take(rows * h * es);
  l.rstd_f = bump.take(rows * 4);
  l.logits = bump.take(rows * v * es);
  l.losses = bump.take(rows * 4);
  const VocabChunks chunks = llama_vocab_chunks(c);
  if (chunks.count > 1) l.head_tmp = bump.take(rows * static_cast<std::size_t>(chunks.rows) * es);
  l.dres = bump.take(rows * h * es);
  l.dc = bump.take(rows * std::max(h, q) * es);
  l.dq = bump.take(rows * q * es);
  l.dk = bump.take(rows * kv * es);
  l.dv = bump.take(rows * kv * es);
  if (c.qk_norm) {
    l.dq_raw = bump.take(rows * q * es);
    l.dk_raw = bump.take(rows * kv * es);
  }
  l.dg = bump.take(rows * f * es);
  l.du = bump.take(rows * f * es);
  l.dh = bump.take(rows * f * es);
  l.delta = bump.take(rows * nq * 4);
  l.inv_freq = bump.take(static_cast<std::size_t>(c.head_dim / 2) * 4);
  if (lora != nullptr) {
    std::int64_t max_in = 0, max_out = 0;
    const std::array<bool, kLoraModules> on = lora_targeted(lora);
    for (int k = 0; k < kLoraModules; ++k) {
      if (!on[static_cast<std::size_t>(k)]) continue;
      max_in = std::max(max_in, llama_lora_dims(c, k).first);
      max_out = std::max(max_out, llama_lora_dims(c, k).second);
    }
    l.lora_tmp = bump.take(rows * static_cast<std::size_t>(max_out) * es);
    l.lora_du = bump.take(rows * static_cast<std::size_t>(lora->r) * es);
    if (lora->dropout > 0) {
      l.lora_xd = bump.take(rows * static_cast<std::size_t>(max_in) * es);
      l.lora_dxd = bump.take(rows * static_cast<std::size_t>(max_in) * es);
    }
  }
  l.total = bump.total();
  return l;
}

// Tensor indices inside a block unit (-1: the config has no such tensor).
struct BlockIndex {
  int ln1 = -1, qw = -1, qb = -1, kw = -1, kb = -1, vw = -1, vb = -1, ow = -1, ob = -1, qn = -1,
      kn = -1, ln2 = -1, gw = -1, gb = -1, uw = -1, ub = -1, dw = -1, db = -1;
};

inline BlockIndex block_index(const zero::UnitSpec& block) {
  BlockIndex x;
  const std::pair<std::string_view, int BlockIndex::*> names[] = {
      {"input_layernorm.weight", &BlockIndex::ln1},
      {"self_attn.q_proj.weight", &BlockIndex::qw},
      {"self_attn.q_proj.bias", &BlockIndex::qb},
      {"self_attn.k_proj.weight", &BlockIndex::kw},
      {"self_attn.k_proj.bias", &BlockIndex::kb},
      {"self_attn.v_proj.weight", &BlockIndex::vw},
      {"self_attn.v_proj.bias", &BlockIndex::vb},
      {"self_attn.o_proj.weight", &BlockIndex::ow},
      {"self_attn.o_proj.bias", &BlockIndex::ob},
      {"self_attn.q_norm.weight", &BlockIndex::qn},
      {"self_attn.k_norm.weight", &BlockIndex::kn},
      {"post_attention_layernorm.weight", &BlockIndex::ln2},
      {"mlp.gate_proj.weight", &BlockIndex::gw},
      {"mlp.gate_proj.bias", &BlockIndex::gb},
      {"mlp.up_proj.weight", &BlockIndex::uw},
      {"mlp.up_proj.bias", &BlockIndex::ub},
      {"mlp.down_proj.weight", &BlockIndex::dw},
      {"mlp.down_proj.bias", &BlockIndex::db},
  };
  for (std::size_t t = 0; t < block.tensors.size(); ++t) {
    const std::string& n = block.tensors[t].name;
    for (const auto& [suffix, member] : names) {
      if (n.ends_with(suffix)) x.*member = static_cast<int>(t);
    }
  }
  return x;
}

inline ops::ConstTensor in(const zero::UnitViews& v, int i) {
  if (i < 0) return {};
  return {v[static_cast<std::size_t>(i)].data, v[static_cast<std::size_t>(i)].dtype};
}
// A gradient view, or none (not wanted) for a tensor the config lacks or a frozen unit's (whose
// views are empty: frozen units have no gradients).
inline ops::Tensor out(const zero::UnitViews& v, int i) {
  if (i < 0 || static_cast<std::size_t>(i) >= v.tensors.size()) return {};
  return {v[static_cast<std::size_t>(i)].data, v[static_cast<std::size_t>(i)].dtype};
}

// Where one forward pass of a block reads and writes keys and values: the training layout (the
// block's own k/v, positions from 0) or one step of decoding (the layer's cache, positions after
// the cached ones).
struct Pass {
  std::int64_t b = 0, t = 0;  // sequences and new tokens per sequence
  std::int64_t pos = 0;       // position of the first new token
  std::byte* k_base = nullptr;  // keys/values of positions [0, pos + t)
  std::byte* v_base = nullptr;
};

}  // namespace llama_internal
using namespace llama_internal;  // NOLINT(google-build-using-namespace): internal header

struct Llama::Impl {
  Impl(const LlamaConfig& c, const ModelOptions& o, zero::Engine& e)
      : config(c), options(o), engine(e), act(e.compute_dtype()) {}

  LlamaConfig config;
  ModelOptions options;  // resolved
  zero::Engine& engine;
  DType act;
  std::vector<zero::UnitSpec> specs;  // the base's units
  // embed (or embed.0 .. embed.{C-1}), layers.0 .. layers.{L-1}, norm[, lm_head.0 ..
  // lm_head.{C-1}]
  std::vector<zero::UnitId> units;
  VocabChunks chunks;
  BlockIndex bi;
  // LoRA: the spec, each layer's adapter unit, the A and B tensor index of each module in it (-1:
  // not targeted), and every unit in registration order (the base's interleaved with adapters).
  std::optional<LoraSpec> lora;
  std::vector<zero::UnitSpec> lora_specs;
  std::vector<zero::UnitId> lora_units;
  std::array<int, kLoraModules> lora_a{}, lora_b{};
  std::vector<zero::UnitSpec> all_specs;
  std::vector<zero::UnitId> all_units;
  bool training = false;        // dropout on (train's forward and its recompute)
  std::uint64_t dropout_draw = 0;  // micro-batches trained: the dropout masks' stream
  std::vector<std::uint8_t> host_keep;
  std::vector<float> host_uniform;
  std::unique_ptr<ops::Ops> ops;
  ActLayout layout;
  gpu::DeviceBuffer acts;
  gpu::DeviceBuffer cache;  // decoding: keys then values, (layers, seq, kv_heads*head_dim) each
  std::int64_t cache_len = 0;
  std::vector<std::int32_t> host_ids;
  std::vector<float> host_losses;
  std::vector<float> inv_freq;

  std::int64_t q_dim() const { return static_cast<std::int64_t>(config.heads) * config.head_dim; }
  std::int64_t kv_dim() const {
    return static_cast<std::int64_t>(config.kv_heads) * config.head_dim;
  }
  float scale() const { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.head_dim))); }
  float eps() const { return static_cast<float>(config.rms_norm_eps); }
  int chunk_count() const { return chunks.count; }
  zero::UnitId embed_unit(int c = 0) const { return units[static_cast<std::size_t>(c)]; }
  zero::UnitId block_unit(int i) const {
    return units[static_cast<std::size_t>(i) + static_cast<std::size_t>(chunks.count)];
  }
  zero::UnitId norm_unit() const {
    return units[static_cast<std::size_t>(chunks.count) + static_cast<std::size_t>(config.layers)];
  }
  // The LM head's chunk c (chunks > 1): the embedding's when tied, else lm_head.{c}.
  zero::UnitId head_unit(int c) const {
    if (config.tie_word_embeddings) return embed_unit(c);
    return units[static_cast<std::size_t>(chunks.count + config.layers + 1 + c)];
  }
  // The decoder layer of base unit `u` (one of layers.{i}).
  int layer_of(std::size_t u) const { return static_cast<int>(u) - chunks.count; }
  std::int64_t chunk_first(int c) const { return chunks.first(c); }
  std::int64_t chunk_size(int c) const { return chunks.size(c, config.vocab); }
  gpu::Stream& stream() { return engine.compute_stream(); }

  std::byte* base() const { return static_cast<std::byte*>(acts.data()); }
  ops::Tensor a(std::size_t offset) const { return {base() + offset, act}; }
  ops::Tensor a_at(std::size_t offset, std::int64_t row, std::int64_t width) const {
    return {base() + offset + static_cast<std::size_t>(row * width) * dtype_size(act), act};
  }
  float* f(std::size_t offset) const { return reinterpret_cast<float*>(base() + offset); }
  std::int32_t* ids(std::size_t offset) const {
    return reinterpret_cast<std::int32_t*>(base() + offset);
  }
  const BlockActs& block_acts(int i) const {
    return layout.blocks[options.checkpointing != 0 ? 0 : static_cast<std::size_t>(i)];
  }

  // Every adapter from the spec's PEFT folder (LoraSpec::adapter) when it holds weights, else as
  // PEFT starts it: lora_A Kaiming-uniform from (seed, unit, tensor), lora_B 0.
  Status init_adapters(std::uint64_t seed);
  // DIR/adapter_model.safetensors into the adapters: true, or false when there is none.
  Result<bool> load_adapter(const std::string& dir);

  bool frozen() const { return lora.has_value(); }
  // The unit's gradient views, or none for a frozen unit (the base under LoRA).
  Result<zero::UnitViews> grads(zero::UnitId unit) {
    if (frozen()) return zero::UnitViews{};
    return engine.grad(unit);
  }
  Status reduce(zero::UnitId unit) { return frozen() ? Status::ok() : engine.reduce(unit); }
  // Layer i's adapters gathered (empty views without LoRA) and released.
  Result<zero::UnitViews> gather_lora(int i) {
    if (!lora) return zero::UnitViews{};
    return engine.gather(lora_units[static_cast<std::size_t>(i)]);
  }
  Status release_lora(int i) {
    return lora ? engine.release(lora_units[static_cast<std::size_t>(i)]) : Status::ok();
  }
  bool lora_on(int k) const { return lora && lora_a[static_cast<std::size_t>(k)] >= 0; }
  bool dropout_on() const { return training && lora && lora->dropout > 0; }

  // Dropout's keep mask of module k in layer i for this micro-batch (rows, in), drawn on the host
  // from (seed, micro-batch, layer, module) so the recompute of a checkpointed block draws the
  // same one, and uploaded into the block's activations.
  Status upload_keep(int i, int k, std::int64_t rows) {
    const std::size_t n = static_cast<std::size_t>(rows * llama_lora_dims(config, k).first);
    host_uniform.resize(n);
    host_keep.resize(n);
    fill_uniform(host_uniform, 1.0, engine.options().seed ^ (dropout_draw * 0x9e3779b97f4a7c15ULL),
                 static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(k));
    const double p = lora->dropout;
    for (std::size_t e = 0; e < n; ++e) {
      host_keep[e] = static_cast<std::uint8_t>((host_uniform[e] + 1.0) * 0.5 >= p);
    }
    TZ_RETURN_IF_ERROR(engine.device().copy_async(
        base() + block_acts(i).lora_keep[static_cast<std::size_t>(k)], host_keep.data(), n,
        gpu::CopyKind::kHostToDevice, stream()));
    return stream().synchronize();  // host_keep is reused for the next mask
  }
  const std::uint8_t* keep(int i, int k) const {
    return reinterpret_cast<const std::uint8_t*>(
        base() + block_acts(i).lora_keep[static_cast<std::size_t>(k)]);
  }
  float dropout_scale() const { return static_cast<float>(1.0 / (1.0 - lora->dropout)); }
  float lora_scale() const { return static_cast<float>(lora->scale()); }

  // Module k's adapter on input x (rows, in): u = (alpha / r) A dropout(x) kept for backward and,
  // with `to_output`, y += B u.
  Status lora_forward(const zero::UnitViews& lp, int i, int k, ops::ConstTensor x, ops::Tensor y,
                      std::int64_t rows, bool to_output) {
    if (!lora_on(k)) return Status::ok();
    const auto [in_dim, out_dim] = llama_lora_dims(config, k);
    const std::int64_t r = lora->r;
    const ops::Tensor u = a(block_acts(i).lora_u[static_cast<std::size_t>(k)]);
    gpu::Stream& st = stream();
    ops::ConstTensor xin = x;
    if (dropout_on()) {
      TZ_RETURN_IF_ERROR(upload_keep(i, k, rows));
      TZ_RETURN_IF_ERROR(ops->scale(a(layout.lora_xd), ops::Accumulate::kOverwrite, x, keep(i, k),
                                    dropout_scale(), rows * in_dim, st));
      xin = a(layout.lora_xd);
    }
    TZ_RETURN_IF_ERROR(ops->matmul_forward(u, xin, in(lp, lora_a[static_cast<std::size_t>(k)]),
                                           ops::WeightLayout::kOutIn, {}, rows, in_dim, r, st));
    TZ_RETURN_IF_ERROR(ops->scale(u, ops::Accumulate::kOverwrite, u, nullptr, lora_scale(),
                                  rows * r, st));
    if (!to_output) return Status::ok();
    TZ_RETURN_IF_ERROR(ops->matmul_forward(a(layout.lora_tmp), u,
                                           in(lp, lora_b[static_cast<std::size_t>(k)]),
                                           ops::WeightLayout::kOutIn, {}, rows, r, out_dim, st));
    return ops->residual_forward(y, y, a(layout.lora_tmp), rows * out_dim, st);
  }

  // Module k's adapter backward from dy (rows, out): dB += u^T dy, dA += (alpha / r) (B^T dy)^T
  // dropout(x), and dx += the adapter's input gradient.
  Status lora_backward(const zero::UnitViews& lp, const zero::UnitViews& lg, int i, int k,
                       ops::ConstTensor x, ops::ConstTensor dy, ops::Tensor dx,
                       std::int64_t rows) {
    if (!lora_on(k)) return Status::ok();
    const auto [in_dim, out_dim] = llama_lora_dims(config, k);
    const std::int64_t r = lora->r;
    const std::size_t ak = static_cast<std::size_t>(lora_a[static_cast<std::size_t>(k)]);
    const std::size_t bk = static_cast<std::size_t>(lora_b[static_cast<std::size_t>(k)]);
    const ops::Tensor du = a(layout.lora_du);
    gpu::Stream& st = stream();
    using ops::Accumulate;
    constexpr auto kOI = ops::WeightLayout::kOutIn;
    TZ_RETURN_IF_ERROR(ops->matmul_backward(du, Accumulate::kOverwrite, out(lg, static_cast<int>(bk)),
                                            {}, dy, a(block_acts(i).lora_u[static_cast<std::size_t>(k)]),
                                            in(lp, static_cast<int>(bk)), kOI, rows, r, out_dim, st));
    TZ_RETURN_IF_ERROR(ops->scale(du, Accumulate::kOverwrite, du, nullptr, lora_scale(), rows * r, st));
    if (!dropout_on()) {
      return ops->matmul_backward(dx, Accumulate::kAdd, out(lg, static_cast<int>(ak)), {}, du, x,
                                  in(lp, static_cast<int>(ak)), kOI, rows, in_dim, r, st);
    }
    TZ_RETURN_IF_ERROR(ops->scale(a(layout.lora_xd), Accumulate::kOverwrite, x, keep(i, k),
                                  dropout_scale(), rows * in_dim, st));
    TZ_RETURN_IF_ERROR(ops->matmul_backward(a(layout.lora_dxd), Accumulate::kOverwrite,
                                            out(lg, static_cast<int>(ak)), {}, du,
                                            a(layout.lora_xd), in(lp, static_cast<int>(ak)), kOI,
                                            rows, in_dim, r, st));
    return ops->scale(dx, Accumulate::kAdd, a(layout.lora_dxd), keep(i, k), dropout_scale(),
                      rows * in_dim, st);
  }

  Status ensure_buffers() {
    if (!acts.empty()) return Status::ok();
    Result<gpu::DeviceBuffer> buffer = engine.device().allocate(layout.total);
    if (!buffer.is_ok()) {
      return std::move(buffer).take_status().with_context(
          "model " + config.name + ": activations of one micro-batch (B=" +
          std::to_string(options.micro_batch) + ", T=" + std::to_string(options.seq) + ")");
    }
    acts = std::move(buffer).value();
    // The rotary frequencies, uploaded once.
    TZ_RETURN_IF_ERROR(engine.device().copy_async(f(layout.inv_freq), inv_freq.data(),
                                                  inv_freq.size() * sizeof(float),
                                                  gpu::CopyKind::kHostToDevice, stream()));
    return stream().synchronize();
  }

  Status upload(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    TZ_RETURN_IF_ERROR(ensure_buffers());
    return upload_token_ids(engine.device(), stream(), config.name, config.vocab, tokens, targets,
                            ids(layout.tokens), ids(layout.targets), host_ids);
  }

  Pass training_pass(int i, std::int64_t b, std::int64_t t) const {
    const BlockActs& s = block_acts(i);
    return Pass{b, t, 0, base() + s.k, base() + s.v};
  }

  // Forward of block i on the pass's rows from residual[i]. With `to_output` it also writes
  // residual[i+1]; without (the recompute in backward) it stops at what the backward needs.
  Status block_forward(const zero::UnitViews& p, const zero::UnitViews& lp, int i, const Pass& pass,
                       bool to_output) {
    const std::int64_t rows = pass.b * pass.t;
    const std::int64_t h = config.hidden, q = q_dim(), kv = kv_dim(), ff = config.ffn;
    const std::int64_t hd = config.head_dim;
    const BlockActs& s = block_acts(i);
    const ops::Tensor x = a(layout.residual[static_cast<std::size_t>(i)]);
    gpu::Stream& st = stream();
    using ops::WeightLayout;
    const std::size_t kv_offset = static_cast<std::size_t>(pass.pos * kv) * dtype_size(act);
    const ops::Tensor k_new{pass.k_base + kv_offset, act};
    const ops::Tensor v_new{pass.v_base + kv_offset, act};
    const ops::Tensor q_proj = config.qk_norm ? a(s.q_raw) : a(s.q);
    const ops::Tensor k_proj = config.qk_norm ? a(s.k_raw) : k_new;
    TZ_RETURN_IF_ERROR(ops->rmsnorm_forward(a(s.ln1), f(s.rstd1), x, in(p, bi.ln1), eps(), rows, h, st));
    TZ_RETURN_IF_ERROR(ops->matmul_forward(q_proj, a(s.ln1), in(p, bi.qw), WeightLayout::kOutIn,
                                           in(p, bi.qb), rows, h, q, st));
    TZ_RETURN_IF_ERROR(lora_forward(lp, i, kModQ, a(s.ln1), q_proj, rows, true));
    TZ_RETURN_IF_ERROR(ops->matmul_forward(k_proj, a(s.ln1), in(p, bi.kw), WeightLayout::kOutIn,
                                           in(p, bi.kb), rows, h, kv, st));
    TZ_RETURN_IF_ERROR(lora_forward(lp, i, kModK, a(s.ln1), k_proj, rows, true));
    TZ_RETURN_IF_ERROR(ops->matmul_forward(v_new, a(s.ln1), in(p, bi.vw), WeightLayout::kOutIn,
                                           in(p, bi.vb), rows, h, kv, st));
    TZ_RETURN_IF_ERROR(lora_forward(lp, i, kModV, a(s.ln1), v_new, rows, true));
    if (config.qk_norm) {
      TZ_RETURN_IF_ERROR(ops->rmsnorm_forward(a(s.q), f(s.rstd_q), a(s.q_raw), in(p, bi.qn), eps(),
                                              rows * config.heads, hd, st));
      TZ_RETURN_IF_ERROR(ops->rmsnorm_forward(k_new, f(s.rstd_k), a(s.k_raw), in(p, bi.kn), eps(),
                                              rows * config.kv_heads, hd, st));
    }
    TZ_RETURN_IF_ERROR(ops->rope_forward(a(s.q), f(layout.inv_freq), pass.b, pass.t, config.heads,
                                         hd, q, pass.pos, st));
    TZ_RETURN_IF_ERROR(ops->rope_forward(k_new, f(layout.inv_freq), pass.b, pass.t,
                                         config.kv_heads, hd, kv, pass.pos, st));
    TZ_RETURN_IF_ERROR(ops->gqa_attention_forward(
        a(s.att), f(s.lse), a(s.q), ops::ConstTensor{pass.k_base, act},
        ops::ConstTensor{pass.v_base, act}, pass.b, pass.t, pass.pos + pass.t, config.heads,
        config.kv_heads, hd, q, kv, scale(), st));
    TZ_RETURN_IF_ERROR(ops->matmul_forward(a(s.res2), a(s.att), in(p, bi.ow), WeightLayout::kOutIn,
                                           in(p, bi.ob), rows, q, h, st));
    TZ_RETURN_IF_ERROR(lora_forward(lp, i, kModO, a(s.att), a(s.res2), rows, true));
    TZ_RETURN_IF_ERROR(ops->residual_forward(a(s.res2), a(s.res2), x, rows * h, st));
    TZ_RETURN_IF_ERROR(ops->rmsnorm_forward(a(s.ln2), f(s.rstd2), a(s.res2), in(p, bi.ln2), eps(),
                                            rows, h, st));
    TZ_RETURN_IF_ERROR(ops->matmul_forward(a(s.gate), a(s.ln2), in(p, bi.gw), WeightLayout::kOutIn,
                                           in(p, bi.gb), rows, h, ff, st));
    TZ_RETURN_IF_ERROR(lora_forward(lp, i, kModGate, a(s.ln2), a(s.gate), rows, true));
    TZ_RETURN_IF_ERROR(ops->matmul_forward(a(s.up), a(s.ln2), in(p, bi.uw), WeightLayout::kOutIn,
                                           in(p, bi.ub), rows, h, ff, st));
    TZ_RETURN_IF_ERROR(lora_forward(lp, i, kModUp, a(s.ln2), a(s.up), rows, true));
    TZ_RETURN_IF_ERROR(ops->swiglu_forward(a(s.mid), a(s.gate), a(s.up), rows, ff, ff, st));
    const ops::Tensor y = a(layout.residual[static_cast<std::size_t>(i) + 1]);
    // The recompute stops before down_proj but its adapter's hidden is what backward needs.
    if (!to_output) return lora_forward(lp, i, kModDown, a(s.mid), y, rows, false);
    TZ_RETURN_IF_ERROR(ops->matmul_forward(y, a(s.mid), in(p, bi.dw), WeightLayout::kOutIn,
                                           in(p, bi.db), rows, ff, h, st));
    TZ_RETURN_IF_ERROR(lora_forward(lp, i, kModDown, a(s.mid), y, rows, true));
    return ops->residual_forward(y, y, a(s.res2), rows * h, st);
  }

  // Backward of block i: dres holds d(residual[i+1]) and becomes d(residual[i]); the parameter
  // gradients accumulate into g.
  Status block_backward(const zero::UnitViews& p, const zero::UnitViews& g,
                        const zero::UnitViews& lp, const zero::UnitViews& lg, int i, std::int64_t b,
                        std::int64_t t) {
    const std::int64_t rows = b * t;
    const std::int64_t h = config.hidden, q = q_dim(), kv = kv_dim(), ff = config.ffn;
    const std::int64_t hd = config.head_dim;
    const BlockActs& s = block_acts(i);
    const ops::Tensor x = a(layout.residual[static_cast<std::size_t>(i)]);
    const ops::Tensor dres = a(layout.dres), dc = a(layout.dc);
    gpu::Stream& st = stream();
    using ops::Accumulate;
    using ops::WeightLayout;
    constexpr auto kO = Accumulate::kOverwrite;
    constexpr auto kA = Accumulate::kAdd;
    constexpr auto kOI = WeightLayout::kOutIn;
    // MLP: y = res2 + down(silu(gate(ln2)) * up(ln2)), ln2 = rmsnorm(res2).
    TZ_RETURN_IF_ERROR(ops->matmul_backward(a(layout.dh), kO, out(g, bi.dw), out(g, bi.db), dres,
                                            a(s.mid), in(p, bi.dw), kOI, rows, ff, h, st));
    TZ_RETURN_IF_ERROR(lora_backward(lp, lg, i, kModDown, a(s.mid), dres, a(layout.dh), rows));
    TZ_RETURN_IF_ERROR(ops->swiglu_backward(a(layout.dg), a(layout.du), a(layout.dh), a(s.gate),
                                            a(s.up), rows, ff, ff, st));
    TZ_RETURN_IF_ERROR(ops->matmul_backward(dc, kO, out(g, bi.gw), out(g, bi.gb), a(layout.dg),
                                            a(s.ln2), in(p, bi.gw), kOI, rows, h, ff, st));
    TZ_RETURN_IF_ERROR(lora_backward(lp, lg, i, kModGate, a(s.ln2), a(layout.dg), dc, rows));
    TZ_RETURN_IF_ERROR(ops->matmul_backward(dc, kA, out(g, bi.uw), out(g, bi.ub), a(layout.du),
                                            a(s.ln2), in(p, bi.uw), kOI, rows, h, ff, st));
    TZ_RETURN_IF_ERROR(lora_backward(lp, lg, i, kModUp, a(s.ln2), a(layout.du), dc, rows));
    TZ_RETURN_IF_ERROR(ops->rmsnorm_backward(dres, kA, out(g, bi.ln2), dc, a(s.res2),
                                             in(p, bi.ln2), f(s.rstd2), rows, h, st));
    // Attention: res2 = x + o(attention(rope(q), rope(k), v)), q/k/v of ln1 = rmsnorm(x).
    TZ_RETURN_IF_ERROR(ops->matmul_backward(dc, kO, out(g, bi.ow), out(g, bi.ob), dres, a(s.att),
                                            in(p, bi.ow), kOI, rows, q, h, st));
    TZ_RETURN_IF_ERROR(lora_backward(lp, lg, i, kModO, a(s.att), dres, dc, rows));
    TZ_RETURN_IF_ERROR(ops->gqa_attention_backward(
        a(layout.dq), a(layout.dk), a(layout.dv), kO, f(layout.delta), dc, a(s.q), a(s.k),
        a(s.v), a(s.att), f(s.lse), b, t, config.heads, config.kv_heads, hd, q, kv, scale(), st));
    TZ_RETURN_IF_ERROR(ops->rope_backward(a(layout.dq), f(layout.inv_freq), b, t, config.heads,
                                          hd, q, 0, st));
    TZ_RETURN_IF_ERROR(ops->rope_backward(a(layout.dk), f(layout.inv_freq), b, t,
                                          config.kv_heads, hd, kv, 0, st));
    ops::Tensor dq = a(layout.dq), dk = a(layout.dk);
    if (config.qk_norm) {
      TZ_RETURN_IF_ERROR(ops->rmsnorm_backward(a(layout.dq_raw), kO, out(g, bi.qn), dq,
                                               a(s.q_raw), in(p, bi.qn), f(s.rstd_q),
                                               rows * config.heads, hd, st));
      TZ_RETURN_IF_ERROR(ops->rmsnorm_backward(a(layout.dk_raw), kO, out(g, bi.kn), dk,
                                               a(s.k_raw), in(p, bi.kn), f(s.rstd_k),
                                               rows * config.kv_heads, hd, st));
      dq = a(layout.dq_raw);
      dk = a(layout.dk_raw);
    }
    TZ_RETURN_IF_ERROR(ops->matmul_backward(dc, kO, out(g, bi.qw), out(g, bi.qb), dq, a(s.ln1),
                                            in(p, bi.qw), kOI, rows, h, q, st));
    TZ_RETURN_IF_ERROR(lora_backward(lp, lg, i, kModQ, a(s.ln1), dq, dc, rows));
    TZ_RETURN_IF_ERROR(ops->matmul_backward(dc, kA, out(g, bi.kw), out(g, bi.kb), dk, a(s.ln1),
                                            in(p, bi.kw), kOI, rows, h, kv, st));
    TZ_RETURN_IF_ERROR(lora_backward(lp, lg, i, kModK, a(s.ln1), dk, dc, rows));
    TZ_RETURN_IF_ERROR(ops->matmul_backward(dc, kA, out(g, bi.vw), out(g, bi.vb), a(layout.dv),
                                            a(s.ln1), in(p, bi.vw), kOI, rows, h, kv, st));
    TZ_RETURN_IF_ERROR(lora_backward(lp, lg, i, kModV, a(s.ln1), a(layout.dv), dc, rows));
    return ops->rmsnorm_backward(dres, kA, out(g, bi.ln1), dc, x, in(p, bi.ln1), f(s.rstd1), rows,
                                 h, st);
  }

  // The token embedding into residual[0]; with vocabulary chunks, each chunk gathered in turn
  // fills the rows whose tokens it holds.
  Status embed(std::int64_t b, std::int64_t t) {
    for (int c = 0; c < chunk_count(); ++c) {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(embed_unit(c)));
      TZ_RETURN_IF_ERROR(ops->embedding_forward(a(layout.residual[0]), ids(layout.tokens),
                                                in(p, 0), ops::ConstTensor{}, b, t,
                                                config.hidden, config.vocab, stream(),
                                                chunk_first(c), chunk_size(c)));
      TZ_RETURN_IF_ERROR(engine.release(embed_unit(c)));
    }
    return Status::ok();
  }

  // Where chunk c's columns start in layout.logits (rows, vocab); columns_to_tmp copies them into
  // layout.head_tmp (rows, the chunk's size).
  ops::Tensor logit_columns(int c) const {
    return {base() + layout.logits + static_cast<std::size_t>(chunk_first(c)) * dtype_size(act),
            act};
  }
  Status columns_to_tmp(int c, std::int64_t rows) {
    return ops->copy_block(a(layout.head_tmp), chunk_size(c), logit_columns(c), config.vocab,
                           rows, chunk_size(c), stream());
  }

  // Chunked LM head, forward: the logits of `rows` rows of layout.lnf, chunk by chunk (each
  // chunk's head weights gathered, multiplied into head_tmp, copied into its columns, released).
  Status chunked_logits(std::int64_t rows) {
    for (int c = 0; c < chunk_count(); ++c) {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews w, engine.gather(head_unit(c)));
      TZ_RETURN_IF_ERROR(ops->matmul_forward(a(layout.head_tmp), a(layout.lnf), in(w, 0),
                                             ops::WeightLayout::kOutIn, {}, rows, config.hidden,
                                             chunk_size(c), stream()));
      TZ_RETURN_IF_ERROR(ops->copy_block(logit_columns(c), config.vocab, a(layout.head_tmp),
                                         chunk_size(c), rows, chunk_size(c), stream()));
      TZ_RETURN_IF_ERROR(engine.release(head_unit(c)));
    }
    return Status::ok();
  }

  // Embedding and every block on b*t tokens already on the device (positions from 0).
  Status forward_trunk(std::int64_t b, std::int64_t t) {
    TZ_RETURN_IF_ERROR(embed(b, t));
    for (int i = 0; i < config.layers; ++i) {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(block_unit(i)));
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews lp, gather_lora(i));
      TZ_RETURN_IF_ERROR(block_forward(p, lp, i, training_pass(i, b, t), /*to_output=*/true));
      TZ_RETURN_IF_ERROR(engine.release(block_unit(i)));
      TZ_RETURN_IF_ERROR(release_lora(i));
    }
    return Status::ok();
  }

  // The final norm of `rows` rows of residual[L] starting at row `first`, then their logits into
  // the first rows of layout.logits. The norm unit (and, tied, the embedding) gathered here.
  Status head_forward(std::int64_t first, std::int64_t rows) {
    const std::int64_t h = config.hidden;
    gpu::Stream& st = stream();
    TZ_ASSIGN_OR_RETURN(const zero::UnitViews n, engine.gather(norm_unit()));
    TZ_RETURN_IF_ERROR(ops->rmsnorm_forward(
        a(layout.lnf), f(layout.rstd_f),
        a_at(layout.residual[static_cast<std::size_t>(config.layers)], first, h), in(n, 0), eps(),
        rows, h, st));
    if (chunk_count() > 1) {
      TZ_RETURN_IF_ERROR(chunked_logits(rows));
    } else if (config.tie_word_embeddings) {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews e, engine.gather(embed_unit()));
      TZ_RETURN_IF_ERROR(ops->matmul_forward(a(layout.logits), a(layout.lnf), in(e, 0),
                                             ops::WeightLayout::kOutIn, {}, rows, h, config.vocab,
                                             st));
      TZ_RETURN_IF_ERROR(engine.release(embed_unit()));
    } else {
      TZ_RETURN_IF_ERROR(ops->matmul_forward(a(layout.logits), a(layout.lnf), in(n, 1),
                                             ops::WeightLayout::kOutIn, {}, rows, h, config.vocab,
                                             st));
    }
    return engine.release(norm_unit());
  }

  Result<double> mean_loss(std::size_t rows) {
    return model::mean_loss(engine.device(), stream(), f(layout.losses), rows, host_losses);
  }

  Status check_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                     const char* call) const {
    return check_micro_batch(call, config.name, options.micro_batch, options.seq, tokens, targets);
  }

  Result<double> train(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    TZ_RETURN_IF_ERROR(check_batch(tokens, targets, "train_micro_batch"));
    const std::int64_t b = options.micro_batch, t = options.seq;
    TZ_RETURN_IF_ERROR(upload(tokens, targets));
    training = true;
    const Result<double> loss = train_on_device(b, t);
    training = false;
    ++dropout_draw;
    return loss;
  }

  // The micro-batch already on the device: forward, loss and backward.
  Result<double> train_on_device(std::int64_t b, std::int64_t t) {
    const std::int64_t rows = b * t, h = config.hidden, v = config.vocab;
    gpu::Stream& st = stream();
    TZ_RETURN_IF_ERROR(forward_trunk(b, t));
    const ops::Tensor top = a(layout.residual[static_cast<std::size_t>(config.layers)]);
    const float grad_scale = static_cast<float>(engine.loss_scale() / static_cast<double>(rows));
    if (chunk_count() > 1) {
      TZ_RETURN_IF_ERROR(chunked_head_train(top, rows, grad_scale));
    } else {
      // Final norm, LM head and the fused softmax + cross-entropy (dlogits replace the logits),
      // the head's backward into dc and the norm's into dres.
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews n, engine.gather(norm_unit()));
      TZ_RETURN_IF_ERROR(ops->rmsnorm_forward(a(layout.lnf), f(layout.rstd_f), top, in(n, 0),
                                              eps(), rows, h, st));
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews gn, grads(norm_unit()));
      if (config.tie_word_embeddings) {
        TZ_ASSIGN_OR_RETURN(const zero::UnitViews e, engine.gather(embed_unit()));
        TZ_RETURN_IF_ERROR(ops->matmul_forward(a(layout.logits), a(layout.lnf), in(e, 0),
                                               ops::WeightLayout::kOutIn, {}, rows, h, v, st));
        TZ_RETURN_IF_ERROR(ops->cross_entropy_backward(a(layout.logits), f(layout.losses),
                                                       a(layout.logits), ids(layout.targets),
                                                       rows, v, grad_scale, st));
        TZ_ASSIGN_OR_RETURN(const zero::UnitViews ge, grads(embed_unit()));
        TZ_RETURN_IF_ERROR(ops->matmul_backward(a(layout.dc), ops::Accumulate::kOverwrite,
                                                out(ge, 0), {}, a(layout.logits), a(layout.lnf),
                                                in(e, 0), ops::WeightLayout::kOutIn, rows, h, v,
                                                st));
        TZ_RETURN_IF_ERROR(engine.release(embed_unit()));
      } else {
        TZ_RETURN_IF_ERROR(ops->matmul_forward(a(layout.logits), a(layout.lnf), in(n, 1),
                                               ops::WeightLayout::kOutIn, {}, rows, h, v, st));
        TZ_RETURN_IF_ERROR(ops->cross_entropy_backward(a(layout.logits), f(layout.losses),
                                                       a(layout.logits), ids(layout.targets),
                                                       rows, v, grad_scale, st));
        TZ_RETURN_IF_ERROR(ops->matmul_backward(a(layout.dc), ops::Accumulate::kOverwrite,
                                                out(gn, 1), {}, a(layout.logits), a(layout.lnf),
                                                in(n, 1), ops::WeightLayout::kOutIn, rows, h, v,
                                                st));
      }
      TZ_RETURN_IF_ERROR(ops->rmsnorm_backward(a(layout.dres), ops::Accumulate::kOverwrite,
                                               out(gn, 0), a(layout.dc), top, in(n, 0),
                                               f(layout.rstd_f), rows, h, st));
      TZ_RETURN_IF_ERROR(engine.release(norm_unit()));
      TZ_RETURN_IF_ERROR(reduce(norm_unit()));
    }
    for (int i = config.layers - 1; i >= 0; --i) {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(block_unit(i)));
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews lp, gather_lora(i));
      if (options.checkpointing != 0) {
        TZ_RETURN_IF_ERROR(block_forward(p, lp, i, training_pass(i, b, t), /*to_output=*/false));
      }
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews g, grads(block_unit(i)));
      zero::UnitViews lg;
      if (lora) {
        TZ_ASSIGN_OR_RETURN(lg, engine.grad(lora_units[static_cast<std::size_t>(i)]));
      }
      TZ_RETURN_IF_ERROR(block_backward(p, g, lp, lg, i, b, t));
      TZ_RETURN_IF_ERROR(engine.release(block_unit(i)));
      TZ_RETURN_IF_ERROR(release_lora(i));
      TZ_RETURN_IF_ERROR(reduce(block_unit(i)));
      if (lora) TZ_RETURN_IF_ERROR(engine.reduce(lora_units[static_cast<std::size_t>(i)]));
    }
    if (!frozen() && chunk_count() > 1) {
      // Each chunk's gradient in turn: tied, the head's part from its logit columns' gradient
      // (kept in layout.logits) and the final norm's output; then the embedding's, its rows.
      for (int c = 0; c < chunk_count(); ++c) {
        TZ_ASSIGN_OR_RETURN(const zero::UnitViews ge, engine.grad(embed_unit(c)));
        if (config.tie_word_embeddings) {
          TZ_RETURN_IF_ERROR(columns_to_tmp(c, rows));
          TZ_RETURN_IF_ERROR(ops->matmul_backward(
              ops::Tensor{}, ops::Accumulate::kOverwrite, out(ge, 0), {}, a(layout.head_tmp),
              a(layout.lnf), ops::ConstTensor{}, ops::WeightLayout::kOutIn, rows, h,
              chunk_size(c), st));
        }
        TZ_RETURN_IF_ERROR(ops->embedding_backward(out(ge, 0), ops::Tensor{}, a(layout.dres),
                                                   ids(layout.tokens), b, t, h, v, st,
                                                   chunk_first(c), chunk_size(c)));
        TZ_RETURN_IF_ERROR(engine.reduce(embed_unit(c)));
      }
    } else if (!frozen()) {
      // The embedding's gradient (a frozen base has none: backward stops at the first block).
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews ge, engine.grad(embed_unit()));
      TZ_RETURN_IF_ERROR(ops->embedding_backward(out(ge, 0), ops::Tensor{}, a(layout.dres),
                                                 ids(layout.tokens), b, t, h, v, st));
      TZ_RETURN_IF_ERROR(engine.reduce(embed_unit()));
    }
    return mean_loss(static_cast<std::size_t>(rows));
  }

  // The final norm, the LM head chunk by chunk and the fused softmax + cross-entropy over the
  // whole logits (dlogits replace them), then the head's backward chunk by chunk: dc, the
  // gradient of the norm's output, summed over the chunks (each gathered again), and an untied
  // chunk's weight gradient, reduced at once; a tied chunk's waits for the embedding's backward
  // (train_on_device), so only one chunk's gradient buffer is out at a time. Then the norm's
  // backward into dres.
  Status chunked_head_train(const ops::Tensor& top, std::int64_t rows, float grad_scale) {
    const std::int64_t h = config.hidden, v = config.vocab;
    gpu::Stream& st = stream();
    TZ_ASSIGN_OR_RETURN(const zero::UnitViews n, engine.gather(norm_unit()));
    TZ_RETURN_IF_ERROR(ops->rmsnorm_forward(a(layout.lnf), f(layout.rstd_f), top, in(n, 0), eps(),
                                            rows, h, st));
    TZ_RETURN_IF_ERROR(chunked_logits(rows));
    TZ_RETURN_IF_ERROR(ops->cross_entropy_backward(a(layout.logits), f(layout.losses),
                                                   a(layout.logits), ids(layout.targets), rows, v,
                                                   grad_scale, st));
    // Last chunk first: the one the forward gathered last is the likeliest still near.
    for (int c = chunk_count() - 1; c >= 0; --c) {
      const zero::UnitId unit = head_unit(c);
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews w, engine.gather(unit));
      zero::UnitViews g;
      if (!config.tie_word_embeddings) {
        TZ_ASSIGN_OR_RETURN(g, grads(unit));
      }
      TZ_RETURN_IF_ERROR(columns_to_tmp(c, rows));
      TZ_RETURN_IF_ERROR(ops->matmul_backward(
          a(layout.dc),
          c == chunk_count() - 1 ? ops::Accumulate::kOverwrite : ops::Accumulate::kAdd, out(g, 0),
          {}, a(layout.head_tmp), a(layout.lnf), in(w, 0), ops::WeightLayout::kOutIn, rows, h,
          chunk_size(c), st));
      TZ_RETURN_IF_ERROR(engine.release(unit));
      if (!config.tie_word_embeddings) TZ_RETURN_IF_ERROR(reduce(unit));
    }
    TZ_ASSIGN_OR_RETURN(const zero::UnitViews gn, grads(norm_unit()));
    TZ_RETURN_IF_ERROR(ops->rmsnorm_backward(a(layout.dres), ops::Accumulate::kOverwrite,
                                             out(gn, 0), a(layout.dc), top, in(n, 0),
                                             f(layout.rstd_f), rows, h, st));
    TZ_RETURN_IF_ERROR(engine.release(norm_unit()));
    return reduce(norm_unit());
  }

  Result<std::vector<float>> download_logits(std::size_t rows) {
    return download_f32(engine.device(), stream(), base() + layout.logits, act,
                        rows * static_cast<std::size_t>(config.vocab));
  }

  Status ensure_cache() {
    if (!cache.empty()) return Status::ok();
    const std::size_t bytes = 2 * static_cast<std::size_t>(config.layers) *
                              static_cast<std::size_t>(options.seq) *
                              static_cast<std::size_t>(kv_dim()) * dtype_size(act);
    Result<gpu::DeviceBuffer> buffer = engine.device().allocate(bytes);
    if (!buffer.is_ok()) {
      return std::move(buffer).take_status().with_context("model " + config.name +
                                                          ": key/value cache of " +
                                                          std::to_string(options.seq) +
                                                          " positions");
    }
    cache = std::move(buffer).value();
    return Status::ok();
  }

  std::byte* cache_at(bool values, int layer) const {
    const std::size_t per_layer = static_cast<std::size_t>(options.seq) *
                                  static_cast<std::size_t>(kv_dim()) * dtype_size(act);
    return static_cast<std::byte*>(const_cast<void*>(cache.data())) +
           (values ? static_cast<std::size_t>(config.layers) * per_layer : 0) +
           static_cast<std::size_t>(layer) * per_layer;
  }

  Result<std::vector<float>> decode(std::span<const std::int32_t> tokens, bool start_over) {
    if (start_over) cache_len = 0;
    const auto n = static_cast<std::int64_t>(tokens.size());
    if (n < 1 || cache_len + n > options.seq) {
      return Status::invalid_argument("decode: model " + config.name + " holds " +
                                      std::to_string(options.seq) + " positions; " +
                                      std::to_string(cache_len) + " cached + " +
                                      std::to_string(n) + " new do not fit");
    }
    TZ_RETURN_IF_ERROR(upload(tokens, {}));
    TZ_RETURN_IF_ERROR(ensure_cache());
    TZ_RETURN_IF_ERROR(embed(1, n));
    for (int i = 0; i < config.layers; ++i) {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(block_unit(i)));
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews lp, gather_lora(i));
      const Pass pass{1, n, cache_len, cache_at(false, i), cache_at(true, i)};
      TZ_RETURN_IF_ERROR(block_forward(p, lp, i, pass, /*to_output=*/true));
      TZ_RETURN_IF_ERROR(engine.release(block_unit(i)));
      TZ_RETURN_IF_ERROR(release_lora(i));
    }
    TZ_RETURN_IF_ERROR(head_forward(n - 1, 1));
    cache_len += n;
    return download_logits(1);
  }
};

}  // namespace tz::model
