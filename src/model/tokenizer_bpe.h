// The BPE model of a tokenizer.json ("model": {"type": "BPE"}): a vocabulary, merges by rank in a
// hash map, and the merge loop of HF tokenizers (lowest rank first, leftmost among equals), with
// byte_fallback (<0xXX> tokens), unk_token/fuse_unk, continuing_subword_prefix, end_of_word_suffix
// and ignore_merges.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace tz::model {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, std::uint32_t, StringHash, std::equal_to<>>;

// Results of words already tokenized. One per thread (it is not locked); bounded, cleared when
// full.
class BpeCache {
 public:
  explicit BpeCache(std::size_t capacity = 1 << 18) : capacity_(capacity) {}
  const std::vector<std::uint32_t>* find(std::string_view word) const;
  void insert(std::string_view word, const std::vector<std::uint32_t>& ids);

 private:
  std::size_t capacity_;
  std::unordered_map<std::string, std::vector<std::uint32_t>, StringHash, std::equal_to<>> map_;
};

class BpeModel {
 public:
  // Reads the "model" object of `file`. kInvalidArgument naming the file for a dropout other than
  // 0 (non-deterministic), a merge whose parts or result are not in the vocabulary, a malformed
  // merge, or an unk_token missing from the vocabulary.
  static Result<BpeModel> from_json(const nlohmann::json& model, const std::string& file);

  // Appends the ids of one pre-token (HF's Model::tokenize). kInvalidArgument when a character is
  // neither in the vocabulary nor covered by byte_fallback and there is no unk_token.
  Status tokenize(std::string_view word, std::vector<std::uint32_t>& out, BpeCache* cache) const;

  std::optional<std::uint32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(std::uint32_t id) const;  // null when the id is not in the vocab
  std::uint32_t id_bound() const { return static_cast<std::uint32_t>(id_to_token_.size()); }
  std::uint32_t vocab_count() const { return static_cast<std::uint32_t>(vocab_.size()); }
  // Whether `id` is the left or right part of any merge.
  bool in_any_merge(std::uint32_t id) const;

 private:
  void merge_word(std::string_view word, std::vector<std::uint32_t>& out) const;
  Status symbols_of(std::string_view word, std::vector<std::uint32_t>& ids,
                    std::vector<std::uint32_t>& lens) const;

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;  // "" for ids not in the vocabulary
  std::vector<bool> has_id_;
  // (left << 32 | right) -> (rank, merged id)
  std::unordered_map<std::uint64_t, std::pair<std::uint32_t, std::uint32_t>> merges_;
  std::vector<bool> in_merge_;
  std::optional<std::uint32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::uint32_t byte_ids_[256] = {};  // <0xXX> ids when byte_fallback and all 256 exist
  bool has_byte_ids_ = false;
};

}  // namespace tz::model
