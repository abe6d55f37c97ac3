// Seeded normal initialisation shared by the model families (model/init.h).
#include "model/init.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>

namespace tz::model {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): a small generator whose stream is the same everywhere, so
// initial weights do not depend on the standard library's distributions.
constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ULL;  // splitmix64's step

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += kGolden);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The stream of one tensor: its values depend only on (seed, unit, tensor).
std::uint64_t tensor_stream(std::uint64_t seed, std::uint64_t unit, std::uint64_t tensor) {
  std::uint64_t state = seed;
  state = splitmix64(state) ^ (unit * 0x632be59bd9b4e019ULL);
  state = splitmix64(state) ^ (tensor * 0x8cb92ba72f3d8dd7ULL);
  return state;
}

// Normal(0, stddev) values by Box-Muller in double from the stream starting at `stream`: each pair
// of elements takes two draws, so element e's pair starts after e / 2 * 2 draws (splitmix64's
// state advances by a constant per draw, so skipping there is one multiply). `out` holds
// elements [first, first + out.size()).
void fill_normal_range(std::span<float> out, double stddev, std::uint64_t stream,
                       std::size_t first) {
  const std::size_t start = first - first % 2;
  std::uint64_t state = stream + static_cast<std::uint64_t>(start) * kGolden;
  constexpr double kTwoPi = 6.283185307179586476925;
  const std::size_t end = first + out.size();
  for (std::size_t e = start; e < end; e += 2) {
    // u1 in (0, 1] so the log is finite; u2 in [0, 1).
    const double u1 = static_cast<double>((splitmix64(state) >> 11) + 1) * 0x1.0p-53;
    const double u2 = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)) * stddev;
    if (e >= first) out[e - first] = static_cast<float>(r * std::cos(kTwoPi * u2));
    if (e + 1 < end) out[e + 1 - first] = static_cast<float>(r * std::sin(kTwoPi * u2));
  }
}

}  // namespace

// Each element's value depends on its index alone, so a large tensor is filled in pieces on
// oneTBB's threads with the same bits as one thread would give (the transcendental functions cost
// 20-25 ns an element: llama-3.2-1b's 1.24 B took about 17 s on one core).
void fill_normal(std::span<float> out, double stddev, std::uint64_t seed, std::uint64_t unit,
                 std::uint64_t tensor, std::size_t first) {
  constexpr std::size_t kPiece = 1u << 20;  // even: pieces hold whole pairs
  const std::uint64_t stream = tensor_stream(seed, unit, tensor);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, (out.size() + kPiece - 1) / kPiece),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      const std::size_t begin = r.begin() * kPiece;
                      const std::size_t end = std::min(out.size(), r.end() * kPiece);
                      fill_normal_range(out.subspan(begin, end - begin), stddev, stream,
                                        first + begin);
                    });
}

void fill_uniform(std::span<float> out, double bound, std::uint64_t seed, std::uint64_t unit,
                  std::uint64_t tensor) {
  std::uint64_t state = tensor_stream(seed, unit, tensor);
  for (float& v : out) {
    const double u = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
    v = static_cast<float>((2.0 * u - 1.0) * bound);
  }
}

}  // namespace tz::model
