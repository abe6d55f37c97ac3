// Exact size and count parsing (core/units.h): the number is read as digits with an optional
// fraction and exponent, then multiplied by the unit in 128-bit integer arithmetic.
#include "core/units.h"

#include <array>
#include <cctype>
#include <cstdio>

namespace tz {
namespace {

__extension__ typedef unsigned __int128 u128;
constexpr u128 kMax64 = static_cast<u128>(UINT64_MAX);

struct Unit {
  std::string_view suffix;
  std::uint64_t multiplier;
};

constexpr std::array<Unit, 14> kSizeUnits{{
    {"", 1}, {"B", 1},
    {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"KB", 1000ull},
    {"M", 1ull << 20}, {"MiB", 1ull << 20}, {"MB", 1000000ull},
    {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"GB", 1000000000ull},
    {"T", 1ull << 40}, {"TiB", 1ull << 40}, {"TB", 1000000000000ull},
}};

constexpr std::array<Unit, 6> kCountUnits{{
    {"", 1}, {"K", 1000ull}, {"M", 1000000ull}, {"G", 1000000000ull}, {"B", 1000000000ull},
    {"T", 1000000000000ull},
}};

std::string quoted(std::string_view text) { return "\"" + std::string(text) + "\""; }

template <std::size_t N>
Result<std::uint64_t> parse_with_units(std::string_view text, const std::array<Unit, N>& units,
                                       std::string_view kind, std::string_view accepted) {
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::size_t end = text.size();
  while (end > i && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  const std::string_view t = text.substr(i, end - i);
  auto bad = [&](std::string_view why) {
    return Status::invalid_argument(quoted(text) + " is not a valid " + std::string(kind) + ": " +
                                    std::string(why) + " (accepted: " + std::string(accepted) +
                                    ")");
  };
  if (t.empty()) return bad("empty");
  if (t[0] == '-') return bad("negative");
  std::size_t p = (t[0] == '+') ? 1 : 0;

  // Mantissa: digits, optional '.', digits. Kept as an integer with `frac_digits` implied.
  u128 mantissa = 0;
  int frac_digits = 0;
  bool any_digit = false;
  bool mantissa_overflow = false;
  auto take_digit = [&](char c) {
    if (mantissa > kMax64 * 10) mantissa_overflow = true;  // far past anything representable
    if (!mantissa_overflow) mantissa = mantissa * 10 + static_cast<unsigned>(c - '0');
  };
  while (p < t.size() && std::isdigit(static_cast<unsigned char>(t[p]))) {
    take_digit(t[p++]);
    any_digit = true;
  }
  if (p < t.size() && t[p] == '.') {
    ++p;
    while (p < t.size() && std::isdigit(static_cast<unsigned char>(t[p]))) {
      take_digit(t[p++]);
      ++frac_digits;
      any_digit = true;
    }
  }
  if (!any_digit) return bad("no digits");
  int exponent = 0;
  if (p < t.size() && (t[p] == 'e' || t[p] == 'E')) {
    ++p;
    bool neg = false;
    if (p < t.size() && (t[p] == '+' || t[p] == '-')) neg = (t[p++] == '-');
    if (p >= t.size() || !std::isdigit(static_cast<unsigned char>(t[p]))) {
      return bad("exponent has no digits");
    }
    while (p < t.size() && std::isdigit(static_cast<unsigned char>(t[p]))) {
      exponent = exponent * 10 + (t[p++] - '0');
      if (exponent > 400) return bad("exponent out of range");
    }
    if (neg) exponent = -exponent;
  }
  const std::string_view suffix = t.substr(p);
  const Unit* unit = nullptr;
  for (const Unit& u : units) {
    if (u.suffix == suffix) unit = &u;
  }
  if (unit == nullptr) return bad("unknown unit \"" + std::string(suffix) + "\"");
  if (mantissa_overflow) return bad("larger than 2^64-1");

  // value = mantissa * 10^(exponent - frac_digits) * multiplier, which must be an integer.
  u128 value = mantissa;
  int scale = exponent - frac_digits;
  u128 multiplier = unit->multiplier;
  for (; scale > 0; --scale) {
    value *= 10;
    if (value > kMax64 * 1000000000000ull && value != 0) return bad("larger than 2^64-1");
  }
  if (value != 0 && multiplier > (static_cast<u128>(-1) / value)) return bad("larger than 2^64-1");
  value *= multiplier;
  for (; scale < 0; ++scale) {
    if (value % 10 != 0) return bad("not a whole number");
    value /= 10;
  }
  if (value > kMax64) return bad("larger than 2^64-1");
  return static_cast<std::uint64_t>(value);
}

std::string format_scaled(double v, const char* const* names, int count, double step) {
  int i = 0;
  while (v >= step && i + 1 < count) {
    v /= step;
    ++i;
  }
  char buf[64];
  const int precision = v >= 100 ? 0 : (v >= 10 ? 1 : 2);
  std::snprintf(buf, sizeof(buf), "%.*f %s", i == 0 ? 0 : precision, v, names[i]);
  return buf;
}

}  // namespace

Result<std::uint64_t> parse_size(std::string_view text) {
  return parse_with_units(text, kSizeUnits, "size",
                          "bytes, or a number with K/M/G/T or KiB/MiB/GiB/TiB (1024-based), "
                          "KB/MB/GB/TB (1000-based)");
}

Result<std::uint64_t> parse_count(std::string_view text) {
  return parse_with_units(text, kCountUnits, "count",
                          "a whole number, optionally with K/M/G/B/T (1000-based) or an exponent");
}

std::string format_bytes(double bytes) {
  static const char* const kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  return format_scaled(bytes, kNames, 6, 1024.0);
}

std::string format_rate(double bytes_per_s) {
  static const char* const kNames[] = {"B/s", "KB/s", "MB/s", "GB/s", "TB/s"};
  return format_scaled(bytes_per_s, kNames, 5, 1000.0);
}

}  // namespace tz
