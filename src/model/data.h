// Training data: llm.c token files and plain text read as bytes, validated before any step runs,
// and the loader that hands each rank its micro-batches in llm.c's order (or a seeded shuffle of
// sequence offsets), a fixed set of validation batches, and its position as a small state.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/output_file.h"
#include "core/status.h"

namespace tz::model {

// llm.c's token file: 256 little-endian int32 (magic, version, token count, then zeros), followed
// by `count` tokens: uint16 in version 1 (GPT-2's format), uint32 in version 2 (llm.c's format for
// vocabularies past 65,536 ids, such as Llama 3's).
inline constexpr std::int32_t kTokenFileMagic = 20240520;
inline constexpr std::int32_t kTokenFileVersion = 1;     // uint16 tokens
inline constexpr std::int32_t kTokenFileVersionU32 = 2;  // uint32 tokens
inline constexpr std::size_t kTokenFileHeaderInts = 256;
inline constexpr std::size_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;

// A corpus in memory: every token of one file.
struct TokenData {
  std::string path;
  bool byte_level = false;  // plain text read as bytes (vocab 256), not a token file
  int version = 0;          // the token file's version (1 or 2); 0 for plain text
  std::vector<std::uint32_t> tokens;
};

// Reads `path` as a token file (version 1 or 2) when it ends in ".bin" or starts with the magic,
// else as plain text (each byte one token). Errors (kCorrupt / kInvalidArgument / an errno) name
// the file and what is wrong: wrong magic or version, a size that disagrees with the header's
// count, a token >= `vocab` (its value and position), an empty file, an unreadable file.
Result<TokenData> load_tokens(const std::string& path, std::int64_t vocab);

// `count` uniform random token ids below `vocab` from `seed` (path "<synthetic>"): the corpus of a
// run without one, for measuring step time on a shape without a tokenized corpus.
TokenData synthetic_tokens(std::uint64_t count, std::int64_t vocab, std::uint64_t seed);

// The version a file of tokens below `vocab` needs: 1 when every id fits uint16, else 2.
inline std::int32_t token_file_version_for(std::int64_t vocab) {
  return vocab <= 65536 ? kTokenFileVersion : kTokenFileVersionU32;
}

// Writes `tokens` as a token file of `version` (0: 1 when every token fits uint16, else 2) by
// core/output_file.h's rule (a temporary name renamed over `path` when complete; `path` is never
// one of `inputs`). kInvalidArgument when there are more tokens than the header's int32 count can
// hold or a token does not fit version 1; errno errors name the file.
Status write_token_file(const std::string& path, std::span<const std::uint32_t> tokens,
                        std::int32_t version = 0, const std::vector<std::string>& inputs = {});
Status write_token_file(const std::string& path, std::span<const std::uint16_t> tokens);

// Writes a token file as its tokens arrive (tokenizing a corpus larger than memory): the tokens go
// to a temporary file after a blank header; finish() writes the header and renames the file to
// `path`. Without finish() (an error, a crash) `path` is untouched and the temporary file is
// removed. `path` may not be one of `inputs` (the text being tokenized).
class TokenFileWriter {
 public:
  static Result<TokenFileWriter> create(const std::string& path, std::int32_t version,
                                        const std::vector<std::string>& inputs = {});
  TokenFileWriter(TokenFileWriter&& other) noexcept = default;
  TokenFileWriter& operator=(TokenFileWriter&&) = delete;
  TokenFileWriter(const TokenFileWriter&) = delete;

  // kInvalidArgument for a token that does not fit the version, or past 2^31 - 1 tokens.
  Status append(std::span<const std::uint32_t> tokens);
  Status finish();
  std::uint64_t count() const { return count_; }

 private:
  TokenFileWriter(OutputFile out, std::int32_t version)
      : out_(std::move(out)), version_(version) {}
  OutputFile out_;
  std::int32_t version_ = 1;
  std::uint64_t count_ = 0;
  std::vector<unsigned char> buffer_;
};

struct LoaderOptions {
  int micro_batch = 4;  // B: sequences per micro-batch
  int seq = 256;        // T: tokens per sequence
  int rank = 0;
  int world_size = 1;
  bool shuffle = false;  // permute sequence offsets, reshuffled every epoch, seeded
  std::uint64_t seed = 1234;
};

// Hands out rank `rank`'s micro-batches. The corpus is cut into S = (n - 1) / T sequences (each
// needs T + 1 tokens: inputs and targets shifted by one); rank r's micro-batch b holds the B
// sequences at positions ((b mod R)·N + r)·B + i, i < B, of the epoch's order, R = S / (N·B)
// rounds per epoch. Without shuffle the order is the identity, so micro-batch b is the B·T tokens
// starting at token (b·N + r)·B·T, as llm.c's loader reads them, and the loader goes back to the
// start when the file is used up. With shuffle, epoch e's order is a permutation drawn from
// (seed, e), the same on every rank.
class DataLoader {
 public:
  // kInvalidArgument naming the file and the tokens needed when it holds fewer than one
  // micro-batch per rank (N·B·T + 1 tokens), or for non-positive sizes / a rank out of range.
  static Result<DataLoader> create(std::shared_ptr<const TokenData> data, const LoaderOptions& opt);

  // Fills `tokens` and `targets` (B·T each) with the next micro-batch and advances.
  void next(std::span<std::int32_t> tokens, std::span<std::int32_t> targets);
  // Fills micro-batch `b` without moving the position (the same as the b-th call of next()).
  void batch(std::int64_t b, std::span<std::int32_t> tokens, std::span<std::int32_t> targets) const;

  std::int64_t position() const { return next_batch_; }  // micro-batches handed out so far
  std::int64_t rounds_per_epoch() const { return rounds_; }
  std::int64_t tokens_per_micro_batch() const;
  const LoaderOptions& options() const { return opt_; }
  const TokenData& data() const { return *data_; }

  // {"epoch", "sequences" (of that epoch's order, consumed by all ranks), "seq", "shuffle", "seed",
  // "tokens", and the saving run's "micro_batch" and "world_size"}: enough to continue where a
  // checkpoint left off, with any rank count and micro-batch size whose round (N·B sequences)
  // divides the saved position. restore() refuses (kInvalidArgument naming the field) a state taken
  // with another seq, seed, shuffle or corpus length, or one that falls inside this run's round.
  nlohmann::ordered_json state() const;
  Status restore(const nlohmann::json& state);

 private:
  DataLoader(std::shared_ptr<const TokenData> data, const LoaderOptions& opt, std::int64_t seqs,
             std::int64_t rounds);
  // Sequence index of row `row` (< B) of micro-batch `b` of this rank.
  std::int64_t sequence_of(std::int64_t b, int row) const;
  void ensure_epoch(std::int64_t epoch) const;

  std::shared_ptr<const TokenData> data_;
  LoaderOptions opt_;
  std::int64_t seqs_ = 0;    // S
  std::int64_t rounds_ = 0;  // R
  std::int64_t next_batch_ = 0;
  // The order of the epoch last used (shuffle only); recomputed when the epoch changes.
  mutable std::int64_t order_epoch_ = -1;
  mutable std::vector<std::uint32_t> order_;
};

// The permutation of 0..n-1 that epoch `epoch` of a shuffled loader uses (Fisher-Yates on a
// seeded 64-bit generator; the same on every platform). Exposed for tests.
std::vector<std::uint32_t> shuffled_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

// The fixed validation set: the first `count` micro-batches of an unshuffled loader over the
// validation file, split over ranks as training batches are (rank r evaluates its own
// micro-batches 0..per_rank-1). kInvalidArgument as DataLoader::create.
struct ValidationSet {
  DataLoader loader;
  int batches_per_rank = 0;  // min(requested / N rounded up, rounds the file holds), >= 1
};
Result<ValidationSet> make_validation_set(std::shared_ptr<const TokenData> data,
                                          const LoaderOptions& opt, int requested_batches);

}  // namespace tz::model
