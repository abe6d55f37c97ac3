// Sizes and counts as people write them: "4GiB", "512K", "8M", "1e9", "1.5G". Parsing is exact
// (no floating point) and rejects garbage, negatives, fractions of a unit and values past 2^64-1.
//
// Sizes (bytes): K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024 (as fio and DeepSpeed's aio
// block sizes read them); KB, MB, GB, TB are powers of 1000; a bare number or "B" is bytes.
// Counts: K, M, G (or B for billion), T are powers of 1000 ("256M" parameters = 256e6).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tz {

Result<std::uint64_t> parse_size(std::string_view text);
Result<std::uint64_t> parse_count(std::string_view text);

// "1.50 GiB", "512 B": binary units, three significant digits.
std::string format_bytes(double bytes);
// "2.01 GB/s": decimal units, as disk and link bandwidths are quoted.
std::string format_rate(double bytes_per_s);

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;
constexpr std::uint64_t kGiB = 1024 * kMiB;

}  // namespace tz
