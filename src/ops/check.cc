// Argument checks of ops/ops.h's public methods (see internal/check.h).
#include "ops/internal/check.h"

#include <string>

namespace tz::ops::internal {

Status check_positive(std::string_view op, std::string_view arg, std::int64_t value) {
  if (value > 0) return Status::ok();
  return Status::invalid_argument(std::string(op) + ": " + std::string(arg) + " must be > 0, got " +
                                  std::to_string(value));
}

Status check_present(std::string_view op, std::string_view arg, const void* ptr) {
  if (ptr != nullptr) return Status::ok();
  return Status::invalid_argument(std::string(op) + ": " + std::string(arg) +
                                  " is null but required");
}

Status check_tensor(std::string_view op, std::string_view arg, ConstTensor t) {
  TZ_RETURN_IF_ERROR(check_present(op, arg, t.data));
  if (t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16) {
    return Status::ok();
  }
  return Status::invalid_argument(std::string(op) + ": " + std::string(arg) +
                                  " has an unknown dtype (accepted: fp32, bf16, fp16)");
}

Status check_optional(std::string_view op, std::string_view arg, ConstTensor t, DType dtype) {
  if (t.data == nullptr) return Status::ok();
  return check_dtype(op, arg, t, dtype);
}

Status check_dtype(std::string_view op, std::string_view arg, ConstTensor t, DType dtype) {
  if (t.dtype == dtype) return Status::ok();
  return Status::invalid_argument(std::string(op) + ": " + std::string(arg) + " is " +
                                  std::string(dtype_name(t.dtype)) + " but must be " +
                                  std::string(dtype_name(dtype)) +
                                  " like the op's other tensors of its kind");
}

Status check_sizes(std::string_view op, std::initializer_list<NamedSize> sizes) {
  for (const NamedSize& s : sizes) TZ_RETURN_IF_ERROR(check_positive(op, s.name, s.value));
  return Status::ok();
}

Status check_attention(std::string_view op, std::int64_t batch, std::int64_t seq,
                       std::int64_t embd, std::int64_t heads) {
  TZ_RETURN_IF_ERROR(
      check_sizes(op, {{"batch", batch}, {"seq", seq}, {"embd", embd}, {"heads", heads}}));
  if (embd % heads != 0) {
    return Status::invalid_argument(std::string(op) + ": embd " + std::to_string(embd) +
                                    " does not divide by heads " + std::to_string(heads));
  }
  return Status::ok();
}

}  // namespace tz::ops::internal
