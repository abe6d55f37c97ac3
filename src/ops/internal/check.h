// Argument checks of ops/ops.h's public methods (ops.cc), which validate every call once for both
// backends: each returns kInvalidArgument naming the op and the argument, so the CPU and the CUDA
// backend reject exactly the same calls.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "core/status.h"
#include "ops/ops.h"

namespace tz::ops::internal {

// `value` > 0.
Status check_positive(std::string_view op, std::string_view arg, std::int64_t value);
// `ptr` is not null.
Status check_present(std::string_view op, std::string_view arg, const void* ptr);
// `t` is a present tensor of a storage dtype (fp32, bf16, fp16).
Status check_tensor(std::string_view op, std::string_view arg, ConstTensor t);
// `t` is null (absent) or a present tensor of `dtype`.
Status check_optional(std::string_view op, std::string_view arg, ConstTensor t, DType dtype);
// `t` has `dtype` (the dtype every act or every param tensor of one op shares).
Status check_dtype(std::string_view op, std::string_view arg, ConstTensor t, DType dtype);

// Every size is > 0.
struct NamedSize {
  std::string_view name;
  std::int64_t value;
};
Status check_sizes(std::string_view op, std::initializer_list<NamedSize> sizes);
// Attention's sizes: all > 0 and embd divisible by heads.
Status check_attention(std::string_view op, std::int64_t batch, std::int64_t seq,
                       std::int64_t embd, std::int64_t heads);

}  // namespace tz::ops::internal
