// Seeded initial weights the model families share: normal (and uniform) values whose stream depends only on
// (seed, unit, tensor), so every rank and every world size sets the same weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace tz::model {

// Normal(0, stddev) values by Box-Muller in double from splitmix64 (Steele, Lea, Flood 2014), a
// generator whose stream is the same everywhere (no standard-library distributions).
// `first`: out holds the stream's elements [first, first + out.size()) (a part of a tensor, as
// the same elements of the whole would be; the Llama family's vocabulary chunks).
void fill_normal(std::span<float> out, double stddev, std::uint64_t seed, std::uint64_t unit,
                 std::uint64_t tensor, std::size_t first = 0);

// Uniform values in [-bound, bound) from the same (seed, unit, tensor) streams as fill_normal.
void fill_uniform(std::span<float> out, double bound, std::uint64_t seed, std::uint64_t unit,
                  std::uint64_t tensor);

}  // namespace tz::model
