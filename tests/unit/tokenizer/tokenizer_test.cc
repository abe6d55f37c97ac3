// The tokenizer against HF tokenizers: the ids and decoded text in expected.json were produced by
// HF `tokenizers` (tests/data/tokenizer/make_expected.py) for small tokenizer.json files of each
// kind (GPT-2 ByteLevel, Llama 3 Split + ByteLevel, Llama 2 normalizers + byte_fallback, Metaspace,
// added tokens with every flag). Also: the components alone, cutting a text at safe points, and
// every refusal.
#include "model/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/tokenizer_text.h"

namespace tz::model {
namespace {

namespace fs = std::filesystem;

std::string data_path(const std::string& name) {
  return std::string(TZ_TOKENIZER_TEST_DATA) + "/" + name;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

class TokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tz_tokenizer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& body) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << body;
    return p;
  }
  // gpt2.json with `edit` applied, written to the temporary folder.
  template <class F>
  std::string edited(F edit) {
    nlohmann::json j = read_json(data_path("gpt2.json"));
    edit(j);
    return write("edited.json", j.dump());
  }
  fs::path dir_;
};

TEST(Tokenizer, EncodesAndDecodesAsHfTokenizers) {
  const nlohmann::json expected = read_json(data_path("expected.json"));
  int cases = 0;
  for (const auto& [name, list] : expected["files"].items()) {
    auto tok = Tokenizer::load(data_path(name));
    ASSERT_TRUE(tok.is_ok()) << tok.status().message();
    for (const auto& c : list) {
      const std::string text = c["text"].get<std::string>();
      const auto want = c["ids"].get<std::vector<std::uint32_t>>();
      auto ids = tok->encode(text);
      ASSERT_TRUE(ids.is_ok()) << name << ": " << ids.status().message();
      EXPECT_EQ(*ids, want) << name << " text: \"" << text << "\"";
      auto decoded = tok->decode(want);
      ASSERT_TRUE(decoded.is_ok()) << decoded.status().message();
      EXPECT_EQ(*decoded, c["decoded"].get<std::string>()) << name << " text: \"" << text << "\"";
      auto skipped = tok->decode(want, /*skip_special_tokens=*/true);
      ASSERT_TRUE(skipped.is_ok());
      EXPECT_EQ(*skipped, c["decoded_skip_special"].get<std::string>()) << name << ": " << text;
      ++cases;
    }
  }
  EXPECT_GT(cases, 150);
}

TEST_F(TokenizerFiles, LoadsTheTokenizerJsonOfAFolder) {
  fs::copy_file(data_path("llama3.json"), dir_ / "tokenizer.json");
  auto from_dir = Tokenizer::load(dir_.string());
  ASSERT_TRUE(from_dir.is_ok()) << from_dir.status().message();
  auto from_file = Tokenizer::load(data_path("llama3.json"));
  ASSERT_TRUE(from_file.is_ok());
  EXPECT_EQ(*from_dir->encode("In the beginning"), *from_file->encode("In the beginning"));
  EXPECT_EQ(from_dir->vocab_size(), 600u);
}

// Encoding the parts of a text cut at every safe point (the later parts as continuations) gives
// the ids of the whole text: what `data tokenize` relies on to encode chunks on several threads.
TEST(Tokenizer, TextCutAtSafePointsEncodesAsTheWhole) {
  const nlohmann::json expected = read_json(data_path("expected.json"));
  std::string text;
  for (const auto& c : expected["files"]["gpt2.json"]) text += c["text"].get<std::string>() + "\n";
  text += "Then 12 men\nand 3 women\nÉtienne said\n\xe4\xb8\xad\xe6\x96\x87\n";
  for (const char* name : {"gpt2.json", "gpt2_prefix_space.json", "llama3.json", "llama2.json",
                           "metaspace.json", "metaspace_first.json", "added_tokens.json"}) {
    auto tok = Tokenizer::load(data_path(name));
    ASSERT_TRUE(tok.is_ok());
    ASSERT_TRUE(tok->cuts_at_newlines()) << name;
    const auto whole = *tok->encode(text);
    int cuts = 0;
    for (std::size_t pos = 1; pos < text.size(); ++pos) {
      if (!tok->is_safe_cut(text, pos)) continue;
      auto left = tok->encode(std::string_view(text).substr(0, pos));
      auto right = tok->encode(std::string_view(text).substr(pos), /*continuation=*/true);
      ASSERT_TRUE(left.is_ok() && right.is_ok());
      std::vector<std::uint32_t> both = *left;
      both.insert(both.end(), right->begin(), right->end());
      EXPECT_EQ(both, whole) << name << " cut at " << pos;
      ++cuts;
    }
    EXPECT_GT(cuts, 10) << name;
  }
}

TEST(Tokenizer, SafeCutsAreAfterANewlineBetweenTextAndALetterOrDigit) {
  auto tok = Tokenizer::load(data_path("gpt2.json"));
  ASSERT_TRUE(tok.is_ok());
  // Cuts at 3 (b|c) and 12 (1|2); not after "\n\n", " \n" or "\r\n", nor before ' ' or '.'.
  const std::string s = "ab\ncd\n\nx\n 1\n2\n.y \nz\r\nw";
  std::vector<std::size_t> cuts;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (tok->is_safe_cut(s, i)) cuts.push_back(i);
  }
  EXPECT_EQ(cuts, (std::vector<std::size_t>{3, 12}));
}

// A lone BPE model whose merges overlap; the ids were worked out by hand (and agree with HF):
// "aaaaa": a·a (rank 0) merges at 0 and then at 2 (the candidate at 1 is gone), giving aa aa a;
// aa·aa is no merge, so aa·a (rank 2) merges the tail: [aa][aaa].
TEST_F(TokenizerFiles, MergesLowestRankFirstThenLeftmost) {
  const std::string body = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "aa": 2,
      "aaa": 3, "ab": 4, "aab": 5},
      "merges": ["a a", ["a", "aa"], "aa a", "a b", "aa b"]}})";
  auto tok = Tokenizer::load(write("tiny.json", body));
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  using Ids = std::vector<std::uint32_t>;
  // No pre-tokenizer: the whole text is one word.
  EXPECT_EQ(*tok->encode("aaa"), Ids{3});        // aa·a, then aa·a
  EXPECT_EQ(*tok->encode("aaaa"), (Ids{2, 2}));  // a·a twice; aa·aa is no merge
  EXPECT_EQ(*tok->encode("aaaaa"), (Ids{2, 3}));
  EXPECT_EQ(*tok->encode("aab"), Ids{5});        // a·a, then aa·b
  EXPECT_EQ(*tok->encode("aaab"), (Ids{3, 1}));  // aaa·b is no merge
  EXPECT_EQ(*tok->encode("baaa"), (Ids{1, 3}));
  EXPECT_EQ(*tok->encode(""), Ids{});
  // No decoder: HF joins the tokens with spaces.
  EXPECT_EQ(*tok->decode(Ids{2, 0, 4}), "aa a ab");
}

TEST(TokenizerText, Utf8ValidationNamesTheFirstBadByte) {
  using text::invalid_utf8_offset;
  EXPECT_EQ(invalid_utf8_offset("abc"), 3u);
  EXPECT_EQ(invalid_utf8_offset("a\xc3\xa9z"), 4u);
  EXPECT_EQ(invalid_utf8_offset("ab\xff"), 2u);
  EXPECT_EQ(invalid_utf8_offset("a\xc0\xaf"), 1u);          // overlong '/'
  EXPECT_EQ(invalid_utf8_offset("a\xed\xa0\x80"), 1u);      // surrogate
  EXPECT_EQ(invalid_utf8_offset("a\xf4\x90\x80\x80"), 1u);  // past U+10FFFF
  EXPECT_EQ(invalid_utf8_offset("ab\xe4\xb8"), 2u);         // truncated
  EXPECT_EQ(text::utf8_lossy("a\xff"
                             "b\xe4\xb8z"),
            "a\xef\xbf\xbd"
            "b\xef\xbf\xbdz");
}

TEST(TokenizerText, ByteLevelTableIsABijection) {
  for (int b = 0; b < 256; ++b) {
    const std::string& c = text::byte_to_char(static_cast<unsigned char>(b));
    std::size_t len = 0;
    EXPECT_EQ(text::char_to_byte(text::decode_utf8(c, 0, &len)), b);
    EXPECT_EQ(len, c.size());
  }
  EXPECT_EQ(text::byte_to_char(' '), "\xc4\xa0");   // 'Ġ'
  EXPECT_EQ(text::byte_to_char('\n'), "\xc4\x8a");  // 'Ċ'
  EXPECT_EQ(text::byte_to_char('A'), "A");
}

TEST(TokenizerText, NormalFormsOfCombiningAndCompatibilityCharacters) {
  EXPECT_EQ(text::normalize("e\xcc\x81", text::NormalForm::kNfc), "\xc3\xa9");
  EXPECT_EQ(text::normalize("\xc3\xa9", text::NormalForm::kNfd), "e\xcc\x81");
  EXPECT_EQ(text::normalize("\xef\xac\x81", text::NormalForm::kNfc), "\xef\xac\x81");  // 'ﬁ'
  EXPECT_EQ(text::normalize("\xef\xac\x81", text::NormalForm::kNfkc), "fi");
  EXPECT_EQ(text::normalize(std::string("a\0b", 3), text::NormalForm::kNfkc),
            std::string("a\0b", 3));
}

TEST(TokenizerText, RegexWhitespaceIsUnicodeWhiteSpace) {
  auto re = text::Regex::compile(R"(\s+|[^\s]+)", "test");
  ASSERT_TRUE(re.is_ok());
  std::vector<std::pair<std::size_t, std::size_t>> m;
  re->find_all(
      "a\xc2\x85\xc2\xa0"
      "b",
      m);  // NEL and NBSP are White_Space
  EXPECT_EQ(m, (std::vector<std::pair<std::size_t, std::size_t>>{{0, 1}, {1, 5}, {5, 6}}));
}

TEST_F(TokenizerFiles, RefusesInvalidUtf8NamingTheOffset) {
  auto tok = Tokenizer::load(data_path("gpt2.json"));
  ASSERT_TRUE(tok.is_ok());
  auto r = tok->encode("caf\xc3\xa9 \xff", false, nullptr, "corpus.txt", 1000);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("corpus.txt"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("offset 1006"), std::string::npos) << r.status().message();
}

TEST_F(TokenizerFiles, RefusesComponentsItDoesNotImplementByName) {
  struct Case {
    const char* key;
    const char* json;
    const char* named;
  };
  const Case cases[] = {
      {"normalizer", R"({"type": "Lowercase"})", "Lowercase"},
      {"normalizer",
       R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "BertNormalizer"}]})",
       "BertNormalizer"},
      {"pre_tokenizer", R"({"type": "Whitespace"})", "Whitespace"},
      {"decoder", R"({"type": "WordPiece"})", "WordPiece"},
      {"model", R"({"type": "Unigram", "vocab": []})", "Unigram"},
      {"model", R"({"type": "WordPiece", "vocab": {}})", "WordPiece"},
  };
  for (const Case& c : cases) {
    const std::string p =
        edited([&](nlohmann::json& j) { j[c.key] = nlohmann::json::parse(c.json); });
    auto r = Tokenizer::load(p);
    ASSERT_FALSE(r.is_ok()) << c.json;
    EXPECT_NE(r.status().message().find(c.named), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().message();
  }
}

TEST_F(TokenizerFiles, RefusesBrokenFiles) {
  auto missing = Tokenizer::load((dir_ / "none.json").string());
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("none.json"), std::string::npos);

  auto not_json = Tokenizer::load(write("bad.json", "{not json"));
  ASSERT_FALSE(not_json.is_ok());
  EXPECT_NE(not_json.status().message().find("bad.json"), std::string::npos);

  auto bad_merge =
      Tokenizer::load(edited([](nlohmann::json& j) { j["model"]["merges"][0] = "nosuch token"; }));
  ASSERT_FALSE(bad_merge.is_ok());
  EXPECT_NE(bad_merge.status().message().find("merge 0"), std::string::npos)
      << bad_merge.status().message();

  auto dropout = Tokenizer::load(edited([](nlohmann::json& j) { j["model"]["dropout"] = 0.1; }));
  ASSERT_FALSE(dropout.is_ok());
  EXPECT_NE(dropout.status().message().find("dropout"), std::string::npos);

  // HF gives an added token that the model lacks the next id after the vocabulary: a file that says
  // otherwise would encode differently in HF and here.
  auto moved =
      Tokenizer::load(edited([](nlohmann::json& j) { j["added_tokens"][0]["id"] = 70000; }));
  ASSERT_FALSE(moved.is_ok());
  EXPECT_NE(moved.status().message().find("<|endoftext|>"), std::string::npos)
      << moved.status().message();

  auto bad_regex = Tokenizer::load(edited([](nlohmann::json& j) {
    j["pre_tokenizer"] = {
        {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  }));
  ASSERT_FALSE(bad_regex.is_ok());
  EXPECT_NE(bad_regex.status().message().find("(unclosed"), std::string::npos);
}

TEST(Tokenizer, RefusesToDecodeAnIdOutsideTheVocabulary) {
  auto tok = Tokenizer::load(data_path("gpt2.json"));
  ASSERT_TRUE(tok.is_ok());
  auto r = tok->decode(std::vector<std::uint32_t>{10, 11, 500});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("500 at position 2"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace tz::model
