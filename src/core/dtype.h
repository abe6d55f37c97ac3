// Element types (fp32, bf16, fp16) and their conversions. 16-bit types are stored as raw bits;
// fp32 -> 16-bit rounds to nearest even, keeps NaN a NaN, preserves +-Inf and signed zero, and
// produces fp16 subnormals. The functions are TZ_HOST_DEVICE so CUDA kernels share them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "core/host_device.h"

namespace tz {

enum class DType : std::uint8_t { kF32, kBF16, kF16 };

constexpr std::size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
std::string_view dtype_name(DType t);
// Accepts "fp32"/"float32"/"f32", "bf16"/"bfloat16", "fp16"/"float16"/"f16".
std::optional<DType> parse_dtype(std::string_view name);

struct bf16 {
  std::uint16_t bits;
};
struct fp16 {
  std::uint16_t bits;
};

TZ_HOST_DEVICE inline std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
TZ_HOST_DEVICE inline float f32_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

TZ_HOST_DEVICE inline float bf16_to_f32(bf16 h) {
  return f32_from_bits(static_cast<std::uint32_t>(h.bits) << 16);
}

TZ_HOST_DEVICE inline bf16 f32_to_bf16(float f) {
  const std::uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep the sign and top payload, force quiet.
    return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  }
  const std::uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>((u + rounding_bias) >> 16)};
}

TZ_HOST_DEVICE inline float fp16_to_f32(fp16 h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  const std::uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1fu) return f32_from_bits(sign | 0x7f800000u | (man << 13));  // Inf / NaN
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24 is exact in fp32.
  const float magnitude = static_cast<float>(man) * 5.9604644775390625e-08f;
  return f32_from_bits(sign | f32_bits(magnitude));
}

TZ_HOST_DEVICE inline fp16 f32_to_fp16(float f) {
  const std::uint32_t u = f32_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet.
    return fp16{static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu))};
  }
  if (abs >= 0x477ff000u) {  // >= 65520 rounds to Inf (65504 is the largest finite).
    return fp16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  }
  if (abs < 0x38800000u) {  // Below 2^-14: fp16 subnormal or zero.
    if (abs < 0x33000000u) return fp16{sign};  // < 2^-25 rounds to zero (2^-25 itself ties to 0).
    // Align the 24-bit significand so that one unit is 2^-24, then round to nearest even.
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exp;  // 14..24 for exp in [102, 112]
    const std::uint32_t half = 1u << (shift - 1);
    const std::uint32_t rest = man & ((1u << shift) - 1);
    std::uint32_t q = man >> shift;
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return fp16{static_cast<std::uint16_t>(sign | q)};
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even; a
  // carry out of the mantissa correctly bumps the exponent.
  const std::uint32_t rebased = abs - (112u << 23);
  const std::uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return fp16{static_cast<std::uint16_t>(sign | (rounded >> 13))};
}

// Generic element access used by typed loops: load as fp32, store from fp32.
TZ_HOST_DEVICE inline float to_f32(float x) { return x; }
TZ_HOST_DEVICE inline float to_f32(bf16 x) { return bf16_to_f32(x); }
TZ_HOST_DEVICE inline float to_f32(fp16 x) { return fp16_to_f32(x); }

template <typename T>
TZ_HOST_DEVICE inline T from_f32(float x);
template <>
TZ_HOST_DEVICE inline float from_f32<float>(float x) { return x; }
template <>
TZ_HOST_DEVICE inline bf16 from_f32<bf16>(float x) { return f32_to_bf16(x); }
template <>
TZ_HOST_DEVICE inline fp16 from_f32<fp16>(float x) { return f32_to_fp16(x); }

}  // namespace tz
