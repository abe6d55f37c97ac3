// The GPT-2 model on ops/ and the engine's model API (model/gpt2.h): the activation layout, the
// forward and backward of the embedding, the blocks (kept or recomputed), the final LayerNorm and
// the tied LM head with the fused cross-entropy, and the micro-batch protocol of
// /work/notes/model_api.md (gather, compute on the compute stream, release; grad, reduce).
#include "model/gpt2.h"

#include "model/batch_ids.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <utility>

#include "core/assert.h"
#include "model/act_bump.h"
#include "model/hf.h"
#include "model/init.h"
#include "ops/ops.h"

namespace tz::model {
namespace {

// Tensor indices inside a block unit, in unit_specs() order.
enum BlockTensor : std::size_t {
  kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB,
  kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB,
};
// Inside the "wte" unit and the "ln_f" unit.
constexpr std::size_t kWte = 0, kWpe = 1;
constexpr std::size_t kLnfW = 0, kLnfB = 1;

Gpt2Options resolve(const Gpt2Shape& shape, Gpt2Options options) {
  if (options.seq == 0) options.seq = shape.seq;
  options.checkpointing = checkpointing_enabled(shape, options) ? 1 : 0;
  return options;
}

// One block's activations (byte offsets into the activation buffer): what its backward needs.
struct BlockActs {
  std::size_t ln1, ln1_mean, ln1_rstd, qkv, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fch,
      fch_gelu;
};

// Every device buffer the model uses for one micro-batch, carved from one allocation.
struct ActLayout {
  std::size_t tokens = 0, targets = 0;  // int32 (B*T)
  std::vector<std::size_t> residual;    // L+1 of act (B*T, C): the input of block i, ln_f's last
  std::vector<BlockActs> blocks;        // L sets, or 1 reused by every block with checkpointing
  std::size_t lnf = 0, lnf_mean = 0, lnf_rstd = 0;
  std::size_t logits = 0;  // act (B*T, V), overwritten by dlogits in backward
  std::size_t losses = 0;  // fp32 (B*T)
  // Backward: the residual stream's gradient (B*T, C), scratch (B*T, C), scratch (B*T, 4C) that
  // also holds dqkv (B*T, 3C), attention's delta (B, H, T).
  std::size_t dres = 0, dc = 0, d4c = 0, delta = 0;
  std::size_t total = 0;
};

ActLayout make_layout(const Gpt2Shape& shape, const Gpt2Options& resolved, DType act) {
  const std::size_t bt = static_cast<std::size_t>(resolved.micro_batch) *
                         static_cast<std::size_t>(resolved.seq);
  const auto c = static_cast<std::size_t>(shape.embd);
  const auto v = static_cast<std::size_t>(shape.vocab);
  const auto h = static_cast<std::size_t>(shape.heads);
  const std::size_t es = dtype_size(act);
  ActLayout l;
  ActBump bump;
  l.tokens = bump.take(bt * 4);
  l.targets = bump.take(bt * 4);
  for (int i = 0; i <= shape.layers; ++i) l.residual.push_back(bump.take(bt * c * es));
  const int sets = resolved.checkpointing != 0 ? 1 : shape.layers;
  for (int i = 0; i < sets; ++i) {
    BlockActs b{};
    b.ln1 = bump.take(bt * c * es);
    b.ln1_mean = bump.take(bt * 4);
    b.ln1_rstd = bump.take(bt * 4);
    b.qkv = bump.take(bt * 3 * c * es);
    b.atty = bump.take(bt * c * es);
    b.lse = bump.take(bt * h * 4);
    b.res2 = bump.take(bt * c * es);
    b.ln2 = bump.take(bt * c * es);
    b.ln2_mean = bump.take(bt * 4);
    b.ln2_rstd = bump.take(bt * 4);
    b.fch = bump.take(bt * 4 * c * es);
    b.fch_gelu = bump.take(bt * 4 * c * es);
    l.blocks.push_back(b);
  }
  l.lnf = bump.take(bt * c * es);
  l.lnf_mean = bump.take(bt * 4);
  l.lnf_rstd = bump.take(bt * 4);
  l.logits = bump.take(bt * v * es);
  l.losses = bump.take(bt * 4);
  l.dres = bump.take(bt * c * es);
  l.dc = bump.take(bt * c * es);
  l.d4c = bump.take(bt * 4 * c * es);
  l.delta = bump.take(bt * h * 4);
  l.total = bump.total();
  return l;
}

ops::ConstTensor in(const zero::TensorView& v) { return {v.data, v.dtype}; }
ops::Tensor out(const zero::TensorView& v) { return {v.data, v.dtype}; }

}  // namespace

struct Gpt2::Impl {
  Impl(const Gpt2Shape& s, const Gpt2Options& o, zero::Engine& e)
      : shape(s), options(o), engine(e), act(e.compute_dtype()) {}

  Gpt2Shape shape;
  Gpt2Options options;  // resolved
  zero::Engine& engine;
  DType act;  // activations are stored in the compute dtype (the CUDA kernels need act == param)
  std::vector<zero::UnitSpec> specs;
  std::vector<zero::UnitId> units;  // wte, h.0 .. h.{L-1}, ln_f
  std::unique_ptr<ops::Ops> ops;
  ActLayout layout;
  gpu::DeviceBuffer acts;  // allocated at the first micro-batch (after engine.finalize())
  std::vector<std::int32_t> host_ids;  // tokens then targets, staged for the copy to the device
  std::vector<float> host_losses;

  zero::UnitId wte_unit() const { return units.front(); }
  zero::UnitId block_unit(int i) const { return units[static_cast<std::size_t>(i) + 1]; }
  zero::UnitId lnf_unit() const { return units.back(); }
  gpu::Stream& stream() { return engine.compute_stream(); }

  std::byte* base() const { return static_cast<std::byte*>(acts.data()); }
  ops::Tensor a(std::size_t offset) const { return {base() + offset, act}; }
  float* f(std::size_t offset) const { return reinterpret_cast<float*>(base() + offset); }
  std::int32_t* ids(std::size_t offset) const {
    return reinterpret_cast<std::int32_t*>(base() + offset);
  }
  const BlockActs& block_acts(int i) const {
    return layout.blocks[options.checkpointing != 0 ? 0 : static_cast<std::size_t>(i)];
  }

  Status ensure_buffers() {
    if (!acts.empty()) return Status::ok();
    Result<gpu::DeviceBuffer> buffer = engine.device().allocate(layout.total);
    if (!buffer.is_ok()) {
      return std::move(buffer).take_status().with_context(
          "model " + shape.name + ": activations of one micro-batch (B=" +
          std::to_string(options.micro_batch) + ", T=" + std::to_string(options.seq) + ")");
    }
    acts = std::move(buffer).value();
    return Status::ok();
  }

  // Copies tokens (and targets, when given) to the device on the compute stream. The host staging
  // vector stays untouched until the caller synchronizes the stream at the end of its call.
  Status upload(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets) {
    TZ_RETURN_IF_ERROR(ensure_buffers());
    return upload_token_ids(engine.device(), stream(), shape.name, shape.vocab, tokens, targets,
                            ids(layout.tokens), ids(layout.targets), host_ids);
  }

  // Forward of block i on B*T rows from residual[i]. With `to_output` it also writes residual[i+1];
  // without (the recompute in backward) it stops at what the backward needs.
  Status block_forward(const zero::UnitViews& p, int i, std::int64_t b, std::int64_t t,
                       bool to_output) {
    const std::int64_t rows = b * t;
    const std::int64_t c = shape.embd;
    const BlockActs& s = block_acts(i);
    const ops::Tensor x = a(layout.residual[static_cast<std::size_t>(i)]);
    gpu::Stream& st = stream();
    TZ_RETURN_IF_ERROR(ops->layernorm_forward(a(s.ln1), f(s.ln1_mean), f(s.ln1_rstd), x,
                                              in(p[kLn1W]), in(p[kLn1B]), rows, c, st));
    TZ_RETURN_IF_ERROR(ops->matmul_forward(a(s.qkv), a(s.ln1), in(p[kAttnW]),
                                           ops::WeightLayout::kInOut, in(p[kAttnB]), rows, c,
                                           3 * c, st));
    TZ_RETURN_IF_ERROR(
        ops->attention_forward(a(s.atty), f(s.lse), a(s.qkv), b, t, c, shape.heads, st));
    TZ_RETURN_IF_ERROR(ops->matmul_forward(a(s.res2), a(s.atty), in(p[kAttnProjW]),
                                           ops::WeightLayout::kInOut, in(p[kAttnProjB]), rows,
                                           c, c, st));
    TZ_RETURN_IF_ERROR(ops->residual_forward(a(s.res2), a(s.res2), x, rows * c, st));
    TZ_RETURN_IF_ERROR(ops->layernorm_forward(a(s.ln2), f(s.ln2_mean), f(s.ln2_rstd),
                                              a(s.res2), in(p[kLn2W]), in(p[kLn2B]), rows, c,
                                              st));
    TZ_RETURN_IF_ERROR(ops->matmul_forward(a(s.fch), a(s.ln2), in(p[kFcW]),
                                           ops::WeightLayout::kInOut, in(p[kFcB]), rows, c,
                                           4 * c, st));
    TZ_RETURN_IF_ERROR(ops->gelu_forward(a(s.fch_gelu), a(s.fch), rows * 4 * c, st));
    if (!to_output) return Status::ok();
    const ops::Tensor y = a(layout.residual[static_cast<std::size_t>(i) + 1]);
    TZ_RETURN_IF_ERROR(ops->matmul_forward(y, a(s.fch_gelu), in(p[kFcProjW]),
                                           ops::WeightLayout::kInOut, in(p[kFcProjB]), rows,
                                           4 * c, c, st));
    return ops->residual_forward(y, y, a(s.res2), rows * c, st);
  }

  // Backward of block i: dres holds d(residual[i+1]) and becomes d(residual[i]); the parameter
  // gradients accumulate into g.
  Status block_backward(const zero::UnitViews& p, const zero::UnitViews& g, int i,
                        std::int64_t b, std::int64_t t) {
    const std::int64_t rows = b * t;
    const std::int64_t c = shape.embd;
    const BlockActs& s = block_acts(i);
    const ops::Tensor x = a(layout.residual[static_cast<std::size_t>(i)]);
    const ops::Tensor dres = a(layout.dres), dc = a(layout.dc), d4c = a(layout.d4c);
    gpu::Stream& st = stream();
    using ops::Accumulate;
    using ops::WeightLayout;
    // MLP branch: y = res2 + c_proj(gelu(c_fc(ln_2(res2)))).
    TZ_RETURN_IF_ERROR(ops->matmul_backward(d4c, Accumulate::kOverwrite, out(g[kFcProjW]),
                                            out(g[kFcProjB]), dres, a(s.fch_gelu),
                                            in(p[kFcProjW]), WeightLayout::kInOut, rows, 4 * c,
                                            c, st));
    TZ_RETURN_IF_ERROR(
        ops->gelu_backward(d4c, Accumulate::kOverwrite, d4c, a(s.fch), rows * 4 * c, st));
    TZ_RETURN_IF_ERROR(ops->matmul_backward(dc, Accumulate::kOverwrite, out(g[kFcW]),
                                            out(g[kFcB]), d4c, a(s.ln2), in(p[kFcW]),
                                            WeightLayout::kInOut, rows, c, 4 * c, st));
    TZ_RETURN_IF_ERROR(ops->layernorm_backward(dres, Accumulate::kAdd, out(g[kLn2W]),
                                               out(g[kLn2B]), dc, a(s.res2), in(p[kLn2W]),
                                               f(s.ln2_mean), f(s.ln2_rstd), rows, c, st));
    // Attention branch: res2 = x + c_proj(attention(c_attn(ln_1(x)))).
    TZ_RETURN_IF_ERROR(ops->matmul_backward(dc, Accumulate::kOverwrite, out(g[kAttnProjW]),
                                            out(g[kAttnProjB]), dres, a(s.atty),
                                            in(p[kAttnProjW]), WeightLayout::kInOut, rows, c, c,
                                            st));
    TZ_RETURN_IF_ERROR(ops->attention_backward(d4c, Accumulate::kOverwrite, f(layout.delta), dc,
                                               a(s.qkv), a(s.atty), f(s.lse), b, t, c,
                                               shape.heads, st));
    TZ_RETURN_IF_ERROR(ops->matmul_backward(dc, Accumulate::kOverwrite, out(g[kAttnW]),
                                            out(g[kAttnB]), d4c, a(s.ln1), in(p[kAttnW]),
                                            WeightLayout::kInOut, rows, c, 3 * c, st));
    return ops->layernorm_backward(dres, Accumulate::kAdd, out(g[kLn1W]), out(g[kLn1B]), dc, x,
                                   in(p[kLn1W]), f(s.ln1_mean), f(s.ln1_rstd), rows, c, st);
  }

  // Embedding and every block on B*T tokens already on the device; ends with ln_f's output in
  // layout.lnf. Each unit is gathered and released around its work.
  Status forward_trunk(std::int64_t b, std::int64_t t) {
    gpu::Stream& st = stream();
    {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(wte_unit()));
      TZ_RETURN_IF_ERROR(ops->embedding_forward(a(layout.residual[0]), ids(layout.tokens),
                                                in(p[kWte]), in(p[kWpe]), b, t, shape.embd,
                                                shape.vocab, st));
      TZ_RETURN_IF_ERROR(engine.release(wte_unit()));
    }
    for (int i = 0; i < shape.layers; ++i) {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(block_unit(i)));
      TZ_RETURN_IF_ERROR(block_forward(p, i, b, t, /*to_output=*/true));
      TZ_RETURN_IF_ERROR(engine.release(block_unit(i)));
    }
    TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(lnf_unit()));
    TZ_RETURN_IF_ERROR(ops->layernorm_forward(
        a(layout.lnf), f(layout.lnf_mean), f(layout.lnf_rstd),
        a(layout.residual[static_cast<std::size_t>(shape.layers)]), in(p[kLnfW]), in(p[kLnfB]),
        b * t, shape.embd, st));
    return engine.release(lnf_unit());
  }

  // Sums the first `rows` per-position losses (copied back after the stream's work) in double.
  Result<double> mean_loss(std::size_t rows) {
    return model::mean_loss(engine.device(), stream(), f(layout.losses), rows, host_losses);
  }

  Status check_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                     const char* call) const {
    return check_micro_batch(call, shape.name, options.micro_batch, options.seq, tokens, targets);
  }

  Result<double> train(std::span<const std::int32_t> tokens,
                       std::span<const std::int32_t> targets) {
    TZ_RETURN_IF_ERROR(check_batch(tokens, targets, "train_micro_batch"));
    const std::int64_t b = options.micro_batch, t = options.seq;
    const std::int64_t rows = b * t, c = shape.embd, v = shape.vocab;
    gpu::Stream& st = stream();
    TZ_RETURN_IF_ERROR(upload(tokens, targets));
    TZ_RETURN_IF_ERROR(forward_trunk(b, t));

    // LM head (tied to wte) and the fused softmax + cross-entropy: dlogits replace the logits in
    // place, so one micro-batch's logits is all that ever exists. The gradient is of
    // loss_scale * mean loss.
    {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(wte_unit()));
      TZ_RETURN_IF_ERROR(ops->matmul_forward(a(layout.logits), a(layout.lnf), in(p[kWte]),
                                             ops::WeightLayout::kOutIn, {}, rows, c, v, st));
      const float grad_scale =
          static_cast<float>(engine.loss_scale() / static_cast<double>(rows));
      TZ_RETURN_IF_ERROR(ops->cross_entropy_backward(a(layout.logits), f(layout.losses),
                                                     a(layout.logits), ids(layout.targets), rows,
                                                     v, grad_scale, st));
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews g, engine.grad(wte_unit()));
      TZ_RETURN_IF_ERROR(ops->matmul_backward(a(layout.dc), ops::Accumulate::kOverwrite,
                                              out(g[kWte]), {}, a(layout.logits), a(layout.lnf),
                                              in(p[kWte]), ops::WeightLayout::kOutIn, rows, c, v,
                                              st));
      TZ_RETURN_IF_ERROR(engine.release(wte_unit()));
    }
    {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(lnf_unit()));
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews g, engine.grad(lnf_unit()));
      TZ_RETURN_IF_ERROR(ops->layernorm_backward(
          a(layout.dres), ops::Accumulate::kOverwrite, out(g[kLnfW]), out(g[kLnfB]),
          a(layout.dc), a(layout.residual[static_cast<std::size_t>(shape.layers)]), in(p[kLnfW]),
          f(layout.lnf_mean), f(layout.lnf_rstd), rows, c, st));
      TZ_RETURN_IF_ERROR(engine.release(lnf_unit()));
      TZ_RETURN_IF_ERROR(engine.reduce(lnf_unit()));
    }
    for (int i = shape.layers - 1; i >= 0; --i) {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(block_unit(i)));
      if (options.checkpointing != 0) {
        TZ_RETURN_IF_ERROR(block_forward(p, i, b, t, /*to_output=*/false));
      }
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews g, engine.grad(block_unit(i)));
      TZ_RETURN_IF_ERROR(block_backward(p, g, i, b, t));
      TZ_RETURN_IF_ERROR(engine.release(block_unit(i)));
      TZ_RETURN_IF_ERROR(engine.reduce(block_unit(i)));
    }
    {
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(wte_unit()));
      TZ_ASSIGN_OR_RETURN(const zero::UnitViews g, engine.grad(wte_unit()));
      TZ_RETURN_IF_ERROR(ops->embedding_backward(out(g[kWte]), out(g[kWpe]), a(layout.dres),
                                                 ids(layout.tokens), b, t, c, v, st));
      TZ_RETURN_IF_ERROR(engine.release(wte_unit()));
      TZ_RETURN_IF_ERROR(engine.reduce(wte_unit()));
    }
    return mean_loss(static_cast<std::size_t>(rows));
  }

  // Forward of `b` sequences of `t` tokens up to the logits of every position (rows = b*t) or,
  // with `last_only`, of each sequence's last position (rows = b) in the first rows of logits.
  Status forward_logits(std::int64_t b, std::int64_t t, bool last_only) {
    TZ_RETURN_IF_ERROR(forward_trunk(b, t));
    const std::int64_t c = shape.embd;
    TZ_ASSIGN_OR_RETURN(const zero::UnitViews p, engine.gather(wte_unit()));
    if (last_only) {
      for (std::int64_t s = 0; s < b; ++s) {
        const std::size_t row = static_cast<std::size_t>((s + 1) * t - 1);
        const ops::ConstTensor x{base() + layout.lnf + row * static_cast<std::size_t>(c) *
                                                           dtype_size(act),
                                 act};
        const ops::Tensor y{base() + layout.logits + static_cast<std::size_t>(s) *
                                                         static_cast<std::size_t>(shape.vocab) *
                                                         dtype_size(act),
                            act};
        TZ_RETURN_IF_ERROR(ops->matmul_forward(y, x, in(p[kWte]), ops::WeightLayout::kOutIn, {},
                                               1, c, shape.vocab, stream()));
      }
    } else {
      TZ_RETURN_IF_ERROR(ops->matmul_forward(a(layout.logits), a(layout.lnf), in(p[kWte]),
                                             ops::WeightLayout::kOutIn, {}, b * t, c,
                                             shape.vocab, stream()));
    }
    return engine.release(wte_unit());
  }

  // Copies `rows` rows of logits to the host as fp32.
  Result<std::vector<float>> download_logits(std::size_t rows) {
    return download_f32(engine.device(), stream(), base() + layout.logits, act,
                        rows * static_cast<std::size_t>(shape.vocab));
  }
};

Gpt2::Gpt2(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2::~Gpt2() {
  // The activations may still be read by enqueued kernels after an error return.
  if (impl_ && !impl_->acts.empty()) impl_->stream().synchronize().ignore();
}

std::uint64_t Gpt2::activation_bytes(const Gpt2Shape& shape, const Gpt2Options& options,
                                     DType compute) {
  return make_layout(shape, resolve(shape, options), compute).total;
}

Result<std::unique_ptr<Gpt2>> Gpt2::create(const Gpt2Shape& shape, const Gpt2Options& options,
                                           zero::Engine& engine) {
  if (options.micro_batch < 1) {
    return Status::invalid_argument("model " + shape.name + ": micro_batch must be >= 1, not " +
                                    std::to_string(options.micro_batch));
  }
  if (options.seq < 0 || options.seq > shape.seq) {
    return Status::invalid_argument("model " + shape.name + ": seq " +
                                    std::to_string(options.seq) + " must be in [1, " +
                                    std::to_string(shape.seq) + "] (the model's positions)");
  }
  if (options.cpu_threads < 0) {
    return Status::invalid_argument("model " + shape.name + ": cpu_threads must be >= 0");
  }
  auto impl = std::make_unique<Impl>(shape, resolve(shape, options), engine);
  impl->specs = model::unit_specs(shape);
  for (const zero::UnitSpec& spec : impl->specs) {
    TZ_ASSIGN_OR_RETURN(const zero::UnitId id, engine.register_unit(spec));
    impl->units.push_back(id);
  }
  TZ_ASSIGN_OR_RETURN(impl->ops, ops::Ops::create(engine.device(),
                                                  ops::OpsOptions{options.cpu_threads}));
  impl->layout = make_layout(shape, impl->options, impl->act);
  return std::unique_ptr<Gpt2>(new Gpt2(std::move(impl)));
}

Status Gpt2::load_safetensors(const std::string& path) {
  return load_hf_weights(impl_->engine, impl_->shape, impl_->specs, impl_->units, path);
}

Status Gpt2::save_safetensors(const std::string& path, DType dtype) {
  return save_hf_weights(impl_->engine, impl_->shape, impl_->specs, impl_->units, path, dtype);
}

Status Gpt2::load_weights(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return load_safetensors((std::filesystem::path(path) / "model.safetensors").string());
  }
  return load_safetensors(path);
}

Status Gpt2::save_weights(const std::string& path, DType dtype) {
  return save_safetensors(path, dtype);
}

Status Gpt2::init_weights(std::uint64_t seed) {
  Impl& m = *impl_;
  const double residual_std = 0.02 / std::sqrt(2.0 * m.shape.layers);
  std::vector<float> values;
  for (std::size_t u = 0; u < m.specs.size(); ++u) {
    const zero::UnitSpec& spec = m.specs[u];
    for (std::size_t t = 0; t < spec.tensors.size(); ++t) {
      const zero::TensorSpec& tensor = spec.tensors[t];
      values.assign(tensor.numel(), 0.0f);
      const std::string& name = tensor.name;
      if (name.ends_with(".bias")) {
        // Biases start at zero (values are already 0), LayerNorm biases too.
      } else if (name.starts_with("ln_")) {
        std::fill(values.begin(), values.end(), 1.0f);
      } else if (name == "attn.c_proj.weight" || name == "mlp.c_proj.weight") {
        fill_normal(values, residual_std, seed, u, t);
      } else {
        fill_normal(values, 0.02, seed, u, t);
      }
      Status s = m.engine.set_tensor(m.units[u], t, values);
      if (!s.is_ok()) {
        return std::move(s).with_context("init of " + spec.name + "." + name);
      }
    }
  }
  return Status::ok();
}

Result<double> Gpt2::train_micro_batch(std::span<const std::int32_t> tokens,
                                       std::span<const std::int32_t> targets) {
  return impl_->train(tokens, targets);
}

Result<double> Gpt2::eval_loss(std::span<const std::int32_t> tokens,
                               std::span<const std::int32_t> targets) {
  Impl& m = *impl_;
  TZ_RETURN_IF_ERROR(m.check_batch(tokens, targets, "eval_loss"));
  const std::int64_t b = m.options.micro_batch, t = m.options.seq;
  TZ_RETURN_IF_ERROR(m.upload(tokens, targets));
  TZ_RETURN_IF_ERROR(m.forward_logits(b, t, /*last_only=*/false));
  TZ_RETURN_IF_ERROR(m.ops->cross_entropy_forward(m.f(m.layout.losses), m.a(m.layout.logits),
                                                  m.ids(m.layout.targets), b * t, m.shape.vocab,
                                                  m.stream()));
  return m.mean_loss(static_cast<std::size_t>(b * t));
}

Result<std::vector<float>> Gpt2::logits(std::span<const std::int32_t> tokens, int batch,
                                        int length) {
  Impl& m = *impl_;
  TZ_RETURN_IF_ERROR(check_logits_request(m.shape.name, m.options.micro_batch, m.options.seq,
                                          tokens.size(), batch, length));
  TZ_RETURN_IF_ERROR(m.upload(tokens, {}));
  TZ_RETURN_IF_ERROR(m.forward_logits(batch, length, /*last_only=*/false));
  return m.download_logits(tokens.size());
}

Result<std::vector<float>> Gpt2::last_logits(std::span<const std::int32_t> tokens) {
  Impl& m = *impl_;
  TZ_RETURN_IF_ERROR(check_last_logits_request(m.shape.name, m.options.seq, tokens.size()));
  TZ_RETURN_IF_ERROR(m.upload(tokens, {}));
  TZ_RETURN_IF_ERROR(
      m.forward_logits(1, static_cast<std::int64_t>(tokens.size()), /*last_only=*/true));
  return m.download_logits(1);
}

const Gpt2Shape& Gpt2::shape() const { return impl_->shape; }
const std::string& Gpt2::name() const { return impl_->shape.name; }
int Gpt2::vocab() const { return impl_->shape.vocab; }
std::size_t Gpt2::unit_count() const { return impl_->units.size(); }
const std::vector<zero::UnitSpec>& Gpt2::unit_specs() const { return impl_->specs; }
const Gpt2Options& Gpt2::options() const { return impl_->options; }
zero::UnitId Gpt2::unit(std::size_t index) const {
  TZ_ASSERT(index < impl_->units.size(), "unit index out of range");
  return impl_->units[index];
}

}  // namespace tz::model
