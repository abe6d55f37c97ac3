// dtype names.
#include "core/dtype.h"

namespace tz {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "float32" || name == "f32" || name == "float") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp16" || name == "float16" || name == "f16" || name == "half") return DType::kF16;
  return std::nullopt;
}

}  // namespace tz
