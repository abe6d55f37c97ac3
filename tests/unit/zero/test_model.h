// A small layered model for the engine tests: unit i is a dense layer h' = tanh(W h + b) (the last
// one without tanh) with loss 0.5 * mean over samples of |h_L - t|^2. It runs through the real
// engine API (gather, grad, reduce, step) and computes on the host (HostDevice pointers are host
// pointers), and it has a float64 single-process reference (ReferenceModel) with its own AdamW,
// written here independently of the engine.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/config.h"
#include "core/dtype.h"
#include "core/dtype_element.h"
#include "zero/engine.h"

namespace tz::zero::testing {

struct ModelShape {
  int layers = 3;
  int width = 24;  // every layer is width x width (+ bias)
  // Layers registered as frozen units (UnitSpec::frozen): gathered for forward and backward (their
  // input gradient), never handed a gradient buffer, never updated.
  std::vector<int> frozen = {};
  bool is_frozen(int layer) const {
    for (int f : frozen) {
      if (f == layer) return true;
    }
    return false;
  }
};

// Deterministic initial weights and data, shared by the engine runs and the reference.
inline std::vector<float> init_weight(int layer, int rows, int cols, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<std::uint64_t>(layer));
  std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
  std::vector<float> w(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
  for (float& x : w) x = dist(rng);
  return w;
}
inline std::vector<float> init_bias(int layer, int n, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 7919u + static_cast<std::uint64_t>(layer) + 17);
  std::uniform_real_distribution<float> dist(-0.1f, 0.1f);
  std::vector<float> b(static_cast<std::size_t>(n));
  for (float& x : b) x = dist(rng);
  return b;
}

// Sample `index` (global): input and target vectors of `width`.
inline void sample(std::int64_t index, int width, std::uint64_t seed, std::vector<float>& x,
                   std::vector<float>& t) {
  std::mt19937_64 rng(seed ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(index + 1)));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  x.resize(static_cast<std::size_t>(width));
  t.resize(static_cast<std::size_t>(width));
  for (float& v : x) v = dist(rng);
  for (float& v : t) v = 0.5f * dist(rng);
}

// Element i of a gathered or gradient view, as fp32; x stored there in the view's dtype.
inline float load(const TensorView& v, std::size_t i) { return load_element(v.data, v.dtype, i); }
inline void store(const TensorView& v, std::size_t i, float x) {
  store_element(v.data, v.dtype, i, x);
}

// x rounded to `dtype` (round to nearest even, as the engine's casts), back in fp32.
inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::kF32:
      return x;
    case DType::kBF16:
      return bf16_to_f32(f32_to_bf16(x));
    case DType::kF16:
      return fp16_to_f32(f32_to_fp16(x));
  }
  return x;
}

// The model's weights as weights() returns them: per unit, the weight then the bias.
using Weights = std::vector<std::vector<float>>;

// The model on the engine. Samples of (step, micro-batch, rank) are global indices
// ((step * k + b) * N + r) * B + s, so that the reference sees the same global batch.
class EngineModel {
 public:
  EngineModel(Engine& engine, ModelShape shape) : e_(engine), shape_(shape) {}

  Status build() {
    for (int l = 0; l < shape_.layers; ++l) {
      UnitSpec u;
      u.name = "layer" + std::to_string(l);
      u.tensors.push_back({"weight", {shape_.width, shape_.width}});
      u.tensors.push_back({"bias", {shape_.width}});
      u.frozen = shape_.is_frozen(l);
      auto id = e_.register_unit(u);
      if (!id.is_ok()) return id.status();
      units_.push_back(*id);
    }
    return e_.finalize();
  }

  Status init(std::uint64_t seed) {
    for (int l = 0; l < shape_.layers; ++l) {
      TZ_RETURN_IF_ERROR(e_.set_tensor(units_[static_cast<std::size_t>(l)], 0,
                                       init_weight(l, shape_.width, shape_.width, seed)));
      TZ_RETURN_IF_ERROR(
          e_.set_tensor(units_[static_cast<std::size_t>(l)], 1, init_bias(l, shape_.width, seed)));
    }
    return Status::ok();
  }

  // One micro-batch of `batch` samples starting at global sample `first`. `poison`: write an Inf
  // into the first gradient element of the last unit (an overflow). `forward_weights`: compute
  // forward and backward with these values (already rounded to the compute dtype) instead of the
  // gathered parameters, which are still gathered and released as the protocol asks (the
  // reference of a run whose parameters are stale).
  Result<double> micro_batch(std::int64_t first, int batch, std::uint64_t seed, bool poison = false,
                             const Weights* forward_weights = nullptr) {
    const int w = shape_.width;
    const int L = shape_.layers;
    const auto W = static_cast<std::size_t>(w);
    auto param = [forward_weights](const UnitViews& v, int layer, std::size_t t, std::size_t i) {
      return forward_weights != nullptr
                 ? (*forward_weights)[static_cast<std::size_t>(2 * layer) + t][i]
                 : load(v[t], i);
    };
    // acts[l] = input of layer l (acts[L] = output), per sample.
    std::vector<std::vector<float>> acts(static_cast<std::size_t>(L + 1),
                                         std::vector<float>(static_cast<std::size_t>(batch) * W));
    std::vector<float> targets(static_cast<std::size_t>(batch) * W);
    std::vector<float> x, t;
    for (int s = 0; s < batch; ++s) {
      sample(first + s, w, seed, x, t);
      std::copy(x.begin(), x.end(), acts[0].begin() + static_cast<std::ptrdiff_t>(s * w));
      std::copy(t.begin(), t.end(), targets.begin() + static_cast<std::ptrdiff_t>(s * w));
    }
    for (int l = 0; l < L; ++l) {
      TZ_ASSIGN_OR_RETURN(UnitViews v, e_.gather(units_[static_cast<std::size_t>(l)]));
      TZ_RETURN_IF_ERROR(e_.compute_stream().synchronize());
      for (int s = 0; s < batch; ++s) {
        for (std::size_t o = 0; o < W; ++o) {
          float z = param(v, l, 1, o);
          for (std::size_t j = 0; j < W; ++j) {
            z += param(v, l, 0, o * W + j) * acts[static_cast<std::size_t>(l)][s * W + j];
          }
          acts[static_cast<std::size_t>(l + 1)][s * W + o] = l + 1 < L ? std::tanh(z) : z;
        }
      }
      TZ_RETURN_IF_ERROR(e_.release(units_[static_cast<std::size_t>(l)]));
    }
    double loss = 0;
    std::vector<float> dh(static_cast<std::size_t>(batch) * W);
    const auto scale = static_cast<float>(e_.loss_scale());
    for (std::size_t i = 0; i < dh.size(); ++i) {
      const float d = acts[static_cast<std::size_t>(L)][i] - targets[i];
      loss += 0.5 * static_cast<double>(d) * d;
      dh[i] = d / static_cast<float>(batch) * scale;
    }
    loss /= batch;
    for (int l = L - 1; l >= 0; --l) {
      const UnitId id = units_[static_cast<std::size_t>(l)];
      const bool frozen = shape_.is_frozen(l);
      TZ_ASSIGN_OR_RETURN(UnitViews v, e_.gather(id));
      UnitViews g;
      if (!frozen) {
        TZ_ASSIGN_OR_RETURN(g, e_.grad(id));
      }
      TZ_RETURN_IF_ERROR(e_.compute_stream().synchronize());
      const std::vector<float>& in = acts[static_cast<std::size_t>(l)];
      const std::vector<float>& out = acts[static_cast<std::size_t>(l + 1)];
      std::vector<float> dz(dh.size());
      for (std::size_t i = 0; i < dz.size(); ++i) {
        dz[i] = l + 1 < L ? dh[i] * (1.0f - out[i] * out[i]) : dh[i];
      }
      std::vector<float> dw(W * W, 0.0f), db(W, 0.0f), din(dh.size(), 0.0f);
      for (int s = 0; s < batch; ++s) {
        for (std::size_t o = 0; o < W; ++o) {
          const float d = dz[s * W + o];
          db[o] += d;
          for (std::size_t j = 0; j < W; ++j) {
            dw[o * W + j] += d * in[s * W + j];
            din[s * W + j] += param(v, l, 0, o * W + j) * d;
          }
        }
      }
      if (frozen) {  // input gradient only
        TZ_RETURN_IF_ERROR(e_.release(id));
        dh.swap(din);
        continue;
      }
      for (std::size_t i = 0; i < dw.size(); ++i) store(g[0], i, dw[i]);
      for (std::size_t i = 0; i < db.size(); ++i) store(g[1], i, db[i]);
      if (poison && l == L - 1) store(g[0], 0, std::numeric_limits<float>::infinity());
      TZ_RETURN_IF_ERROR(e_.release(id));
      TZ_RETURN_IF_ERROR(e_.reduce(id));
      dh.swap(din);
    }
    return loss;
  }

  // One optimizer step of k micro-batches of `batch` samples per rank.
  Result<StepReport> train_step(std::int64_t step, int batch, std::uint64_t seed,
                                bool poison = false, const Weights* forward_weights = nullptr) {
    const int k = e_.gradient_accumulation_steps();
    const int n = e_.world_size();
    for (int b = 0; b < k; ++b) {
      const std::int64_t first = ((step * k + b) * n + e_.rank()) * batch;
      TZ_ASSIGN_OR_RETURN(double loss,
                          micro_batch(first, batch, seed, poison && b == 0, forward_weights));
      static_cast<void>(loss);
    }
    return e_.step();
  }

  Result<std::vector<std::vector<float>>> weights() {
    std::vector<std::vector<float>> out;
    for (UnitId id : units_) {
      for (std::size_t t = 0; t < 2; ++t) {
        std::vector<float> v(t == 0 ? static_cast<std::size_t>(shape_.width * shape_.width)
                                    : static_cast<std::size_t>(shape_.width));
        TZ_RETURN_IF_ERROR(e_.get_tensor(id, t, v));
        out.push_back(std::move(v));
      }
    }
    return out;
  }

 private:
  Engine& e_;
  ModelShape shape_;
  std::vector<UnitId> units_;
};

// The float64 reference: the same model on the whole global batch in one process, AdamW as
// PyTorch defines it, gradient clipping by the global norm as DeepSpeed does.
class ReferenceModel {
 public:
  struct Hyper {
    double lr = 1e-2, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
    double clip = 0;  // 0 = off
  };
  ReferenceModel(ModelShape shape, Hyper h, std::uint64_t seed) : shape_(shape), h_(h) {
    for (int l = 0; l < shape.layers; ++l) {
      auto w = init_weight(l, shape.width, shape.width, seed);
      auto b = init_bias(l, shape.width, seed);
      params_.emplace_back(w.begin(), w.end());
      params_.emplace_back(b.begin(), b.end());
    }
    for (const auto& p : params_) {
      m_.emplace_back(p.size(), 0.0);
      v_.emplace_back(p.size(), 0.0);
    }
  }

  // Gradient of the mean loss over samples [first, first + count).
  std::vector<std::vector<double>> gradient(std::int64_t first, int count, std::uint64_t seed) const {
    const int w = shape_.width;
    const int L = shape_.layers;
    const auto W = static_cast<std::size_t>(w);
    std::vector<std::vector<double>> g;
    for (const auto& p : params_) g.emplace_back(p.size(), 0.0);
    std::vector<float> xf, tf;
    for (int s = 0; s < count; ++s) {
      sample(first + s, w, seed, xf, tf);
      std::vector<std::vector<double>> acts(static_cast<std::size_t>(L + 1));
      acts[0].assign(xf.begin(), xf.end());
      for (int l = 0; l < L; ++l) {
        const auto& Wt = params_[static_cast<std::size_t>(2 * l)];
        const auto& b = params_[static_cast<std::size_t>(2 * l + 1)];
        acts[static_cast<std::size_t>(l + 1)].resize(W);
        for (std::size_t o = 0; o < W; ++o) {
          double z = b[o];
          for (std::size_t j = 0; j < W; ++j) z += Wt[o * W + j] * acts[static_cast<std::size_t>(l)][j];
          acts[static_cast<std::size_t>(l + 1)][o] = l + 1 < L ? std::tanh(z) : z;
        }
      }
      std::vector<double> dh(W);
      for (std::size_t o = 0; o < W; ++o) {
        dh[o] = (acts[static_cast<std::size_t>(L)][o] - tf[o]) / count;
      }
      for (int l = L - 1; l >= 0; --l) {
        const auto& Wt = params_[static_cast<std::size_t>(2 * l)];
        const auto& in = acts[static_cast<std::size_t>(l)];
        const auto& out = acts[static_cast<std::size_t>(l + 1)];
        std::vector<double> din(W, 0.0);
        for (std::size_t o = 0; o < W; ++o) {
          const double d = l + 1 < L ? dh[o] * (1.0 - out[o] * out[o]) : dh[o];
          g[static_cast<std::size_t>(2 * l + 1)][o] += d;
          for (std::size_t j = 0; j < W; ++j) {
            g[static_cast<std::size_t>(2 * l)][o * W + j] += d * in[j];
            din[j] += Wt[o * W + j] * d;
          }
        }
        dh.swap(din);
      }
    }
    return g;
  }

  // Frozen layers (ModelShape::frozen) are neither in the norm nor updated.
  void adamw_step(const std::vector<std::vector<double>>& grad) {
    ++t_;
    double sq = 0;
    for (std::size_t i = 0; i < grad.size(); ++i) {
      if (shape_.is_frozen(static_cast<int>(i / 2))) continue;
      for (double x : grad[i]) sq += x * x;
    }
    const double norm = std::sqrt(sq);
    double mult = 1.0;
    if (h_.clip > 0 && norm + 1e-6 > h_.clip) mult = h_.clip / (norm + 1e-6);
    const double bc1 = 1.0 - std::pow(h_.beta1, static_cast<double>(t_));
    const double bc2 = 1.0 - std::pow(h_.beta2, static_cast<double>(t_));
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (shape_.is_frozen(static_cast<int>(i / 2))) continue;
      for (std::size_t j = 0; j < params_[i].size(); ++j) {
        const double g = grad[i][j] * mult;
        m_[i][j] = h_.beta1 * m_[i][j] + (1 - h_.beta1) * g;
        v_[i][j] = h_.beta2 * v_[i][j] + (1 - h_.beta2) * g * g;
        params_[i][j] *= 1.0 - h_.lr * h_.weight_decay;
        params_[i][j] -= h_.lr / bc1 * m_[i][j] / (std::sqrt(v_[i][j]) / std::sqrt(bc2) + h_.eps);
      }
    }
  }

  const std::vector<std::vector<double>>& params() const { return params_; }

 private:
  ModelShape shape_;
  Hyper h_;
  std::vector<std::vector<double>> params_, m_, v_;
  std::int64_t t_ = 0;
};

// A config from JSON text; the test fails when it does not load.
inline Config make_config(const std::string& json) {
  ConfigLoad load = load_config_text(json);
  EXPECT_TRUE(load.ok()) << load.status().to_string() << "\n" << json;
  return load.config;
}

}  // namespace tz::zero::testing
