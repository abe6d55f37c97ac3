// The text stages of a tokenizer.json around its model, each parsed from its JSON object and
// applied alone: normalizers (NFC, NFKC, NFD, NFKD, Prepend, Replace, Sequence), pre-tokenizers
// (ByteLevel, Split, Metaspace, Digits, Sequence) and decoders (ByteLevel, Metaspace, Replace,
// ByteFallback, Fuse, Strip, Sequence). A type tierzero does not implement is refused by name.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/tokenizer_text.h"

namespace tz::model {

// One normalizer; a Sequence is flattened into a list of these.
struct Normalizer {
  enum class Kind { kUnicode, kPrepend, kReplace };
  Kind kind = Kind::kUnicode;
  text::NormalForm form = text::NormalForm::kNfc;
  std::string prepend;               // kPrepend
  std::string pattern, content;      // kReplace with a String pattern
  std::optional<text::Regex> regex;  // kReplace with a Regex pattern
};

// Parses "normalizer" (null gives an empty list). kInvalidArgument names the type and `file`.
Result<std::vector<Normalizer>> parse_normalizers(const nlohmann::json& j, const std::string& file);
// Applies the list to `s`. `continuation`: `s` continues a text cut before it (tokenize's chunks),
// so Prepend, which only acts at the start of a split, is skipped.
void apply_normalizers(const std::vector<Normalizer>& list, std::string& s, bool continuation);

// A piece of text between pre-tokenizers. `text_start`: it begins at offset 0 of the input (for
// Metaspace's "first"); `continuation`: it begins inside a split of a text cut before it, where
// no prefix is added.
struct PreToken {
  std::string text;
  bool text_start = false;
  bool continuation = false;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizer {
  enum class Kind { kByteLevel, kSplit, kMetaspace, kDigits };
  Kind kind = Kind::kByteLevel;
  bool add_prefix_space = false;     // ByteLevel
  bool use_regex = true;             // ByteLevel
  std::optional<text::Regex> regex;  // Split (Regex) and ByteLevel's own
  std::string literal;               // Split with a String pattern
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  std::string replacement;  // Metaspace, as UTF-8
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;               // Metaspace
  bool individual_digits = false;  // Digits
};

Result<std::vector<PreTokenizer>> parse_pre_tokenizers(const nlohmann::json& j,
                                                       const std::string& file);
// Runs every pre-tokenizer over `pieces` in order; empty pieces are dropped, as HF drops them.
void apply_pre_tokenizers(const std::vector<PreTokenizer>& list, std::vector<PreToken>& pieces);

struct Decoder {
  enum class Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };
  Kind kind = Kind::kByteLevel;
  std::string replacement;  // Metaspace
  bool prepend_never = false;
  std::string pattern, content;  // Replace (String pattern)
  std::optional<text::Regex> regex;
  std::string strip;  // Strip: the character
  int strip_start = 0, strip_stop = 0;
};

Result<std::vector<Decoder>> parse_decoders(const nlohmann::json& j, const std::string& file);
// HF's Decoder::decode: each decoder's decode_chain in turn, then the pieces joined. With no
// decoder the tokens are joined with spaces, as HF does.
std::string apply_decoders(const std::vector<Decoder>& list, std::vector<std::string> tokens);

}  // namespace tz::model
