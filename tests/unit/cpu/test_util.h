// Helpers shared by the CPU optimizer tests: seeded random inputs of the classes the issue asks
// for (normal, tiny, huge, zero, subnormal), ulp distances and a buffer set for one shard.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/dtype_element.h"
#include "cpu/optimizer.h"

namespace tz::cpu::test {

// The seed for a test: TZ_TEST_SEED when set, else `fallback`; printed so failures replay.
inline std::uint64_t test_seed(std::uint64_t fallback) {
  std::uint64_t seed = fallback;
  if (const char* env = std::getenv("TZ_TEST_SEED")) seed = std::strtoull(env, nullptr, 10);
  std::printf("[seed] %llu (set TZ_TEST_SEED to replay)\n",
              static_cast<unsigned long long>(seed));
  return seed;
}

enum class GradClass { kNormal, kTiny, kHuge, kZero, kSubnormal, kMixed };

inline const char* grad_class_name(GradClass c) {
  switch (c) {
    case GradClass::kNormal: return "normal";
    case GradClass::kTiny: return "tiny";
    case GradClass::kHuge: return "huge";
    case GradClass::kZero: return "zero";
    case GradClass::kSubnormal: return "subnormal";
    case GradClass::kMixed: return "mixed";
  }
  return "?";
}

// A gradient value of class `c`. Huge values stay below 1e18 so g*g fits in fp32 (PyTorch's
// Adam overflows there too); subnormals are fp32 subnormals.
inline float random_grad(std::mt19937_64& rng, GradClass c) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 4);
  switch (c) {
    case GradClass::kNormal: return normal(rng);
    case GradClass::kTiny: return normal(rng) * 1e-20f;
    case GradClass::kHuge: return normal(rng) * 1e17f;
    case GradClass::kZero: return (rng() & 1) != 0 ? 0.0f : -0.0f;
    case GradClass::kSubnormal: {
      const std::uint32_t bits = static_cast<std::uint32_t>(rng() % 0x7fffffu) + 1u;
      return f32_from_bits(bits | ((rng() & 1) != 0 ? 0x80000000u : 0u));
    }
    case GradClass::kMixed:
      return random_grad(rng, static_cast<GradClass>(pick(rng)));
  }
  return 0.0f;
}

// Distance between a float and a double reference in units of the float spacing at the
// reference (ulp of float(ref)).
inline double ulp_error(float got, double ref) {
  const float r = static_cast<float>(ref);
  if (std::isnan(got) || std::isnan(ref)) return std::isnan(got) && std::isnan(ref) ? 0 : 1e30;
  const float a = std::fabs(r);
  const float up = std::nextafter(a, std::numeric_limits<float>::infinity());
  const double ulp = static_cast<double>(up) - static_cast<double>(a);
  return std::fabs(static_cast<double>(got) - ref) / ulp;
}

// Buffers of one shard: fp32 params, gradient of `grad_dtype`, two state arrays and a copy.
struct ShardBuffers {
  std::vector<float> param;
  std::vector<std::uint8_t> grad;
  std::vector<std::uint8_t> state0, state1;
  std::vector<std::uint8_t> copy;
  DType grad_dtype = DType::kF32;
  DType state_dtype = DType::kF32;
  DType copy_dtype = DType::kBF16;

  ShardBuffers(std::size_t n, DType g, DType s, DType c)
      : param(n), grad(n * dtype_size(g)), state0(n * dtype_size(s)), state1(n * dtype_size(s)),
        copy(n * dtype_size(c)), grad_dtype(g), state_dtype(s), copy_dtype(c) {}

  std::size_t n() const { return param.size(); }
  Shard shard(bool with_copy) {
    Shard s;
    s.param = param.data();
    s.grad = grad.data();
    s.state[0] = state0.data();
    s.state[1] = state1.data();
    s.param_copy = with_copy ? copy.data() : nullptr;
    s.n = param.size();
    return s;
  }
  // Stores x as the gradient element i (rounded to grad_dtype); returns the value stored.
  float set_grad(std::size_t i, float x) { return set(grad, grad_dtype, i, x); }
  float grad_at(std::size_t i) const { return get(grad, grad_dtype, i); }
  float set_state(int which, std::size_t i, float x) {
    return set(which == 0 ? state0 : state1, state_dtype, i, x);
  }
  float state_at(int which, std::size_t i) const {
    return get(which == 0 ? state0 : state1, state_dtype, i);
  }

  static float set(std::vector<std::uint8_t>& buf, DType t, std::size_t i, float x) {
    return store_element(buf.data(), t, i, x);
  }
  static float get(const std::vector<std::uint8_t>& buf, DType t, std::size_t i) {
    return load_element(buf.data(), t, i);
  }
};

}  // namespace tz::cpu::test
