// Size and count parsing: exact values and rejected garbage.
#include <gtest/gtest.h>

#include "core/units.h"

namespace tz {
namespace {

TEST(Units, SizesExact) {
  EXPECT_EQ(*parse_size("4GiB"), 4ull << 30);
  EXPECT_EQ(*parse_size("4G"), 4ull << 30);
  EXPECT_EQ(*parse_size("512K"), 512ull << 10);
  EXPECT_EQ(*parse_size("8M"), 8ull << 20);
  EXPECT_EQ(*parse_size("8MB"), 8000000ull);
  EXPECT_EQ(*parse_size("1e9"), 1000000000ull);
  EXPECT_EQ(*parse_size("1.5GiB"), 1610612736ull);
  EXPECT_EQ(*parse_size("0"), 0ull);
  EXPECT_EQ(*parse_size(" 4096 "), 4096ull);
  EXPECT_EQ(*parse_size("5e8"), 500000000ull);
  EXPECT_EQ(*parse_size("2.5e3"), 2500ull);
  EXPECT_EQ(*parse_size("16TiB"), 16ull << 40);
  EXPECT_EQ(*parse_size("18446744073709551615"), 18446744073709551615ull);
}

TEST(Units, CountsExact) {
  EXPECT_EQ(*parse_count("256M"), 256000000ull);
  EXPECT_EQ(*parse_count("1.3B"), 1300000000ull);
  EXPECT_EQ(*parse_count("7G"), 7000000000ull);
  EXPECT_EQ(*parse_count("1e5"), 100000ull);
  EXPECT_EQ(*parse_count("12"), 12ull);
}

TEST(Units, RejectsGarbage) {
  for (const char* bad : {"4XB", "-1", "", "abc", "1.5", "0.3K", "1e", "18446744073709551616",
                          "99999999999999999999999", "1e30", "17179869184G", "4 G B", "--4",
                          "1.2.3", "e5", "nan", "inf", "0x10"}) {
    auto r = parse_size(bad);
    EXPECT_FALSE(r.is_ok()) << "accepted \"" << bad << "\" as " << (r ? *r : 0);
    if (!r) {
      EXPECT_NE(r.status().message().find("is not a valid size"), std::string::npos);
      EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    }
  }
  EXPECT_FALSE(parse_count("4GiB").is_ok());
  EXPECT_FALSE(parse_count("-3").is_ok());
  EXPECT_FALSE(parse_count("1.00001K").is_ok());
}

TEST(Units, Format) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1.5 * (1 << 30)), "1.50 GiB");
  EXPECT_EQ(format_rate(2.01e9), "2.01 GB/s");
}

}  // namespace
}  // namespace tz
