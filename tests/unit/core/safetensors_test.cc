// safetensors: files written byte by byte here (not by the code under test) are read back exactly,
// the writer's bytes equal the format spelled out by hand, round trips are exact in every dtype,
// and each kind of malformed file gives one error naming the file and, where one is at fault, the
// tensor.
#include "core/safetensors.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace tz {
namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tz_safetensors_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  // Writes [8-byte length][header][data] exactly as given.
  std::string write_raw(const std::string& name, const std::string& header,
                        const std::vector<std::uint8_t>& data, std::int64_t len_override = -1) {
    const std::string path = dir_ + "/" + name;
    std::ofstream f(path, std::ios::binary);
    std::uint64_t len = len_override >= 0 ? static_cast<std::uint64_t>(len_override) : header.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>((len >> (8 * i)) & 0xff));
    f << header;
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    return path;
  }
  static std::vector<std::uint8_t> f32_bytes(const std::vector<float>& v) {
    std::vector<std::uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  }
  std::string dir_;
};

TEST_F(SafetensorsTest, ReadsAHandWrittenFile) {
  // Two F32 tensors and one BF16 tensor, laid out by hand.
  const std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 7.0f};
  const std::vector<float> b = {42.0f};
  std::vector<std::uint8_t> data = f32_bytes(a);
  const std::vector<std::uint8_t> bb = f32_bytes(b);
  data.insert(data.end(), bb.begin(), bb.end());
  // bf16 bits of 1.0 (0x3f80) and -2.0 (0xc000), little endian.
  for (std::uint8_t x : {0x80, 0x3f, 0x00, 0xc0}) data.push_back(x);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"F32","shape":[],"data_offsets":[24,28]},)"
      R"("c":{"dtype":"BF16","shape":[2],"data_offsets":[28,32]}})";
  const std::string path = write_raw("hand.safetensors", header, data);
  auto r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->entries().size(), 3u);
  EXPECT_EQ(r->metadata().at("format"), "pt");
  const SafetensorsEntry* ea = r->find("a");
  ASSERT_NE(ea, nullptr);
  EXPECT_EQ(ea->shape, (std::vector<std::int64_t>{2, 3}));
  std::vector<float> got(6);
  ASSERT_TRUE(r->read_f32(*ea, got).is_ok());
  EXPECT_EQ(got, a);
  std::vector<float> part(2);
  ASSERT_TRUE(r->read_f32(*ea, part, 3).is_ok());
  EXPECT_EQ(part[0], a[3]);
  EXPECT_EQ(part[1], a[4]);
  std::vector<float> scalar(1);
  ASSERT_TRUE(r->read_f32(*r->find("b"), scalar).is_ok());
  EXPECT_EQ(scalar[0], 42.0f);
  std::vector<float> c(2);
  ASSERT_TRUE(r->read_f32(*r->find("c"), c).is_ok());
  EXPECT_EQ(c[0], 1.0f);
  EXPECT_EQ(c[1], -2.0f);
  EXPECT_FALSE(r->read_f32(*ea, part, 5).is_ok());  // past the end
}

TEST_F(SafetensorsTest, WriterBytesAreTheFormat) {
  const std::string path = dir_ + "/w.safetensors";
  {
    auto w = SafetensorsWriter::create(path, {{"x", DType::kF32, {2}}, {"y", DType::kF16, {1}}});
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    ASSERT_TRUE(w->write_f32("y", std::vector<float>{1.0f}).is_ok());
    ASSERT_TRUE(w->write_f32("x", std::vector<float>{0.5f, -1.0f}).is_ok());
    ASSERT_TRUE(w->finish().is_ok());
  }
  std::ifstream f(path, std::ios::binary);
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
  ASSERT_GE(bytes.size(), 8u);
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | bytes[static_cast<std::size_t>(i)];
  EXPECT_EQ(len % 8, 0u);  // padded as Hugging Face pads
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(len));
  EXPECT_NE(header.find(R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})"), std::string::npos)
      << header;
  EXPECT_NE(header.find(R"("y":{"dtype":"F16","shape":[1],"data_offsets":[8,10]})"), std::string::npos)
      << header;
  ASSERT_EQ(bytes.size(), 8 + len + 10);
  float x[2];
  std::memcpy(x, bytes.data() + 8 + len, 8);
  EXPECT_EQ(x[0], 0.5f);
  EXPECT_EQ(x[1], -1.0f);
  EXPECT_EQ(bytes[8 + len + 8], 0x00);  // fp16 1.0 = 0x3c00, little endian
  EXPECT_EQ(bytes[8 + len + 9], 0x3c);
}

// A writer dropped before finish() (a failed export: a checksum mismatch mid-way) leaves no file,
// neither at the path nor a temporary one; an earlier file at the path stays as it was.
TEST_F(SafetensorsTest, AnUnfinishedWriterLeavesNothing) {
  const std::string path = dir_ + "/u.safetensors";
  {
    auto w = SafetensorsWriter::create(path, {{"x", DType::kF32, {1024}}});
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    ASSERT_TRUE(w->write_f32("x", std::vector<float>(512, 1.0f)).is_ok());
    EXPECT_FALSE(std::filesystem::exists(path));  // nothing visible before finish
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
  const std::string old = dir_ + "/old.safetensors";
  std::ofstream(old, std::ios::binary) << "previous bytes";
  {
    auto w = SafetensorsWriter::create(old, {{"x", DType::kF32, {4}}});
    ASSERT_TRUE(w.is_ok());
  }
  std::ifstream f(old, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(f)), {}), "previous bytes");
  // Missing folders are made, as for every output.
  auto nested = SafetensorsWriter::create(dir_ + "/a/b/n.safetensors", {{"x", DType::kF32, {1}}});
  ASSERT_TRUE(nested.is_ok()) << nested.status().to_string();
  ASSERT_TRUE(nested->finish().is_ok());
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/a/b/n.safetensors"));
}

TEST_F(SafetensorsTest, RoundTripIsExactInEveryDtype) {
  const unsigned seed = 20261201;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> v(70001);
  for (float& x : v) x = dist(rng);
  const std::string path = dir_ + "/rt.safetensors";
  {
    auto w = SafetensorsWriter::create(path, {{"f32", DType::kF32, {70001}},
                                              {"bf16", DType::kBF16, {7, 10000, 1}},
                                              {"f16", DType::kF16, {70001}}},
                                       {{"k", "v"}});
    ASSERT_TRUE(w.is_ok());
    // Written in two ranges by two writers, as ranks write their shards.
    ASSERT_TRUE(w->write_f32("f32", std::span<const float>(v).first(30000)).is_ok());
    ASSERT_TRUE(w->finish().is_ok());
    auto w2 = SafetensorsWriter::open_existing(path);
    ASSERT_TRUE(w2.is_ok()) << w2.status().to_string();
    ASSERT_TRUE(w2->write_f32("f32", std::span<const float>(v).subspan(30000), 30000).is_ok());
    ASSERT_TRUE(w2->write_f32("bf16", std::span<const float>(v).first(70000)).is_ok());
    ASSERT_TRUE(w2->write_f32("f16", v).is_ok());
    ASSERT_TRUE(w2->finish().is_ok());
  }
  auto r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->metadata().at("k"), "v");
  std::vector<float> got(70001);
  ASSERT_TRUE(r->read_f32(*r->find("f32"), got).is_ok());
  EXPECT_EQ(std::memcmp(got.data(), v.data(), v.size() * 4), 0) << "seed " << seed;
  std::vector<float> g16(70000);
  ASSERT_TRUE(r->read_f32(*r->find("bf16"), g16).is_ok());
  for (std::size_t i = 0; i < g16.size(); ++i) {
    ASSERT_EQ(g16[i], bf16_to_f32(f32_to_bf16(v[i]))) << "element " << i << " seed " << seed;
  }
  ASSERT_TRUE(r->read_f32(*r->find("f16"), got).is_ok());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], fp16_to_f32(f32_to_fp16(v[i]))) << "element " << i << " seed " << seed;
  }
}

// The writer sends whole pages of contiguous runs through O_DIRECT and their partial end pages
// through the page cache (SafetensorsWriter::Path). Pieces of odd sizes in shuffled order, runs
// longer than its 8 MiB buffer, tensors that start and end mid-page, and two writers of one file
// whose ranges share pages: every byte reads back.
TEST_F(SafetensorsTest, DirectWritesOfPiecesInAnyOrderReadBack) {
  const unsigned seed = 20261207;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // 3 elements first put every later tensor off the page grid; "big" spans several buffers.
  const std::vector<SafetensorsTensorSpec> specs = {{"odd", DType::kF32, {3}},
                                                     {"big", DType::kF32, {5'000'001}},
                                                     {"half", DType::kBF16, {1'234'567}},
                                                     {"tail", DType::kF32, {1029}}};
  std::vector<std::vector<float>> v;
  for (const SafetensorsTensorSpec& t : specs) {
    v.emplace_back(static_cast<std::size_t>(t.shape[0]));
    for (float& x : v.back()) x = dist(rng);
  }
  // Pieces of 1..300k elements; the first writer takes the even pieces, the second the odd ones,
  // each in its own shuffled order (ranges that share pages, written by different writers).
  struct Piece {
    std::size_t tensor, first, n;
  };
  std::vector<Piece> pieces;
  for (std::size_t t = 0; t < v.size(); ++t) {
    for (std::size_t at = 0; at < v[t].size();) {
      const std::size_t n = std::min<std::size_t>(1 + rng() % 300'000, v[t].size() - at);
      pieces.push_back({t, at, n});
      at += n;
    }
  }
  std::vector<Piece> mine, theirs;
  for (std::size_t i = 0; i < pieces.size(); ++i) (i % 2 == 0 ? mine : theirs).push_back(pieces[i]);
  // Runs of neighbours kept in order inside each writer's list, so that contiguous runs happen.
  std::shuffle(mine.begin() + static_cast<std::ptrdiff_t>(mine.size() / 2), mine.end(), rng);
  std::shuffle(theirs.begin(), theirs.end(), rng);
  const auto write = [&](SafetensorsWriter& w, const std::vector<Piece>& list) {
    for (const Piece& p : list) {
      ASSERT_TRUE(w.write_f32(specs[p.tensor].name,
                              std::span<const float>(v[p.tensor]).subspan(p.first, p.n), p.first)
                      .is_ok());
    }
  };
  const std::string path = dir_ + "/direct.safetensors";
  auto w = SafetensorsWriter::create(path, specs);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const std::string probe_file = dir_ + "/probe";
  std::ofstream(probe_file) << "x";
  const int fd = ::open(probe_file.c_str(), O_WRONLY | O_DIRECT);
  if (fd >= 0) {
    ::close(fd);
    EXPECT_EQ(w->path_kind(), SafetensorsWriter::Path::kDirect) << dir_ << " takes O_DIRECT";
  }
  std::filesystem::remove(probe_file);
  // Moved once, as the callers hold writers in vectors.
  SafetensorsWriter first = std::move(*w);
  write(first, mine);
  ASSERT_TRUE(first.finish().is_ok());
  auto second = SafetensorsWriter::open_existing(path);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  write(*second, theirs);
  ASSERT_TRUE(second->finish().is_ok());

  auto r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  for (std::size_t t = 0; t < v.size(); ++t) {
    std::vector<float> got(v[t].size());
    ASSERT_TRUE(r->read_f32(*r->find(specs[t].name), got).is_ok());
    for (std::size_t i = 0; i < got.size(); ++i) {
      const float want =
          specs[t].dtype == DType::kBF16 ? bf16_to_f32(f32_to_bf16(v[t][i])) : v[t][i];
      ASSERT_EQ(got[i], want) << specs[t].name << " element " << i << " seed " << seed;
    }
  }
  // Reads of 1 MiB and more go direct too: a file cut short after open is an error naming it.
  std::filesystem::resize_file(path, r->entries()[1].begin + (10u << 20));
  std::vector<float> big(v[1].size());
  const Status cut = r->read_f32(*r->find("big"), big);
  EXPECT_EQ(cut.code(), ErrorCode::kIoError) << cut.to_string();
  EXPECT_NE(cut.message().find("ends early"), std::string::npos) << cut.to_string();
}

struct Malformed {
  const char* what;
  std::string header;
  std::size_t data_bytes;
  std::int64_t len_override;
  const char* expect;  // a piece of the one-line message
};

TEST_F(SafetensorsTest, EveryMalformedFileGivesOneNamedError) {
  const std::vector<Malformed> cases = {
      {"bad json", R"({"a":{"dtype":"F32")", 0, -1, "not valid JSON"},
      {"not object", R"([1,2])", 0, -1, "not a JSON object"},
      {"length past file", R"({})", 0, 1 << 20, "does not fit the file"},
      {"unknown dtype", R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8, -1,
       "tensor 'a': dtype I64"},
      {"no offsets", R"({"a":{"dtype":"F32","shape":[1]}})", 4, -1, "tensor 'a' has no data_offsets"},
      {"size lies", R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12, -1,
       "tensor 'a': data_offsets [0, 12) hold 12 bytes but shape [2, 2] of F32 needs 16"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8, -1, "tensor 'b': data_offsets overlap"},
      {"gap",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       12, -1, "tensor 'b': a gap of 4 bytes"},
      {"truncated", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 10, -1,
       "tensor 'a': data_offsets end 16 is past the data section"},
      {"trailing bytes", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 9, -1,
       "data section has 9 bytes but the tensors cover 4"},
      {"negative dim", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, -1,
       "tensor 'a' has a shape entry"},
  };
  for (const Malformed& c : cases) {
    const std::string path = write_raw("bad.safetensors", c.header,
                                       std::vector<std::uint8_t>(c.data_bytes, 0), c.len_override);
    auto r = SafetensorsReader::open(path);
    ASSERT_FALSE(r.is_ok()) << c.what;
    const std::string msg = r.status().message();
    EXPECT_NE(msg.find(path), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.what << ": " << msg;
  }
  auto missing = SafetensorsReader::open(dir_ + "/none.safetensors");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("none.safetensors"), std::string::npos);
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  EXPECT_FALSE(SafetensorsWriter::create(dir_ + "/d.safetensors",
                                         {{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}})
                   .is_ok());
  auto w = SafetensorsWriter::create(dir_ + "/e.safetensors", {{"a", DType::kF32, {2}}});
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ(w->write_f32("zz", std::vector<float>{1.0f}).code(), ErrorCode::kNotFound);
  EXPECT_FALSE(w->write_f32("a", std::vector<float>{1.0f, 2.0f}, 1).is_ok());
}

}  // namespace
}  // namespace tz
