// A Hugging Face tokenizer.json in C++: added tokens matched in the raw text (longest first, with
// lstrip, rstrip, single_word, normalized), then normalizers, pre-tokenizers and the BPE model per
// piece; decoding through the file's decoders. Encoding is Tokenizer.encode(text,
// add_special_tokens=False) of HF tokenizers; the post-processor, truncation and padding are not
// applied (they wrap sequences for a model's input, not a corpus).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/tokenizer_bpe.h"
#include "model/tokenizer_pipeline.h"

namespace tz::model {

struct AddedToken {
  std::uint32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  std::string decode_form;  // what decode emits: the normalized content when `normalized`, as HF
};

// Leftmost-longest matching of a set of strings (HF's Aho-Corasick with
// MatchKind::LeftmostLongest).
class AddedTokenMatcher {
 public:
  void add(std::string pattern, std::size_t token_index);
  void build();  // after the last add: orders each bucket longest first
  bool empty() const { return count_ == 0; }
  // The longest pattern that starts at s[pos]: (length, token index), or nullopt.
  std::optional<std::pair<std::size_t, std::size_t>> longest_at(std::string_view s,
                                                                std::size_t pos) const;

 private:
  // Patterns by first byte, longest first.
  std::vector<std::pair<std::string, std::size_t>> by_first_[256];
  std::size_t count_ = 0;
};

class Tokenizer {
 public:
  // Loads `path`: a tokenizer.json, or a folder holding one. Errors name the file: unreadable, not
  // JSON, a model other than BPE, a component tierzero does not implement (by its type), an added
  // token whose id clashes with another token.
  static Result<Tokenizer> load(const std::string& path);

  // The ids of `text` (HF's encode(text, add_special_tokens=False)). kInvalidArgument naming the
  // source and the byte offset when `text` is not valid UTF-8 (`source` names where it came from;
  // `offset_base` is added to offsets in messages). `continuation`: `text` starts inside a text cut
  // before it at a safe point (is_safe_cut), so nothing is prepended at its start. `cache`:
  // per-thread BPE cache, or null.
  Result<std::vector<std::uint32_t>> encode(std::string_view text, bool continuation = false,
                                            BpeCache* cache = nullptr,
                                            const std::string& source = "text",
                                            std::uint64_t offset_base = 0) const;

  // The text of `ids` (HF's decode(ids, skip_special_tokens)). kInvalidArgument naming the position
  // of an id that is not in the vocabulary (HF would drop it silently).
  Result<std::string> decode(std::span<const std::uint32_t> ids,
                             bool skip_special_tokens = false) const;

  std::optional<std::uint32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(std::uint32_t id) const;
  // One past the largest id (model vocabulary and added tokens).
  std::uint32_t vocab_size() const { return vocab_size_; }
  const std::string& file() const { return file_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  // Whether a text may be cut after a '\n' and the parts encoded separately (the later ones with
  // continuation = true) giving the ids of the whole: true when the pre-tokenizer splits there or
  // the model never merges the newline's token, and probe texts confirm it.
  bool cuts_at_newlines() const { return cuts_at_newlines_; }
  // Whether `text` may be cut at `pos`: text[pos - 1] is '\n' after a character that is not
  // whitespace, text[pos] starts a letter or ASCII digit, and no added token with lstrip starts
  // there. False when !cuts_at_newlines().
  bool is_safe_cut(std::string_view text, std::size_t pos) const;

 private:
  struct Segment {
    std::size_t begin, end;
    std::optional<std::uint32_t> id;  // an added token
  };
  void split_added(std::string_view s, const AddedTokenMatcher& matcher,
                   std::vector<Segment>& out) const;
  Status encode_valid(std::string_view text, bool continuation, BpeCache* cache,
                      std::vector<std::uint32_t>& out) const;
  bool cut_candidate(std::string_view text, std::size_t pos) const;
  bool probe_cuts() const;

  std::string file_;
  BpeModel model_;
  std::vector<Normalizer> normalizers_;
  std::vector<PreTokenizer> pre_tokenizers_;
  std::vector<Decoder> decoders_;
  std::vector<AddedToken> added_;
  StringIdMap added_by_content_;
  std::vector<std::int64_t> added_index_by_id_;  // -1 when the id is not an added token
  AddedTokenMatcher raw_matcher_;                // normalized == false
  AddedTokenMatcher normalized_matcher_;         // normalized == true, on the normalized content
  bool has_lstrip_ = false;
  std::uint32_t vocab_size_ = 0;
  bool cuts_at_newlines_ = false;
};

}  // namespace tz::model
