// core/output_file.h: an output is whole or absent, never half-written; inputs are never
// overwritten; folders are made; unwritable and full destinations are found before the work.
#include "core/output_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace tz {
namespace {
namespace fs = std::filesystem;

class OutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tz_output_file_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Every entry of `d` (temporary files included: they start with a dot).
  static std::vector<std::string> entries(const fs::path& d) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(d)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

TEST_F(OutputFileTest, NothingIsVisibleUntilCommit) {
  const std::string path = (dir_ / "a.bin").string();
  {
    std::ofstream(path) << "old";
  }
  auto out = OutputFile::create("--out", path);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_TRUE(out->write("new contents").is_ok());
  EXPECT_EQ(read(path), "old");  // the reader still sees the old file
  ASSERT_TRUE(out->commit().is_ok());
  EXPECT_EQ(read(path), "new contents");
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"a.bin"});  // no temporary left
}

TEST_F(OutputFileTest, DroppingAnUncommittedFileLeavesNoTrace) {
  const std::string path = (dir_ / "b.bin").string();
  {
    auto out = OutputFile::create("--out", path);
    ASSERT_TRUE(out.is_ok());
    ASSERT_TRUE(out->write("partial").is_ok());
    EXPECT_TRUE(fs::exists(out->temp_path()));
  }
  EXPECT_TRUE(entries(dir_).empty());
}

TEST_F(OutputFileTest, WriteAtRewritesAHeader) {
  const std::string path = (dir_ / "c.bin").string();
  auto out = OutputFile::create("", path);
  ASSERT_TRUE(out.is_ok());
  ASSERT_TRUE(out->write("XXXXbody").is_ok());
  const std::string head = "HEAD";
  ASSERT_TRUE(out->write_at(0, std::as_bytes(std::span<const char>(head))).is_ok());
  ASSERT_TRUE(out->commit().is_ok());
  EXPECT_EQ(read(path), "HEADbody");
}

TEST_F(OutputFileTest, FoldersAreMade) {
  const std::string path = (dir_ / "x" / "y" / "z.txt").string();
  ASSERT_TRUE(write_output_file("--out", path, "hi").is_ok());
  EXPECT_EQ(read(path), "hi");
}

TEST_F(OutputFileTest, AFileInThePathIsNamed) {
  { std::ofstream(dir_ / "file") << "x"; }
  const Status st = write_output_file("--out", (dir_ / "file" / "z.txt").string(), "hi");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("is a file"), std::string::npos) << st.message();
}

TEST_F(OutputFileTest, AnInputIsNeverTheOutput) {
  const std::string in = (dir_ / "in.txt").string();
  { std::ofstream(in) << "precious"; }
  // The same file by another spelling, and through a link.
  const std::string other = (dir_ / "." / "in.txt").string();
  fs::create_symlink(in, dir_ / "link.txt");
  for (const std::string& out : {in, other, (dir_ / "link.txt").string()}) {
    const Status st = write_output_file("--out", out, "clobbered", {in});
    ASSERT_FALSE(st.is_ok()) << out;
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(st.message().rfind("--out: ", 0), 0u) << st.message();
    EXPECT_NE(st.message().find("is also an input"), std::string::npos) << st.message();
  }
  EXPECT_EQ(read(in), "precious");
}

TEST_F(OutputFileTest, AFolderIsNotAnOutputFile) {
  const Status st = check_output("--out", dir_.string());
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("is a folder"), std::string::npos) << st.message();
}

TEST_F(OutputFileTest, UnwritableFolderIsFoundBeforeTheWork) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only folders; the CLI test "
                                         "mounts a read-only file system instead";
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  const Status st = check_output("--save-weights", (dir_ / "w.safetensors").string());
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("--save-weights"), std::string::npos) << st.message();
}

TEST_F(OutputFileTest, FreeSpaceShortfallIsNamed) {
  const Status st = check_output("--out", (dir_ / "big").string(), {},
                                 std::uint64_t{1} << 62);  // 4 EiB: no file system has it
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kNoSpace);
  EXPECT_NE(st.message().find("short by"), std::string::npos) << st.message();
  EXPECT_TRUE(check_output("--out", (dir_ / "small").string(), {}, 1).is_ok());
  EXPECT_TRUE(entries(dir_).empty());  // the probe file is gone
}

}  // namespace
}  // namespace tz
