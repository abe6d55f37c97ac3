// model/batch_ids.h: id checks and the upload of a micro-batch's tokens and targets, the checks
// of the logits calls, and losses and logits back to the host.
#include "model/batch_ids.h"

#include <string>

namespace tz::model {

Status check_token_ids(std::string_view model_name, std::span<const std::int32_t> values,
                       const char* what, std::int64_t vocab) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (values[i] < 0 || values[i] >= vocab) {
      return Status::invalid_argument("model " + std::string(model_name) + ": " + what + "[" +
                                      std::to_string(i) + "] = " + std::to_string(values[i]) +
                                      " is outside the vocabulary [0, " + std::to_string(vocab) +
                                      ")");
    }
  }
  return Status::ok();
}

Status upload_token_ids(gpu::Device& device, gpu::Stream& stream, std::string_view model_name,
                        std::int64_t vocab, std::span<const std::int32_t> tokens,
                        std::span<const std::int32_t> targets, std::int32_t* tokens_dst,
                        std::int32_t* targets_dst, std::vector<std::int32_t>& staging) {
  TZ_RETURN_IF_ERROR(check_token_ids(model_name, tokens, "tokens", vocab));
  TZ_RETURN_IF_ERROR(check_token_ids(model_name, targets, "targets", vocab));
  staging.assign(tokens.begin(), tokens.end());
  staging.insert(staging.end(), targets.begin(), targets.end());
  TZ_RETURN_IF_ERROR(device.copy_async(tokens_dst, staging.data(), tokens.size_bytes(),
                                       gpu::CopyKind::kHostToDevice, stream));
  if (!targets.empty()) {
    TZ_RETURN_IF_ERROR(device.copy_async(targets_dst, staging.data() + tokens.size(),
                                         targets.size_bytes(), gpu::CopyKind::kHostToDevice,
                                         stream));
  }
  return Status::ok();
}

Status check_micro_batch(const char* call, std::string_view model_name, int micro_batch, int seq,
                         std::span<const std::int32_t> tokens,
                         std::span<const std::int32_t> targets) {
  const std::size_t bt = static_cast<std::size_t>(micro_batch) * static_cast<std::size_t>(seq);
  if (tokens.size() != bt || targets.size() != bt) {
    return Status::invalid_argument(
        std::string(call) + ": model " + std::string(model_name) +
        " takes micro-batches of B*T = " + std::to_string(micro_batch) + "*" +
        std::to_string(seq) + " = " + std::to_string(bt) + " tokens and targets, not " +
        std::to_string(tokens.size()) + " and " + std::to_string(targets.size()));
  }
  return Status::ok();
}

Status check_logits_request(std::string_view model_name, int micro_batch, int seq,
                            std::size_t tokens, int batch, int length) {
  if (batch < 1 || batch > micro_batch || length < 1 || length > seq ||
      tokens != static_cast<std::size_t>(batch) * static_cast<std::size_t>(length)) {
    return Status::invalid_argument(
        "logits: model " + std::string(model_name) + " takes 1.." + std::to_string(micro_batch) +
        " sequences of 1.." + std::to_string(seq) + " tokens; got " + std::to_string(tokens) +
        " tokens as " + std::to_string(batch) + " x " + std::to_string(length));
  }
  return Status::ok();
}

Status check_last_logits_request(std::string_view model_name, int seq, std::size_t tokens) {
  if (tokens == 0 || tokens > static_cast<std::size_t>(seq)) {
    return Status::invalid_argument("last_logits: model " + std::string(model_name) + " takes 1.." +
                                    std::to_string(seq) + " tokens, not " + std::to_string(tokens));
  }
  return Status::ok();
}

Result<std::vector<float>> download_f32(gpu::Device& device, gpu::Stream& stream, const void* src,
                                        DType dtype, std::size_t n) {
  std::vector<float> values(n);
  if (dtype == DType::kF32) {
    TZ_RETURN_IF_ERROR(device.copy_async(values.data(), src, n * sizeof(float),
                                         gpu::CopyKind::kDeviceToHost, stream));
    TZ_RETURN_IF_ERROR(stream.synchronize());
    return values;
  }
  std::vector<std::uint16_t> bits(n);
  TZ_RETURN_IF_ERROR(device.copy_async(bits.data(), src, n * sizeof(std::uint16_t),
                                       gpu::CopyKind::kDeviceToHost, stream));
  TZ_RETURN_IF_ERROR(stream.synchronize());
  for (std::size_t i = 0; i < n; ++i) {
    values[i] = dtype == DType::kBF16 ? bf16_to_f32(bf16{bits[i]}) : fp16_to_f32(fp16{bits[i]});
  }
  return values;
}

Result<double> mean_loss(gpu::Device& device, gpu::Stream& stream, const float* losses,
                         std::size_t rows, std::vector<float>& staging) {
  staging.resize(rows);
  TZ_RETURN_IF_ERROR(device.copy_async(staging.data(), losses, rows * sizeof(float),
                                       gpu::CopyKind::kDeviceToHost, stream));
  TZ_RETURN_IF_ERROR(stream.synchronize());
  double sum = 0;
  for (const float l : staging) sum += l;
  return sum / static_cast<double>(rows);
}

}  // namespace tz::model
