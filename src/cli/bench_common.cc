// Shared benchmark reporting helpers (bench_common.h).
#include "cli/bench_common.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace tz::cli {

double median(std::vector<double> samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    std::string model = line.substr(colon + 1);
    model.erase(0, model.find_first_not_of(" \t"));
    return model;
  }
  return "unknown";
}

nlohmann::ordered_json machine_json() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  utsname u{};
  const bool have_uname = uname(&u) == 0;
  return {{"host", host[0] ? host : "unknown"},
          {"cpu", cpu_model_name()},
          {"cpus", sysconf(_SC_NPROCESSORS_ONLN)},
          {"kernel", have_uname ? u.release : "unknown"}};
}

}  // namespace tz::cli
