// Token files, text corpora and the loader (model/data.h), against references written here: the
// header's bytes decoded by hand, llm.c's offset formula (b·N + r)·B·T, and brute-force checks of
// the shuffled order (a permutation, whole sequences, the same on every rank).
#include "model/data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace tz::model {
namespace {

namespace fs = std::filesystem;

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tz_data_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static void write_bytes(const std::string& p, const std::vector<unsigned char>& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }
  static std::vector<unsigned char> read_bytes(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }
  // A token file built byte by byte (independent of write_token_file).
  static std::vector<unsigned char> token_file_bytes(std::int32_t magic, std::int32_t version,
                                                     std::int32_t count,
                                                     const std::vector<std::uint16_t>& tokens) {
    std::vector<unsigned char> b(1024, 0);
    auto put = [&](std::size_t at, std::int32_t v) {
      const auto u = static_cast<std::uint32_t>(v);
      for (int i = 0; i < 4; ++i)
        b[at + static_cast<std::size_t>(i)] = static_cast<unsigned char>(u >> (8 * i));
    };
    put(0, magic);
    put(4, version);
    put(8, count);
    for (std::uint16_t t : tokens) {
      b.push_back(static_cast<unsigned char>(t & 0xff));
      b.push_back(static_cast<unsigned char>(t >> 8));
    }
    return b;
  }
  std::string expect_error(const std::string& p, int vocab) {
    auto r = load_tokens(p, vocab);
    EXPECT_FALSE(r.is_ok()) << p;
    if (r.is_ok()) return {};
    const std::string msg = r.status().message();
    EXPECT_NE(msg.find(p), std::string::npos) << "error does not name the file: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "error is not one line: " << msg;
    return msg;
  }

  fs::path dir_;
};

std::vector<std::uint16_t> random_tokens(std::size_t n, unsigned vocab, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::uint16_t> t(n);
  for (auto& x : t) x = static_cast<std::uint16_t>(gen() % vocab);
  return t;
}

TEST_F(DataTest, TokenFileRoundTripHasLlmcHeader) {
  const std::uint64_t seed = 17;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const auto tokens = random_tokens(3001, 50257, seed);
  const std::string p = path("a.bin");
  ASSERT_TRUE(write_token_file(p, tokens).is_ok());
  EXPECT_EQ(read_bytes(p), token_file_bytes(20240520, 1, 3001, tokens));
  auto r = load_tokens(p, 50257);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_FALSE(r->byte_level);
  EXPECT_EQ(r->version, 1);
  EXPECT_EQ(r->tokens, std::vector<std::uint32_t>(tokens.begin(), tokens.end()));
}

// Version 2 (uint32 tokens) built byte by byte, read back, and written back identically; ids past
// 65,535 (Llama 3's vocabulary) survive both ways.
TEST_F(DataTest, Version2TokenFilesHoldUint32Ids) {
  const std::vector<std::uint32_t> tokens = {0, 65535, 65536, 128255, 7, 2000000000};
  std::vector<unsigned char> bytes(1024, 0);
  const std::uint32_t header[3] = {20240520, 2, 6};
  for (std::size_t h = 0; h < 3; ++h) {
    for (std::size_t i = 0; i < 4; ++i) {
      bytes[4 * h + i] = static_cast<unsigned char>(header[h] >> (8 * i));
    }
  }
  for (std::uint32_t t : tokens)
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<unsigned char>(t >> (8 * i)));
  write_bytes(path("v2.bin"), bytes);
  auto r = load_tokens(path("v2.bin"), 2000000001);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->version, 2);
  EXPECT_EQ(r->tokens, tokens);
  // The writer picks version 2 because an id does not fit uint16.
  ASSERT_TRUE(write_token_file(path("out.bin"), tokens).is_ok());
  EXPECT_EQ(read_bytes(path("out.bin")), bytes);
  EXPECT_FALSE(fs::exists(path("out.bin.tmp")));
  EXPECT_NE(expect_error(path("v2.bin"), 128256).find("token 2000000000 at position 5"),
            std::string::npos);
  // Version 1 refuses an id it cannot hold instead of truncating it.
  auto st = write_token_file(path("v1.bin"), tokens, kTokenFileVersion);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("token 65536 at position 2"), std::string::npos) << st.message();
  EXPECT_FALSE(fs::exists(path("v1.bin")));
  EXPECT_FALSE(fs::exists(path("v1.bin.tmp")));
}

// The streaming writer: appends in pieces, nothing at the final name until finish(), and the
// temporary file removed when it is dropped unfinished.
// Files in the test folder whose name contains `part`.
std::size_t count_entries_with(const fs::path& dir, const std::string& part) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    n += e.path().filename().string().find(part) != std::string::npos ? 1 : 0;
  }
  return n;
}

TEST_F(DataTest, StreamingWriterRenamesWhenComplete) {
  const auto entries_with = [this](const std::string& part) {
    return count_entries_with(fs::path(path("")), part);
  };
  {
    auto w = TokenFileWriter::create(path("s.bin"), kTokenFileVersion);
    ASSERT_TRUE(w.is_ok());
    ASSERT_TRUE(w->append(std::vector<std::uint32_t>{1, 2}).is_ok());
    ASSERT_TRUE(w->append(std::vector<std::uint32_t>{}).is_ok());
    ASSERT_TRUE(w->append(std::vector<std::uint32_t>{3}).is_ok());
    EXPECT_FALSE(fs::exists(path("s.bin")));
    ASSERT_TRUE(w->finish().is_ok());
  }
  EXPECT_EQ(read_bytes(path("s.bin")), token_file_bytes(20240520, 1, 3, {1, 2, 3}));
  {
    auto w = TokenFileWriter::create(path("dropped.bin"), kTokenFileVersionU32);
    ASSERT_TRUE(w.is_ok());
    ASSERT_TRUE(w->append(std::vector<std::uint32_t>{1}).is_ok());
    EXPECT_EQ(entries_with("dropped.bin"), 1u);  // the temporary file, under its own name
  }
  EXPECT_EQ(entries_with("dropped.bin"), 0u);
  EXPECT_FALSE(fs::exists(path("dropped.bin")));
}

// A run without a corpus draws from the whole vocabulary: a 128k vocabulary's ids past 65,535
// were cut to 16 bits before.
TEST(SyntheticTokens, CoverTheWholeVocabularyAndRepeatBySeed) {
  const TokenData a = synthetic_tokens(20000, 128256, 7);
  const TokenData b = synthetic_tokens(20000, 128256, 7);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.path, "<synthetic>");
  std::uint32_t max_id = 0;
  for (std::uint32_t t : a.tokens) {
    ASSERT_LT(t, 128256u);
    max_id = std::max(max_id, t);
  }
  EXPECT_GT(max_id, 65535u);
  EXPECT_NE(synthetic_tokens(100, 128256, 8).tokens,
            std::vector<std::uint32_t>(a.tokens.begin(), a.tokens.begin() + 100));
}

TEST_F(DataTest, MagicIdentifiesTokenFileWithoutBinSuffix) {
  const std::vector<std::uint16_t> tokens = {1, 2, 3, 65535};
  const std::string p = path("tokens.dat");
  write_bytes(p, token_file_bytes(20240520, 1, 4, tokens));
  auto r = load_tokens(p, 65536);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, std::vector<std::uint32_t>(tokens.begin(), tokens.end()));
}

TEST_F(DataTest, PlainTextIsReadAsBytes) {
  const std::string text = "Call me Ishmael.\n\xc3\xa9";  // a UTF-8 e-acute: two bytes >= 128
  const std::string p = path("book.txt");
  write_bytes(p, std::vector<unsigned char>(text.begin(), text.end()));
  auto r = load_tokens(p, 256);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r->byte_level);
  ASSERT_EQ(r->tokens.size(), text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    EXPECT_EQ(r->tokens[i], static_cast<unsigned char>(text[i])) << i;
  }
}

TEST_F(DataTest, BadFilesNameTheFileAndTheProblem) {
  const std::vector<std::uint16_t> tokens = {5, 6, 7, 8};
  write_bytes(path("magic.bin"), token_file_bytes(20240521, 1, 4, tokens));
  EXPECT_NE(expect_error(path("magic.bin"), 256).find("wrong magic 20240521"), std::string::npos);

  write_bytes(path("version.bin"), token_file_bytes(20240520, 3, 4, tokens));
  EXPECT_NE(expect_error(path("version.bin"), 256).find("version 3"), std::string::npos);

  // A version 2 header over uint16 tokens: the size disagrees with 4 uint32 tokens.
  write_bytes(path("v2short.bin"), token_file_bytes(20240520, 2, 4, tokens));
  EXPECT_NE(expect_error(path("v2short.bin"), 256).find("version 2 header says 4 tokens"),
            std::string::npos);

  auto truncated = token_file_bytes(20240520, 1, 4, tokens);
  truncated.pop_back();
  write_bytes(path("short.bin"), truncated);
  EXPECT_NE(expect_error(path("short.bin"), 256).find("header says 4 tokens"), std::string::npos);

  auto longer = token_file_bytes(20240520, 1, 4, tokens);
  longer.push_back(0);
  longer.push_back(0);
  write_bytes(path("long.bin"), longer);
  EXPECT_NE(expect_error(path("long.bin"), 256).find("header says 4 tokens"), std::string::npos);

  write_bytes(path("header.bin"), std::vector<unsigned char>(100, 0));
  EXPECT_NE(expect_error(path("header.bin"), 256).find("header"), std::string::npos);

  write_bytes(path("vocab.bin"), token_file_bytes(20240520, 1, 4, {1, 2, 300, 4}));
  EXPECT_NE(expect_error(path("vocab.bin"), 256).find("token 300 at position 2"),
            std::string::npos);

  const std::string text = "abcz";  // 'z' = 122 >= vocab 100
  write_bytes(path("vocab.txt"), std::vector<unsigned char>(text.begin(), text.end()));
  EXPECT_NE(expect_error(path("vocab.txt"), 100).find("token 122 at position 3"),
            std::string::npos);

  write_bytes(path("empty.txt"), {});
  EXPECT_NE(expect_error(path("empty.txt"), 256).find("empty"), std::string::npos);

  EXPECT_NE(expect_error(path("missing.txt"), 256).find("No such file"), std::string::npos);
}

std::shared_ptr<const TokenData> sequential_data(std::size_t n) {
  auto d = std::make_shared<TokenData>();
  d->path = "<memory>";
  d->tokens.resize(n);
  for (std::size_t i = 0; i < n; ++i) d->tokens[i] = static_cast<std::uint16_t>(i % 65536);
  return d;
}

TEST_F(DataTest, TooFewTokensForOneBatchPerRank) {
  // 2 ranks x 3 sequences x 8 tokens, plus the last target: 49 tokens is the minimum.
  LoaderOptions opt{.micro_batch = 3, .seq = 8, .rank = 1, .world_size = 2};
  EXPECT_TRUE(DataLoader::create(sequential_data(49), opt).is_ok());
  auto r = DataLoader::create(sequential_data(48), opt);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("49"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("<memory>"), std::string::npos);
}

// Unshuffled: rank r's micro-batch b is the B·T tokens at ((b mod R)·N + r)·B·T, targets +1.
TEST_F(DataTest, InOrderBatchesFollowLlmcOffsets) {
  const int B = 2, T = 5, N = 3;
  const std::size_t n = 200;  // 39 sequences, R = 39 / 6 = 6 rounds
  auto data = sequential_data(n);
  for (int r = 0; r < N; ++r) {
    LoaderOptions opt{.micro_batch = B, .seq = T, .rank = r, .world_size = N};
    auto loader = DataLoader::create(data, opt);
    ASSERT_TRUE(loader.is_ok());
    const std::int64_t rounds =
        static_cast<std::int64_t>((n - 1) / (static_cast<std::size_t>(N * B * T)));
    EXPECT_EQ(loader->rounds_per_epoch(), rounds);
    std::vector<std::int32_t> tok(B * T), tgt(B * T);
    for (std::int64_t b = 0; b < 3 * rounds + 2; ++b) {
      loader->next(tok, tgt);
      const std::int64_t start = ((b % rounds) * N + r) * B * T;
      for (int i = 0; i < B * T; ++i) {
        ASSERT_EQ(tok[static_cast<std::size_t>(i)], start + i) << "rank " << r << " batch " << b;
        ASSERT_EQ(tgt[static_cast<std::size_t>(i)], start + i + 1);
      }
    }
    EXPECT_EQ(loader->position(), 3 * rounds + 2);
  }
}

TEST_F(DataTest, ShuffledOrderIsASeededPermutation) {
  for (std::uint64_t seed : {1ull, 2ull, 99ull}) {
    auto a = shuffled_order(1000, seed, 0);
    auto sorted = a;
    std::sort(sorted.begin(), sorted.end());
    for (std::uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
    EXPECT_EQ(a, shuffled_order(1000, seed, 0));
    EXPECT_NE(a, shuffled_order(1000, seed, 1));
    EXPECT_NE(a, shuffled_order(1000, seed + 1000, 0));
  }
}

// Shuffled: each row is one whole sequence (T tokens at a multiple of T, targets +1), and within an
// epoch the ranks together use every sequence position at most once.
TEST_F(DataTest, ShuffledBatchesAreWholeDistinctSequences) {
  const int B = 2, T = 4, N = 2;
  const std::uint64_t seed = 7;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  auto data = sequential_data(101);  // 25 sequences, R = 6
  std::set<std::int32_t> used;
  std::vector<std::int32_t> first_epoch_start;
  for (int r = 0; r < N; ++r) {
    LoaderOptions opt{
        .micro_batch = B, .seq = T, .rank = r, .world_size = N, .shuffle = true, .seed = seed};
    auto loader = DataLoader::create(data, opt);
    ASSERT_TRUE(loader.is_ok());
    const auto rounds = loader->rounds_per_epoch();
    ASSERT_EQ(rounds, 6);
    std::vector<std::int32_t> tok(B * T), tgt(B * T);
    for (std::int64_t b = 0; b < 2 * rounds; ++b) {
      loader->next(tok, tgt);
      for (int row = 0; row < B; ++row) {
        const std::int32_t s = tok[static_cast<std::size_t>(row * T)];
        ASSERT_EQ(s % T, 0);
        for (int j = 0; j < T; ++j) {
          ASSERT_EQ(tok[static_cast<std::size_t>(row * T + j)], s + j);
          ASSERT_EQ(tgt[static_cast<std::size_t>(row * T + j)], s + j + 1);
        }
        if (b < rounds) {
          EXPECT_TRUE(used.insert(s).second) << "sequence " << s << " used twice";
        }
        if (r == 0 && row == 0 && b == 0) first_epoch_start.push_back(s);
      }
    }
    if (r == 0) {
      // The second epoch reshuffles: across the first micro-batches of both epochs at least one
      // row differs for this seed (checked against the order itself, not the loader).
      const auto e0 = shuffled_order(25, seed, 0);
      const auto e1 = shuffled_order(25, seed, 1);
      EXPECT_EQ(first_epoch_start[0], static_cast<std::int32_t>(e0[0]) * T);
      EXPECT_NE(e0, e1);
      std::vector<std::int32_t> t2(B * T), g2(B * T);
      loader->batch(rounds, t2, g2);
      EXPECT_EQ(t2[0], static_cast<std::int32_t>(e1[0]) * T);
    }
  }
  EXPECT_EQ(used.size(), static_cast<std::size_t>(6 * N * B));
}

TEST_F(DataTest, StateRestoresThePosition) {
  auto data = sequential_data(500);
  LoaderOptions opt{
      .micro_batch = 2, .seq = 8, .rank = 1, .world_size = 2, .shuffle = true, .seed = 3};
  auto a = DataLoader::create(data, opt);
  ASSERT_TRUE(a.is_ok());
  std::vector<std::int32_t> tok(16), tgt(16), tok2(16), tgt2(16);
  for (int i = 0; i < 11; ++i) a->next(tok, tgt);
  const auto state = a->state();
  EXPECT_EQ(state["epoch"], 0);         // 62 sequences, 4 per round: 15 rounds per epoch
  EXPECT_EQ(state["sequences"], 11 * 4);
  auto b = DataLoader::create(data, opt);
  ASSERT_TRUE(b.is_ok());
  ASSERT_TRUE(b->restore(state).is_ok());
  for (int i = 0; i < 20; ++i) {
    a->next(tok, tgt);
    b->next(tok2, tgt2);
    ASSERT_EQ(tok, tok2);
    ASSERT_EQ(tgt, tgt2);
  }
  LoaderOptions other = opt;
  other.seq = 4;
  auto c = DataLoader::create(data, other);
  ASSERT_TRUE(c.is_ok());
  const Status st = c->restore(state);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("seq"), std::string::npos) << st.message();
}

// A position saved by 2 ranks resumes on 1 rank (and back) as the same global sequence stream:
// the 1-rank loader's micro-batches 2j and 2j+1 are the 2-rank round's rank 0 and rank 1.
TEST_F(DataTest, StateResumesOnAnotherRankCount) {
  auto data = sequential_data(500);  // T = 8: 62 sequences
  for (const bool shuffle : {false, true}) {
    SCOPED_TRACE(shuffle ? "shuffle" : "in order");
    LoaderOptions two{.micro_batch = 2, .seq = 8, .rank = 0, .world_size = 2, .shuffle = shuffle};
    LoaderOptions two1 = two;
    two1.rank = 1;
    auto r0 = DataLoader::create(data, two);
    auto r1 = DataLoader::create(data, two1);
    ASSERT_TRUE(r0.is_ok() && r1.is_ok());
    std::vector<std::int32_t> tok(16), tgt(16), ref(16), reft(16);
    for (int i = 0; i < 6; ++i) {
      r0->next(tok, tgt);
      r1->next(tok, tgt);
    }
    LoaderOptions one = two;
    one.world_size = 1;
    auto solo = DataLoader::create(data, one);
    ASSERT_TRUE(solo.is_ok());
    ASSERT_TRUE(solo->restore(r0->state()).is_ok());
    for (int round = 6; round < 15; ++round) {  // to the end of the 2-rank epoch
      for (auto* rank : {&*r0, &*r1}) {
        rank->next(ref, reft);
        solo->next(tok, tgt);
        ASSERT_EQ(tok, ref) << "round " << round;
        ASSERT_EQ(tgt, reft) << "round " << round;
      }
    }
    // Back from 1 rank to 2: a position on a 2-rank round boundary resumes, one inside is refused.
    auto again = DataLoader::create(data, two);
    ASSERT_TRUE(again.is_ok());
    auto at_round = DataLoader::create(data, one);
    ASSERT_TRUE(at_round.is_ok());
    for (int i = 0; i < 4; ++i) at_round->next(tok, tgt);
    ASSERT_TRUE(again->restore(at_round->state()).is_ok());
    r0 = DataLoader::create(data, two);
    ASSERT_TRUE(r0.is_ok());
    for (int i = 0; i < 2; ++i) r0->next(ref, reft);
    r0->next(ref, reft);
    again->next(tok, tgt);
    EXPECT_EQ(tok, ref);
    at_round->next(tok, tgt);  // 5 micro-batches of 2: inside a round of 4 sequences
    const Status st = again->restore(at_round->state());
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("not a multiple"), std::string::npos) << st.message();
  }
}

TEST_F(DataTest, ValidationSetSplitsRequestedBatchesOverRanks) {
  auto data = sequential_data(1000);  // T = 10, B = 2, N = 2: 99 sequences, 24 rounds
  LoaderOptions opt{.micro_batch = 2, .seq = 10, .rank = 0, .world_size = 2, .shuffle = true};
  auto v = make_validation_set(data, opt, 5);
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(v->batches_per_rank, 3);  // ceil(5 / 2)
  EXPECT_FALSE(v->loader.options().shuffle);
  auto all = make_validation_set(data, opt, 1000);
  ASSERT_TRUE(all.is_ok());
  EXPECT_EQ(all->batches_per_rank, 24);  // capped at what the file holds
}

}  // namespace
}  // namespace tz::model
