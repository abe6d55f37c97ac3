// Normalizers, pre-tokenizers and decoders of a tokenizer.json (tokenizer_pipeline.h), with the
// semantics of the HF tokenizers components of the same names.
#include "model/tokenizer_pipeline.h"

#include <algorithm>
#include <utility>

namespace tz::model {
namespace {

// GPT-2's pre-tokenization regex, which the ByteLevel pre-tokenizer uses when use_regex is true.
constexpr std::string_view kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status unsupported(const std::string& file, const std::string& what, const std::string& type) {
  return Status::invalid_argument(file + ": " + what + " \"" + type +
                                  "\" is not implemented by tierzero's tokenizer");
}

std::string type_of(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "<no type>";
  return j["type"].get<std::string>();
}

// Reads {"String": s} or {"Regex": r}.
Status parse_pattern(const nlohmann::json& j, const std::string& file, const std::string& what,
                     std::string* literal, std::optional<text::Regex>* regex) {
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    *literal = j["String"].get<std::string>();
    return Status::ok();
  }
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    TZ_ASSIGN_OR_RETURN(text::Regex r,
                        text::Regex::compile(j["Regex"].get<std::string>(), file + ": " + what));
    *regex = std::move(r);
    return Status::ok();
  }
  return Status::invalid_argument(file + ": " + what +
                                  " pattern is neither {\"String\": ...} nor "
                                  "{\"Regex\": ...}");
}

using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;

// Non-overlapping occurrences of a literal (an empty literal matches nothing).
void find_literal(std::string_view s, std::string_view lit, Ranges& out) {
  if (lit.empty()) return;
  std::size_t pos = 0;
  while ((pos = s.find(lit, pos)) != std::string_view::npos) {
    out.emplace_back(pos, pos + lit.size());
    pos += lit.size();
  }
}

std::string replace_all(std::string_view s, const Ranges& matches, std::string_view content) {
  std::string out;
  out.reserve(s.size());
  std::size_t prev = 0;
  for (const auto& [b, e] : matches) {
    out.append(s.substr(prev, b - prev));
    out.append(content);
    prev = e;
  }
  out.append(s.substr(prev));
  return out;
}

// HF's NormalizedString::split: the matches of a pattern, the pieces between them, combined as
// `behavior` says; empty pieces are dropped by the caller.
void split_by(const PreToken& piece, const Ranges& matches, SplitBehavior behavior, bool invert,
              std::vector<PreToken>& out) {
  const std::string& s = piece.text;
  struct Part {
    std::size_t b, e;
    bool is_match;
  };
  std::vector<Part> parts;
  parts.reserve(2 * matches.size() + 1);
  std::size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev != b) parts.push_back({prev, b, false});
    parts.push_back({b, e, true});
    prev = e;
  }
  if (prev != s.size()) parts.push_back({prev, s.size(), false});
  if (invert) {
    for (Part& p : parts) p.is_match = !p.is_match;
  }
  std::vector<Part> kept;  // is_match now means "remove"
  kept.reserve(parts.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) kept.push_back({p.b, p.e, false});
      break;
    case SplitBehavior::kRemoved:
      kept = parts;
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !kept.empty()) {
          kept.back().e = p.e;
        } else {
          kept.push_back({p.b, p.e, false});
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) {
          kept.back().b = it->b;
        } else {
          kept.push_back({it->b, it->e, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !kept.empty()) {
          kept.back().e = p.e;
        } else {
          kept.push_back({p.b, p.e, false});
        }
        previous_match = p.is_match;
      }
      break;
    }
  }
  for (const Part& p : kept) {
    if (p.is_match || p.b == p.e) continue;
    PreToken t;
    t.text = s.substr(p.b, p.e - p.b);
    t.text_start = piece.text_start && p.b == 0;
    t.continuation = piece.continuation && p.b == 0;
    out.push_back(std::move(t));
  }
}

Result<SplitBehavior> parse_behavior(const nlohmann::json& j, const std::string& file) {
  const std::string b = j.is_string() ? j.get<std::string>() : std::string("<missing>");
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return Status::invalid_argument(file + ": Split behavior \"" + b +
                                  "\" is not one of Removed, "
                                  "Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

// Metaspace's prepend scheme, from "prepend_scheme" or the older "add_prefix_space".
Result<PreTokenizer::Prepend> parse_prepend(const nlohmann::json& j, const std::string& file) {
  if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
    const std::string s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return PreTokenizer::Prepend::kAlways;
    if (s == "first") return PreTokenizer::Prepend::kFirst;
    if (s == "never") return PreTokenizer::Prepend::kNever;
    return Status::invalid_argument(file + ": Metaspace prepend_scheme \"" + s +
                                    "\" is not always, first or never");
  }
  return j.value("add_prefix_space", true) ? PreTokenizer::Prepend::kAlways
                                           : PreTokenizer::Prepend::kNever;
}

Result<std::string> parse_replacement(const nlohmann::json& j, const std::string& file) {
  const std::string r = j.value("replacement", std::string("\xe2\x96\x81"));
  std::size_t len = 0;
  if (r.empty() || text::invalid_utf8_offset(r) != r.size() ||
      (text::decode_utf8(r, 0, &len), len != r.size())) {
    return Status::invalid_argument(file + ": Metaspace replacement \"" + r +
                                    "\" is not one character");
  }
  return r;
}

Status parse_normalizer_into(const nlohmann::json& j, const std::string& file,
                             std::vector<Normalizer>& out) {
  const std::string type = type_of(j);
  Normalizer n;
  if (type == "Sequence") {
    for (const auto& child : j.value("normalizers", nlohmann::json::array())) {
      TZ_RETURN_IF_ERROR(parse_normalizer_into(child, file, out));
    }
    return Status::ok();
  }
  if (type == "NFC" || type == "NFKC" || type == "NFD" || type == "NFKD") {
    n.kind = Normalizer::Kind::kUnicode;
    n.form = type == "NFC"    ? text::NormalForm::kNfc
             : type == "NFKC" ? text::NormalForm::kNfkc
             : type == "NFD"  ? text::NormalForm::kNfd
                              : text::NormalForm::kNfkd;
  } else if (type == "Prepend") {
    n.kind = Normalizer::Kind::kPrepend;
    n.prepend = j.value("prepend", std::string());
  } else if (type == "Replace") {
    n.kind = Normalizer::Kind::kReplace;
    TZ_RETURN_IF_ERROR(parse_pattern(j.value("pattern", nlohmann::json()), file,
                                     "Replace normalizer", &n.pattern, &n.regex));
    n.content = j.value("content", std::string());
  } else {
    return unsupported(file, "normalizer", type);
  }
  out.push_back(std::move(n));
  return Status::ok();
}

Status parse_pre_tokenizer_into(const nlohmann::json& j, const std::string& file,
                                std::vector<PreTokenizer>& out) {
  const std::string type = type_of(j);
  PreTokenizer p;
  if (type == "Sequence") {
    for (const auto& child : j.value("pretokenizers", nlohmann::json::array())) {
      TZ_RETURN_IF_ERROR(parse_pre_tokenizer_into(child, file, out));
    }
    return Status::ok();
  }
  if (type == "ByteLevel") {
    p.kind = PreTokenizer::Kind::kByteLevel;
    p.add_prefix_space = j.value("add_prefix_space", true);
    p.use_regex = j.value("use_regex", true);
    if (p.use_regex) {
      TZ_ASSIGN_OR_RETURN(text::Regex r,
                          text::Regex::compile(kByteLevelPattern, file + ": ByteLevel"));
      p.regex = std::move(r);
    }
  } else if (type == "Split") {
    p.kind = PreTokenizer::Kind::kSplit;
    TZ_RETURN_IF_ERROR(parse_pattern(j.value("pattern", nlohmann::json()), file,
                                     "Split pre-tokenizer", &p.literal, &p.regex));
    TZ_ASSIGN_OR_RETURN(p.behavior, parse_behavior(j.value("behavior", nlohmann::json()), file));
    p.invert = j.value("invert", false);
  } else if (type == "Metaspace") {
    p.kind = PreTokenizer::Kind::kMetaspace;
    TZ_ASSIGN_OR_RETURN(p.replacement, parse_replacement(j, file));
    TZ_ASSIGN_OR_RETURN(p.prepend, parse_prepend(j, file));
    p.split = j.value("split", true);
  } else if (type == "Digits") {
    p.kind = PreTokenizer::Kind::kDigits;
    p.individual_digits = j.value("individual_digits", false);
  } else {
    return unsupported(file, "pre-tokenizer", type);
  }
  out.push_back(std::move(p));
  return Status::ok();
}

Status parse_decoder_into(const nlohmann::json& j, const std::string& file,
                          std::vector<Decoder>& out) {
  const std::string type = type_of(j);
  Decoder d;
  if (type == "Sequence") {
    for (const auto& child : j.value("decoders", nlohmann::json::array())) {
      TZ_RETURN_IF_ERROR(parse_decoder_into(child, file, out));
    }
    return Status::ok();
  }
  if (type == "ByteLevel") {
    d.kind = Decoder::Kind::kByteLevel;
  } else if (type == "Metaspace") {
    d.kind = Decoder::Kind::kMetaspace;
    TZ_ASSIGN_OR_RETURN(d.replacement, parse_replacement(j, file));
    TZ_ASSIGN_OR_RETURN(PreTokenizer::Prepend scheme, parse_prepend(j, file));
    d.prepend_never = scheme == PreTokenizer::Prepend::kNever;
  } else if (type == "Replace") {
    d.kind = Decoder::Kind::kReplace;
    TZ_RETURN_IF_ERROR(parse_pattern(j.value("pattern", nlohmann::json()), file, "Replace decoder",
                                     &d.pattern, &d.regex));
    d.content = j.value("content", std::string());
  } else if (type == "ByteFallback") {
    d.kind = Decoder::Kind::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = Decoder::Kind::kFuse;
  } else if (type == "Strip") {
    d.kind = Decoder::Kind::kStrip;
    d.strip = j.value("content", std::string(" "));
    d.strip_start = j.value("start", 0);
    d.strip_stop = j.value("stop", 0);
  } else {
    return unsupported(file, "decoder", type);
  }
  out.push_back(std::move(d));
  return Status::ok();
}

void pre_tokenize_one(const PreTokenizer& p, std::vector<PreToken>& pieces) {
  std::vector<PreToken> out;
  out.reserve(pieces.size());
  Ranges matches;
  for (PreToken& piece : pieces) {
    matches.clear();
    switch (p.kind) {
      case PreTokenizer::Kind::kByteLevel: {
        if (p.add_prefix_space && !piece.continuation && !piece.text.empty() &&
            piece.text[0] != ' ') {
          piece.text.insert(piece.text.begin(), ' ');
        }
        const std::size_t first = out.size();
        if (p.use_regex) {
          p.regex->find_all(piece.text, matches);
          split_by(piece, matches, SplitBehavior::kIsolated, false, out);
        } else if (!piece.text.empty()) {
          out.push_back(std::move(piece));
        }
        for (std::size_t i = first; i < out.size(); ++i) {
          std::string mapped;
          mapped.reserve(out[i].text.size() * 2);
          for (char c : out[i].text) mapped += text::byte_to_char(static_cast<unsigned char>(c));
          out[i].text = std::move(mapped);
        }
        break;
      }
      case PreTokenizer::Kind::kSplit:
        if (p.regex) {
          p.regex->find_all(piece.text, matches);
        } else {
          find_literal(piece.text, p.literal, matches);
        }
        split_by(piece, matches, p.behavior, p.invert, out);
        break;
      case PreTokenizer::Kind::kMetaspace: {
        std::string s;
        s.reserve(piece.text.size() + p.replacement.size());
        for (char c : piece.text) {
          if (c == ' ') {
            s += p.replacement;
          } else {
            s.push_back(c);
          }
        }
        const bool starts = s.compare(0, p.replacement.size(), p.replacement) == 0;
        const bool prepend = !s.empty() && !starts && !piece.continuation &&
                             (p.prepend == PreTokenizer::Prepend::kAlways ||
                              (p.prepend == PreTokenizer::Prepend::kFirst && piece.text_start));
        if (prepend) s.insert(0, p.replacement);
        piece.text = std::move(s);
        if (p.split) {
          find_literal(piece.text, p.replacement, matches);
          split_by(piece, matches, SplitBehavior::kMergedWithNext, false, out);
        } else if (!piece.text.empty()) {
          out.push_back(std::move(piece));
        }
        break;
      }
      case PreTokenizer::Kind::kDigits: {
        std::size_t i = 0;
        while (i < piece.text.size()) {
          std::size_t len = 0;
          const char32_t c = text::decode_utf8(piece.text, i, &len);
          if (text::is_numeric(c)) matches.emplace_back(i, i + len);
          i += len;
        }
        split_by(piece, matches,
                 p.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false,
                 out);
        break;
      }
    }
  }
  pieces = std::move(out);
}

// Strips up to `count` copies of `c` from the start (or end) of `s`.
void strip_chars(std::string& s, const std::string& c, int start, int stop) {
  if (c.empty()) return;
  for (int i = 0; i < start && s.compare(0, c.size(), c) == 0; ++i) s.erase(0, c.size());
  for (int i = 0;
       i < stop && s.size() >= c.size() && s.compare(s.size() - c.size(), c.size(), c) == 0; ++i) {
    s.erase(s.size() - c.size());
  }
}

int parse_byte_token(const std::string& t) {
  // "<0xAB>": HF's u8::from_str_radix on the two characters after "<0x".
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = t[static_cast<std::size_t>(i)];
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

void decode_one(const Decoder& d, std::vector<std::string>& tokens) {
  switch (d.kind) {
    case Decoder::Kind::kByteLevel: {
      std::string bytes;
      for (const std::string& t : tokens) {
        const std::size_t mark = bytes.size();
        bool all = true;
        std::size_t i = 0;
        while (i < t.size()) {
          std::size_t len = 0;
          const int b = text::char_to_byte(text::decode_utf8(t, i, &len));
          if (b < 0) {
            all = false;
            break;
          }
          bytes.push_back(static_cast<char>(b));
          i += len;
        }
        if (!all) {
          bytes.resize(mark);
          bytes += t;
        }
      }
      tokens.assign(1, text::utf8_lossy(bytes));
      break;
    }
    case Decoder::Kind::kMetaspace:
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        std::string out;
        const std::string& t = tokens[i];
        std::size_t pos = 0;
        while (pos < t.size()) {
          if (t.compare(pos, d.replacement.size(), d.replacement) == 0) {
            if (i != 0 || d.prepend_never) out.push_back(' ');
            pos += d.replacement.size();
          } else {
            out.push_back(t[pos++]);
          }
        }
        tokens[i] = std::move(out);
      }
      break;
    case Decoder::Kind::kReplace:
      for (std::string& t : tokens) {
        Ranges m;
        if (d.regex) {
          d.regex->find_all(t, m);
        } else {
          find_literal(t, d.pattern, m);
        }
        if (!m.empty()) t = replace_all(t, m, d.content);
      }
      break;
    case Decoder::Kind::kByteFallback: {
      std::vector<std::string> out;
      std::string pending;
      auto flush = [&] {
        if (pending.empty()) return;
        if (text::invalid_utf8_offset(pending) == pending.size()) {
          out.push_back(pending);
        } else {
          for (std::size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xef\xbf\xbd");
        }
        pending.clear();
      };
      for (std::string& t : tokens) {
        const int b = parse_byte_token(t);
        if (b >= 0) {
          pending.push_back(static_cast<char>(b));
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      tokens = std::move(out);
      break;
    }
    case Decoder::Kind::kFuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      break;
    }
    case Decoder::Kind::kStrip:
      for (std::string& t : tokens) strip_chars(t, d.strip, d.strip_start, d.strip_stop);
      break;
  }
}

}  // namespace

Result<std::vector<Normalizer>> parse_normalizers(const nlohmann::json& j,
                                                  const std::string& file) {
  std::vector<Normalizer> out;
  if (!j.is_null()) TZ_RETURN_IF_ERROR(parse_normalizer_into(j, file, out));
  return out;
}

void apply_normalizers(const std::vector<Normalizer>& list, std::string& s, bool continuation) {
  for (const Normalizer& n : list) {
    switch (n.kind) {
      case Normalizer::Kind::kUnicode:
        s = text::normalize(s, n.form);
        break;
      case Normalizer::Kind::kPrepend:
        if (!s.empty() && !continuation) s.insert(0, n.prepend);
        break;
      case Normalizer::Kind::kReplace: {
        Ranges m;
        if (n.regex) {
          n.regex->find_all(s, m);
        } else {
          find_literal(s, n.pattern, m);
        }
        if (!m.empty()) s = replace_all(s, m, n.content);
        break;
      }
    }
  }
}

Result<std::vector<PreTokenizer>> parse_pre_tokenizers(const nlohmann::json& j,
                                                       const std::string& file) {
  std::vector<PreTokenizer> out;
  if (!j.is_null()) TZ_RETURN_IF_ERROR(parse_pre_tokenizer_into(j, file, out));
  return out;
}

void apply_pre_tokenizers(const std::vector<PreTokenizer>& list, std::vector<PreToken>& pieces) {
  for (const PreTokenizer& p : list) pre_tokenize_one(p, pieces);
  std::erase_if(pieces, [](const PreToken& t) { return t.text.empty(); });
}

Result<std::vector<Decoder>> parse_decoders(const nlohmann::json& j, const std::string& file) {
  std::vector<Decoder> out;
  if (!j.is_null()) TZ_RETURN_IF_ERROR(parse_decoder_into(j, file, out));
  return out;
}

std::string apply_decoders(const std::vector<Decoder>& list, std::vector<std::string> tokens) {
  std::string out;
  if (list.empty()) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  for (const Decoder& d : list) decode_one(d, tokens);
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace tz::model
