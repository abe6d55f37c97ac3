// Files through a tokenizer (model/tokenizer_files.h): tokenizing on several threads in small
// blocks gives the ids of one encode of the whole text, token files decode back to the text, ids
// past 65,535 go to version 2 files, the trainer's tokenizer.json round-trips text, and the
// refusals name the file and the byte offset.
#include "model/tokenizer_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/data.h"

namespace tz::model {
namespace {

namespace fs = std::filesystem;

std::string data_path(const std::string& name) {
  return std::string(TZ_TOKENIZER_TEST_DATA) + "/" + name;
}

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A corpus of every test string of expected.json, the KJV-like lines many times over, so that small
// blocks cut it in many places.
std::string corpus() {
  const nlohmann::json expected = nlohmann::json::parse(read_all(data_path("expected.json")));
  std::string text;
  for (int rep = 0; rep < 20; ++rep) {
    for (const auto& c : expected["files"]["gpt2.json"]) {
      text += c["text"].get<std::string>();
      text += rep % 2 == 0 ? "\n" : "\nAnd ";
    }
    text += "Verse " + std::to_string(rep) + "\nÉtienne\n\xe4\xb8\xad\xe6\x96\x87\n\n";
  }
  return text;
}

class TokenizerFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tz_tokenizer_files_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& body) const {
    std::ofstream(path(name), std::ios::binary) << body;
    return path(name);
  }
  fs::path dir_;
};

TEST_F(TokenizerFilesTest, ThreadsAndBlocksGiveTheIdsOfOneEncode) {
  const std::string text = corpus();
  const std::string text_path = write("corpus.txt", text);
  for (const char* name : {"gpt2.json", "llama3.json", "llama2.json", "metaspace.json",
                           "metaspace_first.json", "added_tokens.json"}) {
    auto tok = Tokenizer::load(data_path(name));
    ASSERT_TRUE(tok.is_ok());
    const auto whole = *tok->encode(text);
    for (int threads : {1, 3}) {
      TokenizeFileOptions opt;
      opt.threads = threads;
      opt.block_bytes = 4096;  // many blocks
      auto stats = tokenize_file(*tok, text_path, path("out.bin"), opt);
      ASSERT_TRUE(stats.is_ok()) << stats.status().message();
      EXPECT_TRUE(stats->parallel) << name;
      EXPECT_EQ(stats->bytes, text.size());
      EXPECT_EQ(stats->version, 1);
      auto back = load_tokens(path("out.bin"), tok->vocab_size());
      ASSERT_TRUE(back.is_ok()) << back.status().message();
      EXPECT_EQ(back->tokens, whole) << name << " threads " << threads;
      EXPECT_FALSE(fs::exists(path("out.bin.tmp")));
    }
    auto bytes = detokenize_file(*tok, path("out.bin"), path("back.txt"));
    ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
    // NFC (llama3.json) and NFKC (metaspace.json, added_tokens.json) change a few characters of
    // the corpus; the files without a Unicode normalizer give it back byte for byte.
    EXPECT_EQ(read_all(path("back.txt")), *tok->decode(whole)) << name;
    const std::string n(name);
    if (n == "gpt2.json" || n == "llama2.json" || n == "metaspace_first.json") {
      EXPECT_TRUE(read_all(path("back.txt")) == text) << name << " does not give the text back";
    }
  }
}

// A model that merges "\n" with the next letter, and no pre-tokenizer to split them: the text
// cannot be cut, so it is encoded whole on one thread, still giving the ids of one encode.
TEST_F(TokenizerFilesTest, ATokenizerThatCannotBeCutEncodesTheWholeText) {
  const std::string tok_path = write("tokenizer.json", R"({"model": {"type": "BPE",
      "vocab": {"a": 0, "b": 1, "\n": 2, "\na": 3}, "merges": ["\n a"]}})");
  auto tok = Tokenizer::load(tok_path);
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  EXPECT_FALSE(tok->cuts_at_newlines());
  std::string text;
  for (int i = 0; i < 3000; ++i) text += i % 3 == 0 ? "ab\n" : "b\na";
  const std::string text_path = write("t.txt", text);
  TokenizeFileOptions opt;
  opt.threads = 4;
  opt.block_bytes = 4096;
  auto stats = tokenize_file(*tok, text_path, path("t.bin"), opt);
  ASSERT_TRUE(stats.is_ok()) << stats.status().message();
  EXPECT_FALSE(stats->parallel);
  EXPECT_EQ(load_tokens(path("t.bin"), 4)->tokens, *tok->encode(text));
}

TEST_F(TokenizerFilesTest, InvalidUtf8IsRefusedWithTheFileAndOffset) {
  auto tok = Tokenizer::load(data_path("gpt2.json"));
  ASSERT_TRUE(tok.is_ok());
  std::string text = corpus();
  const std::size_t bad = text.size() / 2 + 7;
  text[bad] = '\xff';
  const std::string text_path = write("bad.txt", text);
  TokenizeFileOptions opt;
  opt.threads = 2;
  opt.block_bytes = 4096;
  auto stats = tokenize_file(*tok, text_path, path("bad.bin"), opt);
  ASSERT_FALSE(stats.is_ok());
  const std::string msg = stats.status().message();
  EXPECT_NE(msg.find(text_path), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset " + std::to_string(bad)), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(path("bad.bin")));
  EXPECT_FALSE(fs::exists(path("bad.bin.tmp")));
}

// 65,100 added tokens after gpt2.json's 500 ids: ids up to 65,599 need uint32, so tokenize writes
// a version 2 file, and detokenize reads it back.
TEST_F(TokenizerFilesTest, IdsPast65535GoToVersion2Files) {
  nlohmann::json j = nlohmann::json::parse(read_all(data_path("gpt2.json")));
  const std::uint32_t base = 500;
  ASSERT_EQ(j["model"]["vocab"].size(), base);
  for (std::uint32_t i = 0; i < 65100; ++i) {
    j["added_tokens"].push_back({{"id", base + i},
                                 {"content", "<extra_" + std::to_string(i) + ">"},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  }
  const std::string tok_path = write("big.json", j.dump());
  auto tok = Tokenizer::load(tok_path);
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  EXPECT_EQ(tok->vocab_size(), 65600u);
  const std::string text = "<extra_65099>In the beginning<extra_7>\nGod<extra_65036> created\n";
  const std::string text_path = write("big.txt", text);
  auto stats = tokenize_file(*tok, text_path, path("big.bin"));
  ASSERT_TRUE(stats.is_ok()) << stats.status().message();
  EXPECT_EQ(stats->version, 2);
  auto back = load_tokens(path("big.bin"), tok->vocab_size());
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(back->version, 2);
  ASSERT_GE(back->tokens.size(), 4u);
  EXPECT_EQ(back->tokens.front(), 65599u);
  EXPECT_EQ(back->tokens, *tok->encode(text));
  ASSERT_TRUE(detokenize_file(*tok, path("big.bin"), path("big_back.txt")).is_ok());
  EXPECT_EQ(read_all(path("big_back.txt")), text);
}

TEST_F(TokenizerFilesTest, TrainedTokenizerRoundTripsText) {
  const std::string text = corpus();
  const std::string text_path = write("train.txt", text);
  TrainTokenizerOptions opt;
  opt.vocab = 400;
  opt.threads = 2;
  auto json = train_byte_level_bpe({text_path}, opt);
  ASSERT_TRUE(json.is_ok()) << json.status().message();
  ASSERT_TRUE(write_tokenizer_json(path("tok"), *json).is_ok());
  auto tok = Tokenizer::load(path("tok"));
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  EXPECT_EQ(tok->vocab_size(), 400u);
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), std::optional<std::uint32_t>(399));
  const nlohmann::json j = nlohmann::json::parse(*json);
  EXPECT_EQ(j["model"]["merges"].size(), 400u - 257u);
  const auto ids = *tok->encode(text);
  EXPECT_LT(ids.size(), text.size() / 2) << "the merges compress the text they were learned on";
  EXPECT_EQ(*tok->decode(ids), text);
  const std::string other = "Unseen words: zebra, quokka, 12345, \xf0\x9f\x98\x80 <|endoftext|>";
  EXPECT_EQ(*tok->decode(*tok->encode(other)), other);
  // The same corpus trains the same tokenizer, whatever the thread count.
  opt.threads = 1;
  EXPECT_EQ(*train_byte_level_bpe({text_path}, opt), *json);
}

TEST_F(TokenizerFilesTest, TrainerRefusals) {
  const std::string ok = write("ok.txt", "hello hello world\n");
  TrainTokenizerOptions opt;
  opt.vocab = 256;
  auto small = train_byte_level_bpe({ok}, opt);
  ASSERT_FALSE(small.is_ok());
  EXPECT_NE(small.status().message().find("257"), std::string::npos);
  opt.vocab = 300;
  const std::string bad = write("bad.txt", std::string("abc\xc3", 4));
  auto r = train_byte_level_bpe({ok, bad}, opt);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find(bad), std::string::npos);
  EXPECT_NE(r.status().message().find("offset 3"), std::string::npos) << r.status().message();
  auto missing = train_byte_level_bpe({path("none.txt")}, opt);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("none.txt"), std::string::npos);
}

TEST_F(TokenizerFilesTest, DetokenizeRefusesIdsPastTheVocabulary) {
  auto tok = Tokenizer::load(data_path("gpt2.json"));
  ASSERT_TRUE(tok.is_ok());
  ASSERT_TRUE(write_token_file(path("x.bin"), std::vector<std::uint32_t>{1, 2, 600}).is_ok());
  auto r = detokenize_file(*tok, path("x.bin"), path("x.txt"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("token 600 at position 2"), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(fs::exists(path("x.txt")));
}

}  // namespace
}  // namespace tz::model
