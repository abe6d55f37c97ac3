// Text primitives of the tokenizer pipeline: UTF-8 validation and decoding, Unicode classes,
// NFC/NFKC normalization (utf8proc), a PCRE2 regex (UTF + UCP, JIT) with the meaning of `\s` HF
// tokenizers' Oniguruma gives it, and GPT-2's byte <-> character table of the ByteLevel components.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace tz::model::text {

// Offset of the first byte that does not start or continue a valid UTF-8 sequence (overlong forms,
// surrogates and code points past U+10FFFF are invalid), or s.size() when all of `s` is valid.
std::size_t invalid_utf8_offset(std::string_view s);

// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for a continuation byte, so
// loops over invalid text still advance).
inline std::size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xf0) return 4;
  if (lead >= 0xe0) return 3;
  if (lead >= 0xc0) return 2;
  return 1;
}

// Decodes the code point at s[i] (valid UTF-8 assumed) and sets `len` to its byte length.
char32_t decode_utf8(std::string_view s, std::size_t i, std::size_t* len);
void append_utf8(std::string& out, char32_t c);

// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Unicode classes as HF's Rust code tests them.
bool is_whitespace(char32_t c);  // White_Space: \t-\r, space, U+85, U+A0, Zs, U+2028/9
bool is_word_char(char32_t c);   // regex `\w`: letters, marks, Nd, Nl, Pc, ZWNJ/ZWJ
bool is_numeric(char32_t c);     // char::is_numeric: Nd, Nl, No
bool is_letter(char32_t c);      // L*

enum class NormalForm { kNfc, kNfkc, kNfd, kNfkd };
// `s` in the given normal form. ASCII text is returned as is (it is invariant under all four).
std::string normalize(std::string_view s, NormalForm form);

// A compiled PCRE2 pattern. Copies share the compiled code; matching is thread-safe (each thread
// keeps its own match data and JIT stack).
class Regex {
 public:
  // Compiles `pattern` (Oniguruma syntax as HF writes it; `\s` and `\S` are rewritten to Unicode
  // White_Space, which is what Oniguruma matches). kInvalidArgument names `what` and PCRE2's
  // message with the offset in the pattern.
  static Result<Regex> compile(std::string_view pattern, const std::string& what);

  // Appends the [begin, end) byte ranges of the non-overlapping matches in `s`, left to right (an
  // empty match moves the search on by one character). `s` must be valid UTF-8.
  void find_all(std::string_view s, std::vector<std::pair<std::size_t, std::size_t>>& out) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8
};

// GPT-2's table: byte b <-> one printable character (as UTF-8), used by ByteLevel.
const std::string& byte_to_char(unsigned char b);
// The byte of the ByteLevel character `c`, or -1 when `c` is not one of the 256.
int char_to_byte(char32_t c);

}  // namespace tz::model::text
