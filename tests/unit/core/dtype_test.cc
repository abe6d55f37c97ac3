// dtype conversions against independent references: every one of the 65,536 bf16 and fp16 bit
// patterns, and random plus edge-case fp32 inputs for the rounding direction. The references use
// double arithmetic and a brute-force nearest search (and the compiler's _Float16 where present),
// not the bit tricks under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace tz {
namespace {

// fp16 value from its bits by the definition: (-1)^s * 2^(e-15) * (1 + m/1024), subnormals
// 2^-14 * m/1024.
double fp16_reference(std::uint16_t bits) {
  const int s = bits >> 15, e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
  const double sign = s ? -1.0 : 1.0;
  if (e == 0x1f) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m / 1024.0, -14);
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}

double bf16_reference(std::uint16_t bits) {
  const int s = bits >> 15, e = (bits >> 7) & 0xff, m = bits & 0x7f;
  const double sign = s ? -1.0 : 1.0;
  if (e == 0xff) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m / 128.0, -126);
  return sign * std::ldexp(1.0 + m / 128.0, e - 127);
}

bool same_value(double ref, float got) {
  if (std::isnan(ref)) return std::isnan(got);
  if (ref == 0) return got == 0 && std::signbit(got) == std::signbit(ref);
  return static_cast<double>(got) == ref;
}

TEST(Dtype, Bf16ToF32AllPatterns) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float got = bf16_to_f32(bf16{static_cast<std::uint16_t>(b)});
    ASSERT_TRUE(same_value(bf16_reference(static_cast<std::uint16_t>(b)), got)) << "bits " << b;
  }
}

TEST(Dtype, Fp16ToF32AllPatterns) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float got = fp16_to_f32(fp16{static_cast<std::uint16_t>(b)});
    ASSERT_TRUE(same_value(fp16_reference(static_cast<std::uint16_t>(b)), got)) << "bits " << b;
  }
}

// Every 16-bit value converted to fp32 and back is the identity (NaNs stay NaNs).
TEST(Dtype, RoundTripAllPatterns) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const bf16 rb = f32_to_bf16(bf16_to_f32(bf16{bits}));
    const fp16 rh = f32_to_fp16(fp16_to_f32(fp16{bits}));
    if (std::isnan(bf16_reference(bits))) {
      EXPECT_TRUE(std::isnan(bf16_reference(rb.bits))) << b;
      EXPECT_EQ(rb.bits & 0x8000, bits & 0x8000) << "NaN sign kept, bits " << b;
    } else {
      EXPECT_EQ(rb.bits, bits);
    }
    if (std::isnan(fp16_reference(bits))) {
      EXPECT_TRUE(std::isnan(fp16_reference(rh.bits))) << b;
      EXPECT_EQ(rh.bits & 0x8000, bits & 0x8000) << "NaN sign kept, bits " << b;
    } else {
      EXPECT_EQ(rh.bits, bits);
    }
  }
}

// Nearest representable value by brute force over a sorted table of all finite non-negative
// values; ties go to the even (low mantissa bit 0) pattern; beyond max+half-ulp is Inf.
struct Nearest {
  std::vector<std::pair<double, std::uint16_t>> table;  // (value, bits), ascending
  double overflow_threshold;                            // max + ulp/2: at or above -> Inf
  std::uint16_t inf_bits;

  std::uint16_t round(double x) const {
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    if (a >= overflow_threshold) return sign | inf_bits;
    auto it = std::lower_bound(table.begin(), table.end(), std::make_pair(a, std::uint16_t{0}));
    if (it == table.end()) return sign | table.back().second;  // above max, below threshold
    if (it->first == a) return sign | it->second;
    auto lo = it - 1;
    const double dlo = a - lo->first, dhi = it->first - a;
    if (dlo < dhi) return sign | lo->second;
    if (dhi < dlo) return sign | it->second;
    return sign | ((lo->second & 1) == 0 ? lo->second : it->second);
  }
};

Nearest make_nearest(double (*ref)(std::uint16_t), std::uint16_t inf_bits) {
  Nearest n;
  n.inf_bits = inf_bits;
  for (std::uint32_t b = 0; b < inf_bits; ++b) {
    n.table.emplace_back(ref(static_cast<std::uint16_t>(b)), static_cast<std::uint16_t>(b));
  }
  const double max = n.table.back().first;
  const double prev = n.table[n.table.size() - 2].first;
  n.overflow_threshold = max + (max - prev) / 2;  // the tie at max+ulp/2 rounds to even = Inf
  return n;
}

std::vector<float> edge_and_random_inputs(std::uint64_t seed) {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                           std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(1.5f, -25),
                           std::ldexp(1.0f, -14), std::ldexp(1023.0f / 1024, -14),
                           std::ldexp(1.0f, -26), INFINITY, -INFINITY, 3.3895314e38f};
  // Exact midpoints between neighbouring 16-bit values exercise ties in both formats.
  for (std::uint32_t b = 0; b + 1 < 0x7c00; b += 97) {
    xs.push_back(static_cast<float>((fp16_reference(static_cast<std::uint16_t>(b)) +
                                     fp16_reference(static_cast<std::uint16_t>(b + 1))) / 2));
  }
  for (std::uint32_t b = 0; b + 1 < 0x7f80; b += 89) {
    xs.push_back(static_cast<float>((bf16_reference(static_cast<std::uint16_t>(b)) +
                                     bf16_reference(static_cast<std::uint16_t>(b + 1))) / 2));
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float f = f32_from_bits(bits(rng));
    if (!std::isnan(f)) xs.push_back(f);
  }
  // Values concentrated in fp16's range, where the rounding matters most.
  std::uniform_real_distribution<double> exp_dist(-26, 17);
  for (int i = 0; i < 200000; ++i) {
    const double mag = std::exp2(exp_dist(rng));
    xs.push_back(static_cast<float>(i % 2 ? mag : -mag));
  }
  return xs;
}

TEST(Dtype, F32ToBf16RoundsToNearestEven) {
  const std::uint64_t seed = 20261129;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Nearest nearest = make_nearest(bf16_reference, 0x7f80);
  for (float x : edge_and_random_inputs(seed)) {
    ASSERT_EQ(f32_to_bf16(x).bits, nearest.round(x)) << "x=" << x << " bits=" << f32_bits(x);
  }
}

TEST(Dtype, F32ToFp16RoundsToNearestEven) {
  const std::uint64_t seed = 777;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Nearest nearest = make_nearest(fp16_reference, 0x7c00);
  for (float x : edge_and_random_inputs(seed)) {
    ASSERT_EQ(f32_to_fp16(x).bits, nearest.round(x)) << "x=" << x << " bits=" << f32_bits(x);
#if defined(__FLT16_MAX__)
    // The compiler's own conversion is a second, independent reference.
    const _Float16 h = static_cast<_Float16>(x);
    std::uint16_t hb;
    std::memcpy(&hb, &h, 2);
    ASSERT_EQ(f32_to_fp16(x).bits, hb) << "x=" << x;
#endif
  }
}

TEST(Dtype, NaNStaysNaN) {
  for (std::uint32_t payload : {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0x7fffffffu, 0xff800001u}) {
    const float nan = f32_from_bits(payload);
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(nan)))) << std::hex << payload;
    EXPECT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(nan)))) << std::hex << payload;
    EXPECT_EQ(f32_to_bf16(nan).bits >> 15, payload >> 31);
    EXPECT_EQ(f32_to_fp16(nan).bits >> 15, payload >> 31);
  }
}

TEST(Dtype, Names) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float16"), DType::kF16);
  EXPECT_EQ(parse_dtype("fp32"), DType::kF32);
  EXPECT_FALSE(parse_dtype("int8").has_value());
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_name(DType::kF16), "fp16");
}

}  // namespace
}  // namespace tz
