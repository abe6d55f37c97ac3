// A micro-batch's token ids on their way to the device, and its losses and logits on their way
// back, shared by every model family: each id is checked against the vocabulary (user data, so an
// operating error, never an assertion), then tokens and targets go to the device on the compute
// stream through one host staging vector; the shapes the logits calls accept are checked here too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/dtype.h"
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

// kInvalidArgument naming the model unless `tokens` ids are `batch` sequences of `length` with
// 1 <= batch <= micro_batch and 1 <= length <= seq (the model API's `logits`).
Status check_logits_request(std::string_view model_name, int micro_batch, int seq,
                            std::size_t tokens, int batch, int length);

// kInvalidArgument naming the model unless 1 <= tokens <= seq (the model API's `last_logits`).
Status check_last_logits_request(std::string_view model_name, int seq, std::size_t tokens);

// `n` values of `dtype` at `src` on the device, copied back after the stream's work as fp32
// (16-bit values are copied as stored and widened on the host).
Result<std::vector<float>> download_f32(gpu::Device& device, gpu::Stream& stream, const void* src,
                                        DType dtype, std::size_t n);

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
