// A float64 reference of the Llama family (modeling_llama.py's forward written out, loss only),
// with LoRA adapters on the modules a LoraSpec targets (PEFT's W x + b + (alpha / r) B A x, no
// dropout), for the model tests. Gradients come from its central differences.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "model/llama.h"
#include "model/lora.h"
#include "zero/engine.h"

#include "model_harness.h"  // Weights

namespace tz::model::testing {

struct Reference {
  const LlamaConfig& c;
  std::map<std::string, std::vector<double>> p;  // HF (and PEFT) name -> values
  const LoraSpec* lora = nullptr;                // adapters on its targets (their tensors in p)

  Reference(const LlamaConfig& config, const std::vector<zero::UnitSpec>& specs, const Weights& w)
      : c(config) {
    for (std::size_t u = 0; u < specs.size(); ++u) {
      for (std::size_t t = 0; t < specs[u].tensors.size(); ++t) {
        p[specs[u].tensors[t].name].assign(w[u][t].begin(), w[u][t].end());
      }
    }
  }
  const std::vector<double>* find(const std::string& n) const {
    const auto it = p.find(n);
    return it == p.end() ? nullptr : &it->second;
  }

  // Rotary frequencies as _compute_default_rope_parameters and _compute_llama3_parameters do, in
  // torch.where form.
  std::vector<double> inv_freq() const {
    const int d = c.head_dim;
    std::vector<double> inv;
    for (int i = 0; i < d; i += 2) inv.push_back(1.0 / std::pow(c.rope_theta, double(i) / d));
    if (!c.rope_llama3) return inv;
    const Llama3RopeScaling& s = *c.rope_llama3;
    const double old = s.original_max_position_embeddings;
    const double low_wl = old / s.low_freq_factor, high_wl = old / s.high_freq_factor;
    for (double& f : inv) {
      const double wl = 2 * std::numbers::pi / f;
      const double scaled = wl > low_wl ? f / s.factor : f;
      const double smooth = (old / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      const double smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
      const bool medium = !(wl < high_wl) && !(wl > low_wl);
      f = medium ? smoothed : scaled;
    }
    return inv;
  }

  // x (rows, in) times W^T (W: (out, in)) plus b.
  static std::vector<double> linear(const std::vector<double>& x, const std::vector<double>& w,
                                    const std::vector<double>* b, int rows, int in, int out) {
    std::vector<double> y(static_cast<std::size_t>(rows) * out);
    for (int r = 0; r < rows; ++r) {
      for (int o = 0; o < out; ++o) {
        double s = b != nullptr ? (*b)[o] : 0.0;
        for (int i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
        y[r * out + o] = s;
      }
    }
    return y;
  }
  std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& w, int rows,
                              int dim) const {
    std::vector<double> y(x.size());
    for (int r = 0; r < rows; ++r) {
      double ms = 0;
      for (int i = 0; i < dim; ++i) ms += x[r * dim + i] * x[r * dim + i];
      const double rstd = 1.0 / std::sqrt(ms / dim + c.rms_norm_eps);
      for (int i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * rstd * w[i];
    }
    return y;
  }
  // rotate_half rope on (b, t, heads, d) rows of width `width`.
  void rope(std::vector<double>& x, int b, int t, int heads, const std::vector<double>& inv) const {
    const int d = c.head_dim, half = d / 2, width = heads * d;
    for (int s = 0; s < b; ++s) {
      for (int pos = 0; pos < t; ++pos) {
        for (int h = 0; h < heads; ++h) {
          double* v = &x[(s * t + pos) * width + h * d];
          for (int i = 0; i < half; ++i) {
            const double a = pos * inv[i], x1 = v[i], x2 = v[i + half];
            v[i] = x1 * std::cos(a) - x2 * std::sin(a);
            v[i + half] = x2 * std::cos(a) + x1 * std::sin(a);
          }
        }
      }
    }
  }

  // Module `module` of layer `layer` on x (rows, in): x W^T + b, plus (alpha / r) (x A^T) B^T when
  // the module carries an adapter.
  std::vector<double> proj(const std::vector<double>& x, int layer, const std::string& module,
                           int rows, int in, int out) const {
    const std::string pre = "model.layers." + std::to_string(layer) + "." +
                            (module.ends_with("_proj") && (module[0] == 'q' || module[0] == 'k' ||
                                                           module[0] == 'v' || module[0] == 'o')
                                 ? "self_attn."
                                 : "mlp.") +
                            module;
    std::vector<double> y = linear(x, p.at(pre + ".weight"), find(pre + ".bias"), rows, in, out);
    if (lora == nullptr ||
        std::find(lora->targets.begin(), lora->targets.end(), module) == lora->targets.end()) {
      return y;
    }
    const std::vector<double> u =
        linear(x, p.at(llama_lora_tensor_name(layer, module, false)), nullptr, rows, in, lora->r);
    const std::vector<double> v =
        linear(u, p.at(llama_lora_tensor_name(layer, module, true)), nullptr, rows, lora->r, out);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += lora->scale() * v[i];
    return y;
  }

  double loss(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
              int b, int t) const {
    const int rows = b * t, h = c.hidden, d = c.head_dim, nq = c.heads, nkv = c.kv_heads;
    const int q_dim = nq * d, kv_dim = nkv * d, f = c.ffn, v = c.vocab;
    const std::vector<double> inv = inv_freq();
    const std::vector<double>& embed = p.at("model.embed_tokens.weight");
    std::vector<double> x(static_cast<std::size_t>(rows) * h);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < h; ++i) x[r * h + i] = embed[tokens[r] * h + i];
    }
    for (int l = 0; l < c.layers; ++l) {
      const std::string pre = "model.layers." + std::to_string(l) + ".";
      const auto W = [&](const std::string& n) -> const std::vector<double>& { return p.at(pre + n); };
      const std::vector<double> n1 = rmsnorm(x, W("input_layernorm.weight"), rows, h);
      std::vector<double> q = proj(n1, l, "q_proj", rows, h, q_dim);
      std::vector<double> k = proj(n1, l, "k_proj", rows, h, kv_dim);
      const std::vector<double> vv = proj(n1, l, "v_proj", rows, h, kv_dim);
      if (c.qk_norm) {
        q = rmsnorm(q, W("self_attn.q_norm.weight"), rows * nq, d);
        k = rmsnorm(k, W("self_attn.k_norm.weight"), rows * nkv, d);
      }
      rope(q, b, t, nq, inv);
      rope(k, b, t, nkv, inv);
      std::vector<double> att(static_cast<std::size_t>(rows) * q_dim, 0.0);
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      for (int s = 0; s < b; ++s) {
        for (int hh = 0; hh < nq; ++hh) {
          const int kh = hh / (nq / nkv);
          for (int i = 0; i < t; ++i) {
            std::vector<double> score(static_cast<std::size_t>(i) + 1);
            double mx = -1e300;
            for (int j = 0; j <= i; ++j) {
              double dot = 0;
              for (int e = 0; e < d; ++e) {
                dot += q[(s * t + i) * q_dim + hh * d + e] * k[(s * t + j) * kv_dim + kh * d + e];
              }
              score[j] = dot * scale;
              mx = std::max(mx, score[j]);
            }
            double z = 0;
            for (double& sc : score) z += (sc = std::exp(sc - mx));
            for (int j = 0; j <= i; ++j) {
              for (int e = 0; e < d; ++e) {
                att[(s * t + i) * q_dim + hh * d + e] += score[j] / z * vv[(s * t + j) * kv_dim + kh * d + e];
              }
            }
          }
        }
      }
      const std::vector<double> o = proj(att, l, "o_proj", rows, q_dim, h);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      const std::vector<double> n2 = rmsnorm(x, W("post_attention_layernorm.weight"), rows, h);
      const std::vector<double> g = proj(n2, l, "gate_proj", rows, h, f);
      const std::vector<double> u = proj(n2, l, "up_proj", rows, h, f);
      std::vector<double> m(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) m[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const std::vector<double> dn = proj(m, l, "down_proj", rows, f, h);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += dn[i];
    }
    const std::vector<double> nf = rmsnorm(x, p.at("model.norm.weight"), rows, h);
    const std::vector<double>& head =
        c.tie_word_embeddings ? p.at("model.embed_tokens.weight") : p.at("lm_head.weight");
    const std::vector<double> logits = linear(nf, head, nullptr, rows, h, v);
    double total = 0;
    for (int r = 0; r < rows; ++r) {
      double mx = -1e300;
      for (int i = 0; i < v; ++i) mx = std::max(mx, logits[r * v + i]);
      double z = 0;
      for (int i = 0; i < v; ++i) z += std::exp(logits[r * v + i] - mx);
      total += std::log(z) + mx - logits[r * v + targets[r]];
    }
    return total / rows;
  }
};

}  // namespace tz::model::testing
