// Next-token sampling and the generation loop (model/sampling.h). Probabilities are computed in
// double from the fp32 logits; the uniform draws come from splitmix64 so the same seed gives the
// same continuation on every machine.
#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string_view>

#include "core/assert.h"

namespace tz::model {

Status check_sampling_options(const SamplingOptions& options) {
  if (!std::isfinite(options.temperature) || options.temperature < 0) {
    return Status::invalid_argument("--temperature must be a finite number >= 0, not " +
                                    std::to_string(options.temperature));
  }
  if (options.top_k < 0) {
    return Status::invalid_argument("--top-k must be >= 0 (0 = all tokens), not " +
                                    std::to_string(options.top_k));
  }
  return Status::ok();
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), state_(options.seed) {}

double Sampler::uniform() {
  // splitmix64 (Steele, Lea, Flood 2014); the top 53 bits as a double in [0, 1).
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

std::int32_t Sampler::next(std::span<const float> logits) {
  TZ_ASSERT(!logits.empty(), "sampling from no logits");
  const auto n = static_cast<std::int32_t>(logits.size());
  if (options_.temperature == 0.0 || options_.top_k == 1) {
    // max_element returns the first of equal maxima: the lowest id.
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) -
                                     logits.begin());
  }
  order_.resize(logits.size());
  std::iota(order_.begin(), order_.end(), 0);
  const std::int32_t k = options_.top_k == 0 ? n : std::min(options_.top_k, n);
  // The k largest logits, ties broken by the lower id, in descending order.
  std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      return logits[static_cast<std::size_t>(a)] != logits[static_cast<std::size_t>(b)]
                                 ? logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)]
                                 : a < b;
                    });
  const double top = logits[static_cast<std::size_t>(order_[0])];
  weights_.resize(static_cast<std::size_t>(k));
  double sum = 0;
  for (std::int32_t i = 0; i < k; ++i) {
    const double l = logits[static_cast<std::size_t>(order_[static_cast<std::size_t>(i)])];
    weights_[static_cast<std::size_t>(i)] = std::exp((l - top) / options_.temperature);
    sum += weights_[static_cast<std::size_t>(i)];
  }
  double u = uniform() * sum;
  for (std::int32_t i = 0; i < k; ++i) {
    u -= weights_[static_cast<std::size_t>(i)];
    if (u < 0) return order_[static_cast<std::size_t>(i)];
  }
  // Rounding left u a hair above the last weight: the last token with a non-zero weight.
  for (std::int32_t i = k - 1; i > 0; --i) {
    if (weights_[static_cast<std::size_t>(i)] > 0) return order_[static_cast<std::size_t>(i)];
  }
  return order_[0];
}

Result<std::vector<std::int32_t>> generate(Model& model, std::span<const std::int32_t> prompt,
                                           int tokens, const SamplingOptions& options,
                                           const TokenCallback& on_token) {
  TZ_RETURN_IF_ERROR(check_sampling_options(options));
  if (prompt.empty()) return Status::invalid_argument("the prompt is empty; give at least one token");
  if (tokens < 0) return Status::invalid_argument("--tokens must be >= 0");
  Sampler sampler(options);
  std::vector<std::int32_t> context(prompt.begin(), prompt.end());
  std::vector<std::int32_t> out;
  const auto window = static_cast<std::size_t>(model.options().seq);
  if (model.has_kv_cache() && options.kv_cache) {
    if (tokens == 0) return out;
    std::size_t start = context.size() > window ? context.size() - window : 0;
    TZ_ASSIGN_OR_RETURN(std::vector<float> logits,
                        model.decode(std::span(context).subspan(start), /*start_over=*/true));
    std::size_t cached = context.size() - start;
    for (int i = 0; i < tokens; ++i) {
      const std::int32_t id = sampler.next(logits);
      out.push_back(id);
      context.push_back(id);
      if (on_token) TZ_RETURN_IF_ERROR(on_token(id));
      if (i + 1 == tokens) break;
      if (cached < window) {
        TZ_ASSIGN_OR_RETURN(logits, model.decode(std::span(&id, 1), /*start_over=*/false));
        ++cached;
      } else {
        start = context.size() - window;
        TZ_ASSIGN_OR_RETURN(logits, model.decode(std::span(context).subspan(start),
                                                 /*start_over=*/true));
      }
    }
    return out;
  }
  for (int i = 0; i < tokens; ++i) {
    const std::size_t start = context.size() > window ? context.size() - window : 0;
    TZ_ASSIGN_OR_RETURN(const std::vector<float> logits,
                        model.last_logits(std::span(context).subspan(start)));
    const std::int32_t id = sampler.next(logits);
    out.push_back(id);
    context.push_back(id);
    if (on_token) TZ_RETURN_IF_ERROR(on_token(id));
  }
  return out;
}

Result<std::string> TextStream::push(std::int32_t id) {
  ids_.push_back(id);
  TZ_ASSIGN_OR_RETURN(text_, decode_(ids_));
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8
  const bool incomplete = text_.size() >= kReplacement.size() &&
                          std::string_view(text_).substr(text_.size() - kReplacement.size()) ==
                              kReplacement;
  if (incomplete) return std::string();
  return finish();
}

Result<std::string> TextStream::finish() {
  if (!text_.starts_with(released_)) return std::string();
  std::string piece = text_.substr(released_.size());
  released_ = text_;
  return piece;
}

std::vector<std::int32_t> bytes_to_ids(std::string_view text) {
  std::vector<std::int32_t> ids;
  ids.reserve(text.size());
  for (const char c : text) ids.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c)));
  return ids;
}

std::string ids_to_bytes(std::span<const std::int32_t> ids) {
  std::string text;
  text.reserve(ids.size());
  for (const std::int32_t id : ids) {
    TZ_ASSERT(id >= 0 && id < 256, "byte id out of range");
    text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  }
  return text;
}

}  // namespace tz::model
