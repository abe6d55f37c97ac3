// Helpers shared by the nvme unit and fault tests: a temporary directory removed afterwards, the
// engines to sweep, a file behind a queue, and seeded random data.
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

#include "nvme/file.h"
#include "nvme/io_engine.h"
#include "nvme/io_queue.h"

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

// The set-up most queue tests share: a new file at `path`, preallocated to `file_bytes` (none when
// 0), behind an IoQueue on a `kind` engine; `id` addresses the file in transfers. The queue is
// declared after the file so it drains its requests before the file closes.
struct FileQueue {
  IoFileHandle file;
  IoQueue queue;
  int id = -1;
};

inline Result<FileQueue> open_file_queue(const std::string& path, std::uint64_t file_bytes,
                                         IoEngineKind kind, const IoEngineOptions& engine_options = {},
                                         const IoQueueOptions& queue_options = {},
                                         DirectMode direct = DirectMode::kPrefer) {
  FileOpenOptions fo;
  fo.create = true;
  fo.direct = direct;
  TZ_ASSIGN_OR_RETURN(IoFileHandle file, IoFileHandle::open(path, fo));
  if (file_bytes != 0) TZ_RETURN_IF_ERROR(file.preallocate(file_bytes));
  TZ_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, make_io_engine(kind, engine_options));
  TZ_ASSIGN_OR_RETURN(IoQueue queue, IoQueue::create(std::move(engine), queue_options));
  TZ_ASSIGN_OR_RETURN(const int id, queue.add_file(file.io_file()));
  return FileQueue{std::move(file), std::move(queue), id};
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
