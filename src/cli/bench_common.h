// What every `tierzero bench` command reports the same way: the median of repeated timings and
// the machine a result was measured on (STYLE.md, "Benchmarks": each JSON result names it).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tz::cli {

// The median of `samples` (the mean of the middle two for an even count); 0 when empty.
double median(std::vector<double> samples);

// The CPU model from /proc/cpuinfo ("unknown" when it cannot be read).
std::string cpu_model_name();

// {"host", "cpu", "cpus", "kernel"}: the machine a benchmark result was measured on.
nlohmann::ordered_json machine_json();

}  // namespace tz::cli
