// Corpora through a tokenizer: a text file of any size tokenized into an llm.c token file on
// several threads (the text streamed in blocks, each cut at safe points and encoded in parallel),
// a token file decoded back to text, and a byte-level BPE trainer that writes a tokenizer.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/progress.h"
#include "core/status.h"
#include "model/tokenizer.h"

namespace tz::model {

struct TokenizeFileOptions {
  int threads = 0;                      // 0: the machine's hardware threads
  std::size_t block_bytes = 32u << 20;  // text read per round (split over the threads)
  Progress* progress = nullptr;         // advanced by bytes of text encoded
};

struct TokenizeFileStats {
  std::uint64_t bytes = 0;
  std::uint64_t tokens = 0;
  std::int32_t version = 1;  // of the token file written
  bool parallel = false;     // false when the tokenizer cannot be cut at newlines
};

// Writes the ids of Tokenizer::encode(whole text) of `text_path` to `out_path` (version 1 when the
// vocabulary fits uint16, else 2), through a temporary name renamed when complete. The text is read
// in blocks; each block ends at a safe cut (Tokenizer::is_safe_cut) and is split at safe cuts over
// the threads, so the ids equal those of one encode of the whole file. A tokenizer that cannot be
// cut (cuts_at_newlines() false) reads the whole file and encodes it on one thread. Errors name
// the file: unreadable, invalid UTF-8 (with the byte offset), a character the model cannot encode.
Result<TokenizeFileStats> tokenize_file(const Tokenizer& tokenizer, const std::string& text_path,
                                        const std::string& out_path,
                                        const TokenizeFileOptions& options = {});

// Decodes the token file `token_path` (version 1 or 2) to `out_path` (through a temporary name).
// Returns the bytes written. Errors name the file: a token past the vocabulary, a bad token file.
Result<std::uint64_t> detokenize_file(const Tokenizer& tokenizer, const std::string& token_path,
                                      const std::string& out_path);

struct TrainTokenizerOptions {
  std::int64_t vocab = 4096;  // ids in all: 256 bytes, the merges, and <|endoftext|>
  int threads = 0;
  Progress* progress = nullptr;  // advanced by merges learned
};

// Trains a byte-level BPE (GPT-2's ByteLevel pre-tokenizer and decoder) on the text files and
// returns its tokenizer.json. Merges are learned greedily: the most frequent adjacent pair of the
// words' symbols, ties to the smaller (left id, right id). Stops early when no pair is left.
// kInvalidArgument for vocab < 257 or invalid UTF-8 (naming the file and offset); errno errors.
Result<std::string> train_byte_level_bpe(const std::vector<std::string>& text_paths,
                                         const TrainTokenizerOptions& options);

// Writes `json` as `dir`/tokenizer.json (creating `dir`), through a temporary name.
Status write_tokenizer_json(const std::string& dir, const std::string& json);

}  // namespace tz::model
