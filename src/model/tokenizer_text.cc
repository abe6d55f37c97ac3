// UTF-8, Unicode classes (utf8proc), normalization and PCRE2 matching for the tokenizer pipeline.
#include "model/tokenizer_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <cstring>

#include "core/assert.h"

namespace tz::model::text {

std::size_t invalid_utf8_offset(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;  // overlong
      if (c == 0xed) hi = 0x9f;  // surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;  // overlong
      if (c == 0xf4) hi = 0x8f;  // past U+10FFFF
    } else {
      return i;
    }
    if (i + 1 >= n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k) {
      if (i + k >= n || (p[i + k] & 0xc0) != 0x80) return i;
    }
    i += len;
  }
  return n;
}

char32_t decode_utf8(std::string_view s, std::size_t i, std::size_t* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const unsigned char c = p[0];
  if (c < 0x80) {
    *len = 1;
    return c;
  }
  if (c < 0xe0) {
    *len = 2;
    return (char32_t(c & 0x1f) << 6) | (p[1] & 0x3f);
  }
  if (c < 0xf0) {
    *len = 3;
    return (char32_t(c & 0x0f) << 12) | (char32_t(p[1] & 0x3f) << 6) | (p[2] & 0x3f);
  }
  *len = 4;
  return (char32_t(c & 0x07) << 18) | (char32_t(p[1] & 0x3f) << 12) | (char32_t(p[2] & 0x3f) << 6) |
         (p[3] & 0x3f);
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t i = 0;
  while (i < bytes.size()) {
    const std::size_t bad = invalid_utf8_offset(bytes.substr(i));
    out.append(bytes.data() + i, bad);
    i += bad;
    if (i >= bytes.size()) break;
    // The maximal subpart: the lead byte and the continuation bytes that were valid so far.
    const unsigned char c = p[i];
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    }
    std::size_t take = 1;
    if (len > 0 && i + 1 < bytes.size() && p[i + 1] >= lo && p[i + 1] <= hi) {
      take = 2;
      while (take < len && i + take < bytes.size() && (p[i + take] & 0xc0) == 0x80) ++take;
    }
    out += "\xef\xbf\xbd";
    i += take;
  }
  return out;
}

bool is_whitespace(char32_t c) {
  if (c >= 0x09 && c <= 0x0d) return true;
  if (c == 0x20 || c == 0x85 || c == 0xa0) return true;
  if (c < 0x1680) return false;
  const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool is_letter(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  if (c == 0x200c || c == 0x200d) return true;
  const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  switch (cat) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

std::string normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (char ch : s) {
    if (static_cast<unsigned char>(ch) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii || s.empty()) return std::string(s);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  // The input was validated as UTF-8 before it reached a normalizer, so utf8proc cannot fail on it.
  TZ_ASSERT(n >= 0, "utf8proc_map failed on validated UTF-8");
  std::string result(reinterpret_cast<const char*>(out), static_cast<std::size_t>(n));
  std::free(out);
  return result;
}

namespace {

// Oniguruma's `\s` (and Rust's) is Unicode White_Space; PCRE2's UCP `\s` leaves out U+0085. The
// class below is White_Space exactly (Z is Zs, Zl and Zp).
constexpr std::string_view kSpaceClassBody = "\\t-\\r\\x{85}\\p{Z}";

std::string rewrite_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') {
        if (in_class) {
          out += kSpaceClassBody;
        } else {
          out += "[";
          out += kSpaceClassBody;
          out += "]";
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kSpaceClassBody;
        out += "]";
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out.push_back(c);
      // A ']' or '^]' right after the opening bracket is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out.push_back(c);
  }
  return out;
}

// Per-thread match data (one ovector pair is all find_all reads) and a JIT stack large enough for
// long runs of whitespace under `\s+(?!\S)`.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    TZ_ASSERT(data != nullptr && context != nullptr && stack != nullptr, "PCRE2 allocation failed");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

}  // namespace

Result<Regex> Regex::compile(std::string_view pattern, const std::string& what) {
  const std::string rewritten = rewrite_pattern(pattern);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return Status::invalid_argument(what + ": regex " + std::string(pattern) +
                                    " does not compile (" + reinterpret_cast<const char*>(msg) +
                                    " at offset " + std::to_string(err_offset) + ")");
  }
  // JIT is an optimization: without it (an unsupported CPU) pcre2_match interprets the pattern.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  Regex r;
  r.code_ =
      std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
  return r;
}

void Regex::find_all(std::string_view s,
                     std::vector<std::pair<std::size_t, std::size_t>>& out) const {
  thread_local MatchScratch scratch;
  const auto* code = static_cast<const pcre2_code*>(code_.get());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  std::size_t start = 0;
  while (start <= s.size()) {
    const int rc = pcre2_match(code, subject, s.size(), start, PCRE2_NO_UTF_CHECK, scratch.data,
                               scratch.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    // Other errors (match or JIT stack limits) would silently change the tokens: stop loudly.
    TZ_ASSERT(rc >= 0, "PCRE2 match failed (resource limit) on a tokenizer regex");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
    const std::size_t b = ov[0], e = ov[1];
    out.emplace_back(b, e);
    if (e > b) {
      start = e;
    } else {
      if (e >= s.size()) break;
      start = e + utf8_length(static_cast<unsigned char>(s[e]));
    }
  }
}

namespace {

struct ByteTable {
  std::array<std::string, 256> to_char;
  std::array<int, 512> from_char{};  // code points below 512 cover every mapped character
  ByteTable() {
    from_char.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
      const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(to_char[static_cast<std::size_t>(b)], c);
      from_char[c] = b;
    }
  }
};

const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

}  // namespace

const std::string& byte_to_char(unsigned char b) { return byte_table().to_char[b]; }

int char_to_byte(char32_t c) { return c < 512 ? byte_table().from_char[c] : -1; }

}  // namespace tz::model::text
