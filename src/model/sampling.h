// Sampling continuations from a model (model/model.h): the next token from one position's logits
// (greedy at temperature 0, otherwise softmax(logits / temperature) over the top-k), seeded so a
// run repeats, and the generation loop: over Model::decode for models with a key/value cache (the
// prompt once, then one single-token forward per new token), over Model::last_logits otherwise
// (each token recomputes the context). The context is cropped to the model's positions.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace tz::model {

struct SamplingOptions {
  double temperature = 1.0;  // 0 = greedy (the arg-max token, the lowest id among ties)
  int top_k = 0;             // sample among the k most likely tokens; 0 = all
  std::uint64_t seed = 1234;
  bool kv_cache = true;  // decode over the model's key/value cache when it keeps one; false:
                         // recompute the context for every token (for comparing the two)
};

// kInvalidArgument naming the option for a negative or non-finite temperature or top_k < 0.
Status check_sampling_options(const SamplingOptions& options);

// Draws token ids from logits. The random stream depends only on the seed.
class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // The next id for `logits` (one value per vocabulary entry, non-empty; -inf allowed, NaN not).
  std::int32_t next(std::span<const float> logits);

 private:
  double uniform();  // in [0, 1)
  SamplingOptions options_;
  std::uint64_t state_;
  std::vector<std::int32_t> order_;  // scratch: ids by descending logit
  std::vector<double> weights_;
};

// `tokens` new ids after `prompt` (non-empty, ids in the vocabulary): each step sees the last
// model.options().seq ids of prompt + continuation (with a cache: decode() of the prompt, then of
// each new id; when the cache is full, decode() starts over on the last seq ids). Errors: kInvalidArgument for an
// empty prompt, tokens < 0 or bad options; the model's errors. `on_token`, when set, is called
// with each new id as soon as it is drawn (to stream the text); its error stops the generation.
using TokenCallback = std::function<Status(std::int32_t)>;
Result<std::vector<std::int32_t>> generate(Model& model, std::span<const std::int32_t> prompt,
                                           int tokens, const SamplingOptions& options,
                                           const TokenCallback& on_token = {});

// The text of a growing id sequence, released piece by piece as it becomes final: push() decodes
// all ids so far and returns the part after what it returned before, or "" while the decoded text
// ends in an incomplete character (a byte-level or byte-fallback token that is only part of a
// UTF-8 sequence decodes to U+FFFD until the rest arrives) or does not extend what was returned.
// finish() returns the rest of the last decode (or "" when it does not extend what was returned).
// The concatenation of all returns equals decode(all ids) whenever each decode extends the
// previous one (true of the byte-level and Metaspace decoders).
class TextStream {
 public:
  using Decode = std::function<Result<std::string>(std::span<const std::int32_t>)>;
  explicit TextStream(Decode decode) : decode_(std::move(decode)) {}
  Result<std::string> push(std::int32_t id);
  Result<std::string> finish();

 private:
  Decode decode_;
  std::vector<std::int32_t> ids_;
  std::string released_;  // the decoded text returned so far
  std::string text_;      // the last decode
};

// Byte-level (vocab 256) text <-> ids: each byte is one id.
std::vector<std::int32_t> bytes_to_ids(std::string_view text);
std::string ids_to_bytes(std::span<const std::int32_t> ids);

}  // namespace tz::model
