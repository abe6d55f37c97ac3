// The BPE model (tokenizer_bpe.h). The merge loop follows HF tokenizers' Word::merge_all: a heap of
// (rank, position) candidates, popped lowest rank first and leftmost among equal ranks, a candidate
// skipped when its symbols changed since it was pushed.
#include "model/tokenizer_bpe.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "model/tokenizer_text.h"

namespace tz::model {

const std::vector<std::uint32_t>* BpeCache::find(std::string_view word) const {
  auto it = map_.find(word);
  return it == map_.end() ? nullptr : &it->second;
}

void BpeCache::insert(std::string_view word, const std::vector<std::uint32_t>& ids) {
  if (map_.size() >= capacity_) map_.clear();
  map_.emplace(std::string(word), ids);
}

namespace {

Result<std::pair<std::string, std::string>> parse_merge(const nlohmann::json& m,
                                                        const std::string& file, std::size_t i) {
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const std::size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      return Status::invalid_argument(file + ": merge " + std::to_string(i) + " \"" + s +
                                      "\" is not two tokens separated by one space");
    }
    return std::make_pair(s.substr(0, space), s.substr(space + 1));
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return Status::invalid_argument(file + ": merge " + std::to_string(i) +
                                  " is neither \"a b\" nor [\"a\", \"b\"]");
}

std::string optional_string(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return {};
  return j[key].get<std::string>();
}

}  // namespace

Result<BpeModel> BpeModel::from_json(const nlohmann::json& model, const std::string& file) {
  BpeModel m;
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      model["dropout"].get<double>() != 0.0) {
    return Status::invalid_argument(file + ": BPE dropout " + model["dropout"].dump() +
                                    " is random per call; tierzero encodes deterministically "
                                    "(set \"dropout\": null)");
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return Status::invalid_argument(file + ": BPE model has no \"vocab\" object");
  }
  std::uint32_t bound = 0;
  for (const auto& [token, id_json] : model["vocab"].items()) {
    if (!id_json.is_number_unsigned() && !id_json.is_number_integer()) {
      return Status::invalid_argument(file + ": vocab entry \"" + token + "\" has no integer id");
    }
    const auto id = id_json.get<std::int64_t>();
    if (id < 0 || id > 0x7fffffff) {
      return Status::invalid_argument(file + ": vocab entry \"" + token + "\" has id " +
                                      std::to_string(id) + " outside 0..2^31-1");
    }
    m.vocab_[token] = static_cast<std::uint32_t>(id);
    bound = std::max(bound, static_cast<std::uint32_t>(id) + 1);
  }
  m.id_to_token_.resize(bound);
  m.has_id_.assign(bound, false);
  for (const auto& [token, id] : m.vocab_) {
    m.id_to_token_[id] = token;
    m.has_id_[id] = true;
  }
  m.continuing_subword_prefix_ = optional_string(model, "continuing_subword_prefix");
  m.end_of_word_suffix_ = optional_string(model, "end_of_word_suffix");
  m.fuse_unk_ = model.value("fuse_unk", false);
  m.byte_fallback_ = model.value("byte_fallback", false);
  m.ignore_merges_ = model.value("ignore_merges", false);
  const std::string unk = optional_string(model, "unk_token");
  if (!unk.empty()) {
    auto it = m.vocab_.find(unk);
    if (it == m.vocab_.end()) {
      return Status::invalid_argument(file + ": unk_token \"" + unk + "\" is not in the vocab");
    }
    m.unk_id_ = it->second;
  }
  if (m.byte_fallback_) {
    m.has_byte_ids_ = true;
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = m.vocab_.find(std::string_view(name));
      if (it == m.vocab_.end()) {
        m.has_byte_ids_ = false;
        break;
      }
      m.byte_ids_[b] = it->second;
    }
  }
  m.in_merge_.assign(bound, false);
  if (model.contains("merges")) {
    const auto& merges = model["merges"];
    if (!merges.is_array()) return Status::invalid_argument(file + ": \"merges\" is not a list");
    const std::size_t prefix_len = m.continuing_subword_prefix_.size();
    for (std::size_t i = 0; i < merges.size(); ++i) {
      TZ_ASSIGN_OR_RETURN(auto parts, parse_merge(merges[i], file, i));
      auto a = m.vocab_.find(parts.first);
      auto b = m.vocab_.find(parts.second);
      if (a == m.vocab_.end() || b == m.vocab_.end()) {
        return Status::invalid_argument(file + ": merge " + std::to_string(i) + " (\"" +
                                        parts.first + "\", \"" + parts.second +
                                        "\") names a token that is not in the vocab");
      }
      std::string merged = parts.first;
      std::string_view right = parts.second;
      if (prefix_len > 0 && right.substr(0, prefix_len) == m.continuing_subword_prefix_) {
        right.remove_prefix(prefix_len);
      }
      merged += right;
      auto r = m.vocab_.find(merged);
      if (r == m.vocab_.end()) {
        return Status::invalid_argument(file + ": merge " + std::to_string(i) + " gives \"" +
                                        merged + "\", which is not in the vocab");
      }
      const std::uint64_t key = (std::uint64_t{a->second} << 32) | b->second;
      // A pair listed twice keeps its last rank, as HF's map built from the list does.
      m.merges_.insert_or_assign(key, std::make_pair(static_cast<std::uint32_t>(i), r->second));
      m.in_merge_[a->second] = true;
      m.in_merge_[b->second] = true;
    }
  }
  return m;
}

std::optional<std::uint32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(std::uint32_t id) const {
  if (id >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

bool BpeModel::in_any_merge(std::uint32_t id) const {
  return id < in_merge_.size() && in_merge_[id];
}

Status BpeModel::symbols_of(std::string_view word, std::vector<std::uint32_t>& ids,
                            std::vector<std::uint32_t>& lens) const {
  std::optional<std::pair<std::uint32_t, std::uint32_t>> unk;  // (id, byte length)
  std::string scratch;
  std::size_t i = 0;
  while (i < word.size()) {
    const std::size_t len = text::utf8_length(static_cast<unsigned char>(word[i]));
    const bool first = i == 0;
    const bool last = i + len >= word.size();
    std::string_view s = word.substr(i, len);
    if ((!first && !continuing_subword_prefix_.empty()) || (last && !end_of_word_suffix_.empty())) {
      scratch.clear();
      if (!first) scratch += continuing_subword_prefix_;
      scratch += s;
      if (last) scratch += end_of_word_suffix_;
      s = scratch;
    }
    i += len;
    auto it = vocab_.find(s);
    if (it != vocab_.end()) {
      if (unk) {
        ids.push_back(unk->first);
        lens.push_back(unk->second);
        unk.reset();
      }
      ids.push_back(it->second);
      lens.push_back(static_cast<std::uint32_t>(len));
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      std::vector<std::uint32_t> bytes;
      for (char c : s) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(c));
        auto b = has_byte_ids_ ? vocab_.end() : vocab_.find(std::string_view(name));
        if (has_byte_ids_) {
          bytes.push_back(byte_ids_[static_cast<unsigned char>(c)]);
        } else if (b != vocab_.end()) {
          bytes.push_back(b->second);
        } else {
          all = false;
          break;
        }
      }
      if (all) {
        // HF adds the byte tokens without first emitting a pending unk (it keeps it for later).
        for (std::uint32_t b : bytes) {
          ids.push_back(b);
          lens.push_back(1);
        }
        continue;
      }
    }
    if (!unk_id_) {
      return Status::invalid_argument("the character \"" + std::string(word.substr(i - len, len)) +
                                      "\" is not in the vocabulary and the tokenizer has no "
                                      "unk_token or byte_fallback");
    }
    if (unk && fuse_unk_) {
      unk->second += static_cast<std::uint32_t>(len);
    } else {
      if (unk) {
        ids.push_back(unk->first);
        lens.push_back(unk->second);
      }
      unk = std::make_pair(*unk_id_, static_cast<std::uint32_t>(len));
    }
  }
  if (unk) {
    ids.push_back(unk->first);
    lens.push_back(unk->second);
  }
  return Status::ok();
}

namespace {

struct Symbol {
  std::uint32_t id;
  std::int32_t prev;
  std::int32_t next;
  std::uint32_t len;  // 0 once merged into its left neighbour
};

struct Candidate {
  std::uint32_t rank;
  std::uint32_t pos;
  std::uint32_t new_id;
  // std::priority_queue pops the largest: invert so the lowest rank, then position, comes first.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void BpeModel::merge_word(std::string_view word, std::vector<std::uint32_t>& out) const {
  (void)word;
  // `out` holds the symbol ids on entry (symbols_of) and the merged ids on exit.
  const std::size_t n = out.size();
  if (n < 2 || merges_.empty()) return;
  std::vector<Symbol> sym(n);
  for (std::size_t i = 0; i < n; ++i) {
    sym[i] = Symbol{out[i], static_cast<std::int32_t>(i) - 1,
                    i + 1 < n ? static_cast<std::int32_t>(i + 1) : -1, 1};
  }
  std::vector<Candidate> heap_storage;
  heap_storage.reserve(n);
  std::priority_queue<Candidate> queue(std::less<Candidate>(), std::move(heap_storage));
  auto push_pair = [&](std::size_t pos) {
    const std::int32_t next = sym[pos].next;
    if (next < 0) return;
    auto it =
        merges_.find((std::uint64_t{sym[pos].id} << 32) | sym[static_cast<std::size_t>(next)].id);
    if (it != merges_.end()) {
      queue.push(Candidate{it->second.first, static_cast<std::uint32_t>(pos), it->second.second});
    }
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    const auto right_pos = static_cast<std::size_t>(left.next);
    Symbol& right = sym[right_pos];
    auto it = merges_.find((std::uint64_t{left.id} << 32) | right.id);
    if (it == merges_.end() || it->second.second != top.new_id) continue;
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    right.len = 0;
    if (right.next >= 0)
      sym[static_cast<std::size_t>(right.next)].prev = static_cast<std::int32_t>(top.pos);
    if (left.prev >= 0) push_pair(static_cast<std::size_t>(left.prev));
    push_pair(top.pos);
  }
  out.clear();
  for (std::size_t i = 0; i < n; ++i) {
    if (sym[i].len > 0) out.push_back(sym[i].id);
  }
}

Status BpeModel::tokenize(std::string_view word, std::vector<std::uint32_t>& out,
                          BpeCache* cache) const {
  if (word.empty()) return Status::ok();
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return Status::ok();
    }
  }
  if (cache != nullptr) {
    if (const auto* hit = cache->find(word)) {
      out.insert(out.end(), hit->begin(), hit->end());
      return Status::ok();
    }
  }
  std::vector<std::uint32_t> ids, lens;
  ids.reserve(word.size());
  lens.reserve(word.size());
  TZ_RETURN_IF_ERROR(symbols_of(word, ids, lens));
  // A long word (a whole line or text when there is no pre-tokenizer, as SentencePiece-style
  // files have) is merged piece by piece between symbols that are part of no merge: no merge can
  // cross such a symbol, and merges on either side never meet, so the result is the one of the
  // whole word, with smaller heaps and cacheable pieces. Without a prefix or suffix a piece's
  // symbols depend on its bytes alone, so its bytes key the cache.
  // (HF can emit an unk after byte-fallback tokens that follow it, out of byte order: a word with
  // an unk goes whole.)
  if (ids.size() > 64 && continuing_subword_prefix_.empty() && end_of_word_suffix_.empty() &&
      !(unk_id_ && std::find(ids.begin(), ids.end(), *unk_id_) != ids.end())) {
    std::vector<std::uint32_t> piece;
    std::size_t piece_begin = 0, piece_byte = 0, byte = 0;
    auto flush = [&](std::size_t end, std::size_t end_byte) {
      if (end == piece_begin) return;
      const std::string_view key = word.substr(piece_byte, end_byte - piece_byte);
      if (cache != nullptr) {
        if (const auto* hit = cache->find(key)) {
          out.insert(out.end(), hit->begin(), hit->end());
          return;
        }
      }
      piece.assign(ids.begin() + static_cast<std::ptrdiff_t>(piece_begin),
                   ids.begin() + static_cast<std::ptrdiff_t>(end));
      merge_word(key, piece);
      if (cache != nullptr && key.size() < 256) cache->insert(key, piece);
      out.insert(out.end(), piece.begin(), piece.end());
    };
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (!in_any_merge(ids[i])) {
        flush(i, byte);
        out.push_back(ids[i]);
        piece_begin = i + 1;
        piece_byte = byte + lens[i];
      }
      byte += lens[i];
    }
    flush(ids.size(), byte);
    return Status::ok();
  }
  merge_word(word, ids);
  if (cache != nullptr && word.size() < 256) cache->insert(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  return Status::ok();
}

}  // namespace tz::model
