// Next-token sampling: greedy is the arg-max (lowest id among ties), draws follow
// softmax(logits / T) restricted to the top k (frequencies within 5 standard errors of the
// probabilities computed here in double), the same seed repeats, bad options are refused; and
// generation through a real model is greedy-consistent with last_logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "model/sampling.h"
#include "model_harness.h"

namespace tz::model {
namespace {

TEST(SamplingTest, GreedyIsTheArgMax) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  Sampler greedy({0.0, 0, 1});
  EXPECT_EQ(greedy.next(logits), 1);
  Sampler top1({5.0, 1, 1});  // top-1 at any temperature is greedy
  for (int i = 0; i < 20; ++i) EXPECT_EQ(top1.next(logits), 1);
}

void expect_frequencies(const std::vector<float>& logits, double temperature, int top_k,
                        std::uint64_t seed) {
  std::printf("seed %llu temperature %.2f top_k %d\n", static_cast<unsigned long long>(seed),
              temperature, top_k);
  // Reference: the k largest logits (ties to the lower id), softmax of logit / T in double.
  std::vector<int> order(logits.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)];
  });
  const std::size_t k = top_k == 0 ? logits.size() : std::min(logits.size(), static_cast<std::size_t>(top_k));
  std::vector<double> p(logits.size(), 0.0);
  double z = 0;
  for (std::size_t i = 0; i < k; ++i) z += std::exp(logits[static_cast<std::size_t>(order[i])] / temperature);
  for (std::size_t i = 0; i < k; ++i) {
    p[static_cast<std::size_t>(order[i])] = std::exp(logits[static_cast<std::size_t>(order[i])] / temperature) / z;
  }
  constexpr int kDraws = 40000;
  std::vector<int> count(logits.size(), 0);
  Sampler s({temperature, top_k, seed});
  for (int i = 0; i < kDraws; ++i) ++count[static_cast<std::size_t>(s.next(logits))];
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double f = static_cast<double>(count[i]) / kDraws;
    if (p[i] == 0) {
      EXPECT_EQ(count[i], 0) << "id " << i << " is outside the top " << top_k;
    } else {
      const double se = std::sqrt(p[i] * (1 - p[i]) / kDraws);
      EXPECT_NEAR(f, p[i], 5 * se + 1e-12) << "id " << i;
    }
  }
}

TEST(SamplingTest, DrawsFollowTheTemperedTopKSoftmax) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -3.0f};
  expect_frequencies(logits, 1.0, 0, 11);
  expect_frequencies(logits, 0.5, 0, 12);
  expect_frequencies(logits, 2.0, 3, 13);
  expect_frequencies(logits, 1.0, 100, 14);  // k above the vocabulary: all
}

TEST(SamplingTest, SameSeedSameDraws) {
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f};
  Sampler a({1.0, 0, 99}), b({1.0, 0, 99}), c({1.0, 0, 100});
  int same_as_other_seed = 0;
  for (int i = 0; i < 200; ++i) {
    const std::int32_t x = a.next(logits);
    EXPECT_EQ(x, b.next(logits));
    same_as_other_seed += x == c.next(logits);
  }
  EXPECT_LT(same_as_other_seed, 150);
}

TEST(SamplingTest, RejectsBadOptions) {
  EXPECT_NE(check_sampling_options({-1.0, 0, 1}).message().find("--temperature"), std::string::npos);
  EXPECT_NE(check_sampling_options({NAN, 0, 1}).message().find("--temperature"), std::string::npos);
  EXPECT_NE(check_sampling_options({1.0, -2, 1}).message().find("--top-k"), std::string::npos);
  EXPECT_TRUE(check_sampling_options({0.0, 0, 1}).is_ok());
}

TEST(SamplingTest, BytesRoundTrip) {
  const std::string text = "caf\xc3\xa9 \x01\xff";
  const std::vector<std::int32_t> ids = bytes_to_ids(text);
  EXPECT_EQ(ids.back(), 255);
  EXPECT_EQ(ids_to_bytes(ids), text);
}

// Greedy generation picks, at every step, the arg-max of last_logits over the context so far,
// cropped to the model's positions once it is longer.
TEST(SamplingTest, GreedyGenerationFollowsLastLogits) {
  const std::string name = "gpt2:layers=1,heads=2,embd=16,vocab=256,seq=8";
  Gpt2Options options;
  options.micro_batch = 1;
  Status s = testing::with_model(testing::config_json(testing::kSgd1), name, options,
                                 [&](zero::Engine&, Gpt2& gpt) -> Status {
    TZ_RETURN_IF_ERROR(gpt.init_weights(5));
    const std::vector<std::int32_t> prompt = bytes_to_ids("hello");
    TZ_ASSIGN_OR_RETURN(const std::vector<std::int32_t> out, generate(gpt, prompt, 6, {0.0, 0, 1}));
    EXPECT_EQ(out.size(), 6u);
    std::vector<std::int32_t> context = prompt;
    for (const std::int32_t id : out) {
      const std::size_t start = context.size() > 8 ? context.size() - 8 : 0;
      TZ_ASSIGN_OR_RETURN(const std::vector<float> l, gpt.last_logits(std::span(context).subspan(start)));
      EXPECT_EQ(id, std::max_element(l.begin(), l.end()) - l.begin());
      context.push_back(id);
    }
    EXPECT_EQ(generate(gpt, {}, 3, {}).status().code(), ErrorCode::kInvalidArgument);
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
}

// A decoder like ByteLevel's: each id is one byte, and an incomplete UTF-8 sequence at the end
// decodes to U+FFFD (a lossy decode).
Result<std::string> lossy_bytes(std::span<const std::int32_t> ids) {
  std::string s = ids_to_bytes(ids);
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + len > s.size()) return s.substr(0, i) + "\xEF\xBF\xBD";
    i += len;
  }
  return s;
}

TEST(TextStreamTest, HoldsBackIncompleteCharactersAndConcatenatesToTheDecode) {
  // "a" + "é" (2 bytes) + "€" (3 bytes) + "😀" (4 bytes) + "b", one byte per id.
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80" "b";
  TextStream stream(lossy_bytes);
  std::vector<std::string> pieces;
  for (const std::int32_t id : bytes_to_ids(text)) {
    Result<std::string> piece = stream.push(id);
    ASSERT_TRUE(piece.is_ok()) << piece.status().to_string();
    pieces.push_back(*piece);
  }
  const std::vector<std::string> want = {"a", "", "\xC3\xA9", "", "", "\xE2\x82\xAC",
                                         "", "", "", "\xF0\x9F\x98\x80", "b"};
  EXPECT_EQ(pieces, want);
  Result<std::string> rest = stream.finish();
  ASSERT_TRUE(rest.is_ok());
  EXPECT_EQ(*rest, "");
}

TEST(TextStreamTest, FinishReleasesATrailingIncompleteCharacter) {
  TextStream stream(lossy_bytes);
  ASSERT_EQ(*stream.push('x'), "x");
  ASSERT_EQ(*stream.push(0xE2), "");
  EXPECT_EQ(*stream.finish(), "\xEF\xBF\xBD");  // what decode gives for the whole
}

TEST(TextStreamTest, ADecodeErrorStops) {
  TextStream stream([](std::span<const std::int32_t>) -> Result<std::string> {
    return Status::invalid_argument("id 9 is not in the vocabulary");
  });
  EXPECT_FALSE(stream.push(9).is_ok());
}

}  // namespace
}  // namespace tz::model
