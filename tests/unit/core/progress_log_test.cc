// Progress output off a terminal is plain periodic lines ending at 100%; log levels filter.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/log.h"
#include "core/progress.h"

namespace tz {
namespace {

TEST(Progress, PlainLinesWhenNotATerminal) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    Progress p("copy", 1000, "bytes", f);
    EXPECT_FALSE(p.interactive());
    for (int i = 0; i < 10; ++i) p.add(100);
  }  // destructor finishes: a final line at 100%
  std::rewind(f);
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, f)) out += buf;
  std::fclose(f);
  EXPECT_NE(out.find("copy: 100.0% (1000/1000 bytes)"), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << "no carriage returns in logs";
}

TEST(Log, Levels) {
  const LogLevel saved = log_level();
  set_log_level(LogLevel::kWarn);
  EXPECT_TRUE(log_enabled(LogLevel::kError));
  EXPECT_FALSE(log_enabled(LogLevel::kInfo));
  int evaluated = 0;
  TZ_LOG_DEBUG("%d", ++evaluated);
  EXPECT_EQ(evaluated, 0) << "arguments of a disabled level are not evaluated";
  set_log_level(saved);
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_FALSE(parse_log_level("loud").has_value());
}

}  // namespace
}  // namespace tz
