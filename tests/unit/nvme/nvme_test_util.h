// Helpers shared by the nvme unit and fault tests: a temporary directory removed afterwards, the
// engines to sweep, and seeded random data.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "nvme/io_engine.h"

namespace tz::nvme::testing {

// A fresh directory under $TZ_TEST_DIR (default: the system temp dir), removed with its contents.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TZ_TEST_DIR");
    std::string tmpl = std::string(base ? base : ::testing::TempDir().c_str());
    if (tmpl.empty() || tmpl.back() != '/') tmpl += '/';
    tmpl += "tz-nvme-test-XXXXXX";
    char* p = mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr) << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // A subdirectory (created), standing for another drive.
  std::string sub(const std::string& name) const {
    const std::string p = path_ + "/" + name;
    std::filesystem::create_directories(p);
    return p;
  }
  std::size_t entry_count() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::recursive_directory_iterator(path_)) ++n;
    return n;
  }

 private:
  std::string path_;
};

inline std::vector<IoEngineKind> all_engines() {
  return {IoEngineKind::kIoUring, IoEngineKind::kLibaio, IoEngineKind::kPsync};
}

inline void fill_random(std::byte* p, std::size_t n, std::mt19937_64& rng) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<std::byte>(rng());
}

}  // namespace tz::nvme::testing
