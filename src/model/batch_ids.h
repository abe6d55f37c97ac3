// A micro-batch's token ids on their way to the device, shared by every model family: each id is
// checked against the vocabulary (user data, so an operating error, never an assertion), then
// tokens and targets go to the device on the compute stream through one host staging vector.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "zero/engine.h"  // the model API: gpu::Device and its streams, as the models see them

namespace tz::model {

// kInvalidArgument naming `call` and the model when tokens and targets are not B*T ids each.
Status check_micro_batch(const char* call, std::string_view model_name, int micro_batch, int seq,
                         std::span<const std::int32_t> tokens,
                         std::span<const std::int32_t> targets);

// The mean of `rows` per-position fp32 losses at `losses` on the device, copied back after the
// stream's work into `staging` and summed in double in position order.
Result<double> mean_loss(gpu::Device& device, gpu::Stream& stream, const float* losses,
                         std::size_t rows, std::vector<float>& staging);

// kInvalidArgument "model <name>: <what>[i] = v is outside the vocabulary [0, vocab)" for the
// first id out of range.
Status check_token_ids(std::string_view model_name, std::span<const std::int32_t> values,
                       const char* what, std::int64_t vocab);

// Checks both spans, then copies `tokens` to `tokens_dst` and (when non-empty) `targets` to
// `targets_dst` on `stream`, staged in `staging`, which must stay untouched until the caller
// synchronizes the stream.
Status upload_token_ids(gpu::Device& device, gpu::Stream& stream, std::string_view model_name,
                        std::int64_t vocab, std::span<const std::int32_t> tokens,
                        std::span<const std::int32_t> targets, std::int32_t* tokens_dst,
                        std::int32_t* targets_dst, std::vector<std::int32_t>& staging);

}  // namespace tz::model
