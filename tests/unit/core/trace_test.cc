// Chrome trace output is valid JSON with named tracks; a disabled trace records nothing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "core/trace.h"

namespace tz {
namespace {

TEST(Trace, SpansOnNamedTracks) {
  Trace t;
  t.span("nvme", "ignored while disabled", 0, 1);
  EXPECT_EQ(t.event_count(), 0u);
  t.enable();
  t.span("nvme", "read layer 3", 10, 30, R"({"bytes": 4096})");
  std::thread other([&] { t.span("copy", "h2d", 12, 20); });
  other.join();
  t.counter("pinned_bytes", 1024);
  const auto j = nlohmann::json::parse(t.to_json());
  int spans = 0, names = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++spans;
      EXPECT_GT(e["tid"].get<int>(), 0);
      if (e["name"] == "read layer 3") {
        EXPECT_EQ(e["dur"].get<double>(), 20);
        EXPECT_EQ(e["args"]["bytes"], 4096);
      }
    }
    if (e["ph"] == "M" && e["name"] == "thread_name") ++names;
  }
  EXPECT_EQ(spans, 2);
  EXPECT_EQ(names, 2);
}

}  // namespace
}  // namespace tz
