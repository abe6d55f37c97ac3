// Loading a tokenizer.json and the encode/decode pipeline around its components (tokenizer.h).
// The added-token split follows HF tokenizers' AddedVocabulary::find_matches; normalization runs
// on each piece between added tokens, as HF's extract_and_normalize does.
#include "model/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

namespace tz::model {

void AddedTokenMatcher::add(std::string pattern, std::size_t token_index) {
  if (pattern.empty()) return;
  auto& bucket = by_first_[static_cast<unsigned char>(pattern[0])];
  bucket.emplace_back(std::move(pattern), token_index);
  ++count_;
}

void AddedTokenMatcher::build() {
  for (auto& bucket : by_first_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
}

std::optional<std::pair<std::size_t, std::size_t>> AddedTokenMatcher::longest_at(
    std::string_view s, std::size_t pos) const {
  const auto& bucket = by_first_[static_cast<unsigned char>(s[pos])];
  const std::string_view rest = s.substr(pos);
  for (const auto& [pattern, index] : bucket) {
    if (rest.size() >= pattern.size() && rest.compare(0, pattern.size(), pattern) == 0) {
      return std::make_pair(pattern.size(), index);
    }
  }
  return std::nullopt;
}

namespace {

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::from_errno(errno, "open tokenizer file", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::from_errno(errno, "read tokenizer file", path);
  return ss.str();
}

// The character before s[pos] (pos > 0, valid UTF-8).
char32_t char_before(std::string_view s, std::size_t pos) {
  std::size_t b = pos - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xc0) == 0x80) --b;
  std::size_t len = 0;
  return text::decode_utf8(s, b, &len);
}

// Start of the whitespace run that ends s[..end] (HF's `\s*$`).
std::size_t trailing_space_start(std::string_view s, std::size_t end) {
  std::size_t pos = end;
  while (pos > 0) {
    std::size_t b = pos - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xc0) == 0x80) --b;
    std::size_t len = 0;
    if (!text::is_whitespace(text::decode_utf8(s, b, &len))) break;
    pos = b;
  }
  return pos;
}

// Length of the whitespace run at s[begin..] (HF's `^\s*`).
std::size_t leading_space_length(std::string_view s, std::size_t begin) {
  std::size_t pos = begin;
  while (pos < s.size()) {
    std::size_t len = 0;
    if (!text::is_whitespace(text::decode_utf8(s, pos, &len))) break;
    pos += len;
  }
  return pos - begin;
}

bool json_bool(const nlohmann::json& j, const char* key, bool fallback) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

}  // namespace

Result<Tokenizer> Tokenizer::load(const std::string& path) {
  Tokenizer t;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::from_errno(errno, "open tokenizer", path);
  t.file_ = S_ISDIR(st.st_mode) ? path + "/tokenizer.json" : path;
  const std::string& file = t.file_;
  TZ_ASSIGN_OR_RETURN(std::string body, read_text_file(file));
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::invalid_argument(file + ": not a JSON object (is it a tokenizer.json?)");
  }
  if (!j.contains("model") || !j["model"].is_object()) {
    return Status::invalid_argument(file + ": no \"model\" object");
  }
  const nlohmann::json& model = j["model"];
  const std::string model_type = model.contains("type") && model["type"].is_string()
                                     ? model["type"].get<std::string>()
                                 : model.contains("merges") ? "BPE"
                                                            : "<no type>";
  if (model_type != "BPE") {
    return Status::invalid_argument(file + ": model \"" + model_type +
                                    "\" is not implemented by tierzero's tokenizer (it reads BPE)");
  }
  TZ_ASSIGN_OR_RETURN(t.model_, BpeModel::from_json(model, file));
  TZ_ASSIGN_OR_RETURN(t.normalizers_,
                      parse_normalizers(j.value("normalizer", nlohmann::json()), file));
  TZ_ASSIGN_OR_RETURN(t.pre_tokenizers_,
                      parse_pre_tokenizers(j.value("pre_tokenizer", nlohmann::json()), file));
  TZ_ASSIGN_OR_RETURN(t.decoders_, parse_decoders(j.value("decoder", nlohmann::json()), file));
  t.vocab_size_ = t.model_.id_bound();
  bool newline_in_added = false;
  std::uint32_t next_id = t.model_.vocab_count();
  for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
    AddedToken tok;
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string()) {
      return Status::invalid_argument(file +
                                      ": an added token without an integer \"id\" and a "
                                      "\"content\" string: " +
                                      a.dump());
    }
    const auto id = a["id"].get<std::int64_t>();
    if (id < 0 || id > 0x7fffffff) {
      return Status::invalid_argument(file + ": added token id " + std::to_string(id) +
                                      " is outside 0..2^31-1");
    }
    tok.id = static_cast<std::uint32_t>(id);
    tok.content = a["content"].get<std::string>();
    tok.single_word = json_bool(a, "single_word", false);
    tok.lstrip = json_bool(a, "lstrip", false);
    tok.rstrip = json_bool(a, "rstrip", false);
    tok.special = json_bool(a, "special", false);
    tok.normalized = json_bool(a, "normalized", !tok.special);
    if (tok.content.empty() || text::invalid_utf8_offset(tok.content) != tok.content.size()) {
      return Status::invalid_argument(file + ": added token " + std::to_string(id) +
                                      " is empty or not UTF-8");
    }
    // HF tokenizers ignores the file's ids: a token the model has keeps the model's id, a token
    // added before keeps its id, any other takes the next id after the model's vocabulary size
    // (its entry count). A file whose ids disagree would encode differently here and there.
    std::uint32_t hf_id = 0;
    if (auto m = t.model_.token_to_id(tok.content)) {
      hf_id = *m;
    } else if (auto it = t.added_by_content_.find(tok.content); it != t.added_by_content_.end()) {
      hf_id = it->second;
    } else {
      hf_id = next_id++;
    }
    if (hf_id != tok.id) {
      return Status::invalid_argument(
          file + ": added token \"" + tok.content + "\" has id " + std::to_string(id) +
          " but HF tokenizers would give it id " + std::to_string(hf_id) +
          " (added tokens not in the model's vocab take the ids after it, in file order)");
    }
    if (t.added_by_content_.count(tok.content) > 0) continue;  // listed twice: HF keeps the first
    if (t.added_index_by_id_.size() <= tok.id) t.added_index_by_id_.resize(tok.id + 1, -1);
    t.added_index_by_id_[tok.id] = static_cast<std::int64_t>(t.added_.size());
    t.vocab_size_ = std::max(t.vocab_size_, tok.id + 1);
    t.has_lstrip_ = t.has_lstrip_ || tok.lstrip;
    newline_in_added = newline_in_added || tok.content.find('\n') != std::string::npos;
    t.added_by_content_[tok.content] = tok.id;
    t.added_.push_back(std::move(tok));
  }
  for (std::size_t i = 0; i < t.added_.size(); ++i) {
    AddedToken& tok = t.added_[i];
    tok.decode_form = tok.content;
    if (tok.normalized) {
      apply_normalizers(t.normalizers_, tok.decode_form, false);
      t.normalized_matcher_.add(tok.decode_form, i);
    } else {
      t.raw_matcher_.add(tok.content, i);
    }
  }
  t.raw_matcher_.build();
  t.normalized_matcher_.build();
  t.cuts_at_newlines_ = !newline_in_added && t.probe_cuts();
  return t;
}

std::optional<std::uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = added_by_content_.find(token);
  if (it != added_by_content_.end()) return it->second;
  return model_.token_to_id(token);
}

const std::string* Tokenizer::id_to_token(std::uint32_t id) const {
  if (id < added_index_by_id_.size() && added_index_by_id_[id] >= 0) {
    return &added_[static_cast<std::size_t>(added_index_by_id_[id])].content;
  }
  return model_.id_to_token(id);
}

void Tokenizer::split_added(std::string_view s, const AddedTokenMatcher& matcher,
                            std::vector<Segment>& out) const {
  out.clear();
  if (s.empty()) return;
  if (matcher.empty()) {
    out.push_back({0, s.size(), std::nullopt});
    return;
  }
  std::size_t start_offset = 0;
  std::size_t pos = 0;
  while (pos < s.size()) {
    const auto m = matcher.longest_at(s, pos);
    if (!m) {
      ++pos;
      continue;
    }
    std::size_t start = pos;
    std::size_t stop = pos + m->first;
    pos = stop;  // the match is consumed even when a flag discards it, as in HF's iterator
    const AddedToken& tok = added_[m->second];
    if (tok.single_word) {
      const bool start_space = start == 0 || !text::is_word_char(char_before(s, start));
      std::size_t len = 0;
      const bool stop_space =
          stop == s.size() || !text::is_word_char(text::decode_utf8(s, stop, &len));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) start = std::max(trailing_space_start(s, start), start_offset);
    if (tok.rstrip) stop += leading_space_length(s, stop);
    if (start_offset < start) out.push_back({start_offset, start, std::nullopt});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({start_offset, s.size(), std::nullopt});
}

Status Tokenizer::encode_valid(std::string_view text, bool continuation, BpeCache* cache,
                               std::vector<std::uint32_t>& out) const {
  std::vector<Segment> raw, normalized;
  std::vector<PreToken> pieces;
  split_added(text, raw_matcher_, raw);
  for (const Segment& seg : raw) {
    if (seg.id) {
      out.push_back(*seg.id);
      continue;
    }
    const bool at_start = seg.begin == 0;
    const bool cont = continuation && at_start;
    std::string s(text.substr(seg.begin, seg.end - seg.begin));
    apply_normalizers(normalizers_, s, cont);
    split_added(s, normalized_matcher_, normalized);
    for (const Segment& n : normalized) {
      if (n.id) {
        out.push_back(*n.id);
        continue;
      }
      pieces.clear();
      PreToken p;
      p.text = s.substr(n.begin, n.end - n.begin);
      p.text_start = at_start && !continuation && n.begin == 0;
      p.continuation = cont && n.begin == 0;
      pieces.push_back(std::move(p));
      apply_pre_tokenizers(pre_tokenizers_, pieces);
      for (const PreToken& piece : pieces) {
        const Status st = model_.tokenize(piece.text, out, cache);
        if (!st.is_ok()) return Status::invalid_argument(file_ + ": " + st.message());
      }
    }
  }
  return Status::ok();
}

Result<std::vector<std::uint32_t>> Tokenizer::encode(std::string_view text, bool continuation,
                                                     BpeCache* cache, const std::string& source,
                                                     std::uint64_t offset_base) const {
  const std::size_t bad = text::invalid_utf8_offset(text);
  if (bad != text.size()) {
    return Status::invalid_argument(source + ": invalid UTF-8 at byte offset " +
                                    std::to_string(offset_base + bad) +
                                    " (tokenizers read UTF-8 text)");
  }
  std::vector<std::uint32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  TZ_RETURN_IF_ERROR(encode_valid(text, continuation, cache, ids));
  return ids;
}

Result<std::string> Tokenizer::decode(std::span<const std::uint32_t> ids,
                                      bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::uint32_t id = ids[i];
    if (id < added_index_by_id_.size() && added_index_by_id_[id] >= 0) {
      const AddedToken& a = added_[static_cast<std::size_t>(added_index_by_id_[id])];
      if (!(skip_special_tokens && a.special)) tokens.push_back(a.decode_form);
      continue;
    }
    const std::string* t = model_.id_to_token(id);
    if (t == nullptr) {
      return Status::invalid_argument(file_ + ": token id " + std::to_string(id) + " at position " +
                                      std::to_string(i) + " is not in the vocabulary");
    }
    if (skip_special_tokens && added_by_content_.count(*t) > 0) {
      const auto idx = added_index_by_id_[added_by_content_.find(*t)->second];
      if (added_[static_cast<std::size_t>(idx)].special) continue;
    }
    tokens.push_back(*t);
  }
  return apply_decoders(decoders_, std::move(tokens));
}

bool Tokenizer::is_safe_cut(std::string_view text, std::size_t pos) const {
  return cuts_at_newlines_ && cut_candidate(text, pos);
}

bool Tokenizer::cut_candidate(std::string_view text, std::size_t pos) const {
  if (pos < 2 || pos >= text.size() || text[pos - 1] != '\n') return false;
  // Whitespace before the newline could join it in one pre-token when the text ends there (GPT-2's
  // `\s+(?!\S)` takes " \n" or "\r\n" whole at the end of a text, but not before a letter).
  if (text::is_whitespace(char_before(text, pos - 1))) return false;
  const auto c = static_cast<unsigned char>(text[pos]);
  if (c < 0x80) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  } else {
    if (text::invalid_utf8_offset(text.substr(pos, text::utf8_length(c))) != text::utf8_length(c)) {
      return false;
    }
    std::size_t len = 0;
    if (!text::is_letter(text::decode_utf8(text, pos, &len))) return false;
  }
  if (has_lstrip_) {
    for (const AddedTokenMatcher* m : {&raw_matcher_, &normalized_matcher_}) {
      const auto hit = m->longest_at(text, pos);
      if (hit && added_[hit->second].lstrip) return false;
    }
  }
  return true;
}

bool Tokenizer::probe_cuts() const {
  // The newline cannot join its neighbours when a pre-tokenizer splits the text by a pattern, or
  // when the model's token for a lone "\n" is part of no merge.
  bool splits = false;
  for (const PreTokenizer& p : pre_tokenizers_) {
    splits = splits || (p.kind == PreTokenizer::Kind::kByteLevel && p.use_regex) ||
             p.kind == PreTokenizer::Kind::kSplit;
  }
  std::vector<std::uint32_t> newline;
  if (!encode_valid("\n", true, nullptr, newline).is_ok()) return false;
  const bool barrier = newline.size() == 1 && !model_.in_any_merge(newline[0]);
  if (!splits && !barrier) return false;
  static const char* const kProbes[] = {"a\nb",   "Hello world.\nThe end\n",
                                        "x \nY",  "a\n\nb",
                                        "a\r\nb", "ab  \n\tc\nd",
                                        ".\nb",   "'\ns",
                                        "12\n34", "\xc3\xa9\nb\n",
                                        "\n\nb",  "a\n\xc3\xa9t\xc3\xa9",
                                        " \nA",   "end.  \nNow"};
  for (const char* probe : kProbes) {
    const std::string_view s(probe);
    std::vector<std::uint32_t> whole;
    if (!encode_valid(s, false, nullptr, whole).is_ok()) return false;
    for (std::size_t cut = 1; cut < s.size(); ++cut) {
      if (!cut_candidate(s, cut)) continue;
      std::vector<std::uint32_t> parts;
      if (!encode_valid(s.substr(0, cut), false, nullptr, parts).is_ok()) return false;
      if (!encode_valid(s.substr(cut), true, nullptr, parts).is_ok()) return false;
      if (parts != whole) return false;
    }
  }
  return true;
}

}  // namespace tz::model
