// Tokenizing and detokenizing files, and the byte-level BPE trainer (tokenizer_files.h).
#include "model/tokenizer_files.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/output_file.h"
#include "model/data.h"
#include "model/tokenizer_text.h"

namespace tz::model {
namespace {

int thread_count(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// Reads up to `n` bytes of `f` onto the end of `buf`; returns false at the end of the file.
Result<bool> read_more(std::FILE* f, std::string& buf, std::size_t n, const std::string& path) {
  const std::size_t old = buf.size();
  buf.resize(old + n);
  const std::size_t got = std::fread(buf.data() + old, 1, n, f);
  buf.resize(old + got);
  if (std::ferror(f) != 0) return Status::from_errno(errno, "read text file", path);
  return got == n;
}

// The last safe cut in `text` (0 when there is none).
std::size_t last_safe_cut(const Tokenizer& tok, std::string_view text) {
  std::size_t pos = text.size();
  while (pos > 0) {
    const std::size_t nl = text.rfind('\n', pos - 1);
    if (nl == std::string_view::npos) return 0;
    if (tok.is_safe_cut(text, nl + 1)) return nl + 1;
    pos = nl;
  }
  return 0;
}

// The first safe cut at or after `from` and before `end` (`end` when there is none).
std::size_t next_safe_cut(const Tokenizer& tok, std::string_view text, std::size_t from,
                          std::size_t end) {
  TZ_ASSERT(from > 0, "a cut inside the text");
  std::size_t search = from - 1;  // a newline here gives the cut `from`
  for (;;) {
    const std::size_t nl = text.find('\n', search);
    if (nl == std::string_view::npos || nl + 1 >= end) return end;
    if (tok.is_safe_cut(text, nl + 1)) return nl + 1;
    search = nl + 1;
  }
}

Result<std::string> read_whole_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::from_errno(errno, "open text file", path);
  std::string buf;
  for (;;) {
    auto more = read_more(f, buf, 1 << 20, path);
    if (!more.is_ok()) {
      std::fclose(f);
      return more.status();
    }
    if (!*more) break;
  }
  std::fclose(f);
  return buf;
}

}  // namespace

Result<TokenizeFileStats> tokenize_file(const Tokenizer& tokenizer, const std::string& text_path,
                                        const std::string& out_path,
                                        const TokenizeFileOptions& options) {
  TokenizeFileStats stats;
  stats.version = token_file_version_for(tokenizer.vocab_size());
  stats.parallel = tokenizer.cuts_at_newlines();
  const int threads = thread_count(options.threads);
  std::FILE* f = std::fopen(text_path.c_str(), "rb");
  if (f == nullptr) return Status::from_errno(errno, "open text file", text_path);
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  TZ_ASSIGN_OR_RETURN(TokenFileWriter writer,
                      TokenFileWriter::create(out_path, stats.version, {text_path}));
  std::vector<BpeCache> caches(static_cast<std::size_t>(threads));
  std::string buf;
  std::uint64_t buf_offset = 0;  // offset in the file of buf[0]
  bool eof = false;
  const std::size_t block = std::max<std::size_t>(options.block_bytes, 4096);
  while (!(eof && buf.empty())) {
    if (!eof) {
      TZ_ASSIGN_OR_RETURN(const bool more, read_more(f, buf, block, text_path));
      eof = !more;
    }
    std::size_t end = buf.size();
    if (!eof) {
      if (!stats.parallel) continue;  // whole file at once
      end = last_safe_cut(tokenizer, buf);
      if (end == 0) continue;  // no safe cut yet: read on
    }
    // Cut [0, end) into one piece per thread at safe cuts near equal sizes.
    std::vector<std::size_t> cuts{0};
    if (stats.parallel) {
      for (int k = 1; k < threads; ++k) {
        const std::size_t target =
            end / static_cast<std::size_t>(threads) * static_cast<std::size_t>(k);
        const std::size_t c = next_safe_cut(tokenizer, buf, std::max(target, cuts.back() + 1), end);
        if (c >= end) break;
        cuts.push_back(c);
      }
    }
    cuts.push_back(end);
    const std::size_t pieces = cuts.size() - 1;
    std::vector<Result<std::vector<std::uint32_t>>> results(
        pieces, Result<std::vector<std::uint32_t>>(std::vector<std::uint32_t>{}));
    auto encode_piece = [&](std::size_t i) {
      const std::string_view text = std::string_view(buf).substr(cuts[i], cuts[i + 1] - cuts[i]);
      const std::uint64_t at = buf_offset + cuts[i];
      results[i] = tokenizer.encode(text, at > 0, &caches[i], text_path, at);
    };
    if (pieces == 1) {
      encode_piece(0);
    } else {
      std::vector<std::thread> workers;
      workers.reserve(pieces);
      for (std::size_t i = 0; i < pieces; ++i) workers.emplace_back(encode_piece, i);
      for (std::thread& w : workers) w.join();
    }
    for (auto& r : results) {
      if (!r.is_ok()) return r.status();
      TZ_RETURN_IF_ERROR(writer.append(*r));
    }
    if (options.progress != nullptr) options.progress->add(end);
    stats.bytes += end;
    buf.erase(0, end);
    buf_offset += end;
  }
  stats.tokens = writer.count();
  TZ_RETURN_IF_ERROR(writer.finish());
  return stats;
}

Result<std::uint64_t> detokenize_file(const Tokenizer& tokenizer, const std::string& token_path,
                                      const std::string& out_path) {
  TZ_ASSIGN_OR_RETURN(TokenData data, load_tokens(token_path, tokenizer.vocab_size()));
  if (data.byte_level) {
    return Status::invalid_argument(token_path +
                                    ": not an llm.c token file (no magic); "
                                    "detokenize reads what `data tokenize` writes");
  }
  auto text = tokenizer.decode(data.tokens);
  if (!text.is_ok()) return Status::invalid_argument(token_path + ": " + text.status().message());
  TZ_RETURN_IF_ERROR(write_output_file("--out", out_path, *text, {token_path}));
  return static_cast<std::uint64_t>(text->size());
}

namespace {

// The tokenizer.json the trainer writes, without vocab and merges.
nlohmann::ordered_json byte_level_skeleton() {
  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = nlohmann::ordered_json::array();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", false},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  return j;
}

using PairKey = std::uint64_t;
PairKey pair_key(std::uint32_t a, std::uint32_t b) { return (PairKey{a} << 32) | b; }

struct TrainWord {
  std::vector<std::uint32_t> syms;
  std::int64_t count = 0;
};

using WordCounts = std::unordered_map<std::string, std::int64_t>;

// Adds the pre-tokenized words of one file to `counts`: the file cut at newlines into one part
// per thread, pre-tokenized as the written tokenizer will pre-tokenize (ByteLevel: GPT-2's regex,
// then bytes as characters).
Status count_words(const std::string& path, const std::vector<PreTokenizer>& pre, int threads,
                   WordCounts& counts) {
  TZ_ASSIGN_OR_RETURN(std::string text, read_whole_file(path));
  const std::size_t bad = text::invalid_utf8_offset(text);
  if (bad != text.size()) {
    return Status::invalid_argument(path + ": invalid UTF-8 at byte offset " +
                                    std::to_string(bad) + " (tokenizers read UTF-8 text)");
  }
  std::vector<std::size_t> cuts{0};
  for (int k = 1; k < threads; ++k) {
    const std::size_t target =
        text.size() / static_cast<std::size_t>(threads) * static_cast<std::size_t>(k);
    const std::size_t nl = text.find('\n', std::max(target, cuts.back()));
    if (nl == std::string::npos) break;
    cuts.push_back(nl + 1);
  }
  cuts.push_back(text.size());
  std::vector<WordCounts> partial(cuts.size() - 1);
  std::vector<std::thread> workers;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    workers.emplace_back([&, i] {
      std::size_t pos = cuts[i];
      while (pos < cuts[i + 1]) {
        // Lines keep the pre-tokenizer's view local: GPT-2's regex never joins across "\n" + a
        // non-space, and counting line by line bounds the piece list.
        std::size_t nl = text.find('\n', pos);
        if (nl == std::string::npos || nl >= cuts[i + 1]) nl = cuts[i + 1] - 1;
        std::vector<PreToken> pieces{PreToken{text.substr(pos, nl + 1 - pos), pos == 0, pos > 0}};
        apply_pre_tokenizers(pre, pieces);
        for (PreToken& p : pieces) ++partial[i][std::move(p.text)];
        pos = nl + 1;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (auto& m : partial) {
    for (auto& [word, c] : m) counts[word] += c;
  }
  return Status::ok();
}

// The byte-level BPE merge loop over counted words (as HF's BpeTrainer: the most frequent pair
// merges next, the smaller pair key wins a tie; the run is independent of hash order).
class BpeMerger {
 public:
  explicit BpeMerger(WordCounts counts) {
    for (int b = 0; b < 256; ++b) {  // id b is byte b's character; merged tokens follow
      tokens_.push_back(text::byte_to_char(static_cast<unsigned char>(b)));
      token_ids_[tokens_.back()] = static_cast<std::uint32_t>(b);
    }
    const std::map<std::string, std::int64_t> sorted(counts.begin(), counts.end());
    counts.clear();
    words_.reserve(sorted.size());
    for (const auto& [w, c] : sorted) words_.push_back(word_of(w, c));
    for (std::size_t w = 0; w < words_.size(); ++w) {
      const auto& s = words_[w].syms;
      for (std::size_t i = 0; i + 1 < s.size(); ++i) {
        const PairKey k = pair_key(s[i], s[i + 1]);
        pair_counts_[k] += words_[w].count;
        note_word(k, static_cast<std::uint32_t>(w));
      }
    }
    for (const auto& [k, c] : pair_counts_) heap_.emplace(c, k);
    touched_marker_.assign(words_.size(), 0);
  }

  // Merges until `target` tokens exist or no pair is left; false when none is left.
  bool merge_next(std::size_t target) {
    while (tokens_.size() < target && !heap_.empty()) {
      const auto [count, key] = heap_.top();
      heap_.pop();
      auto pc = pair_counts_.find(key);
      const std::int64_t current = pc == pair_counts_.end() ? 0 : pc->second;
      if (current != count) {  // a stale entry: counts changed since it was pushed
        if (current > 0) heap_.emplace(current, key);
        continue;
      }
      if (count <= 0) return false;
      merge(key);
      return true;
    }
    return false;
  }

  const std::vector<std::string>& tokens() const { return tokens_; }
  nlohmann::ordered_json& merges() { return merges_; }

 private:
  using Entry = std::pair<std::int64_t, PairKey>;
  struct Less {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    }
  };

  static TrainWord word_of(const std::string& w, std::int64_t count) {
    TrainWord tw;
    tw.count = count;
    std::size_t i = 0;
    while (i < w.size()) {
      std::size_t len = 0;
      const int b = text::char_to_byte(text::decode_utf8(w, i, &len));
      TZ_ASSERT(b >= 0, "a pre-token holds a character outside the byte alphabet");
      tw.syms.push_back(static_cast<std::uint32_t>(b));
      i += len;
    }
    return tw;
  }

  void note_word(PairKey k, std::uint32_t w) {
    auto& list = where_[k];
    if (list.empty() || list.back() != w) list.push_back(w);
  }

  void merge(PairKey key) {
    const auto a = static_cast<std::uint32_t>(key >> 32);
    const auto b = static_cast<std::uint32_t>(key & 0xffffffffu);
    const std::string merged = tokens_[a] + tokens_[b];
    std::uint32_t id = 0;
    if (auto it = token_ids_.find(merged); it != token_ids_.end()) {
      id = it->second;  // another pair already made this string: the merge maps to its id
    } else {
      id = static_cast<std::uint32_t>(tokens_.size());
      tokens_.push_back(merged);
      token_ids_.emplace(merged, id);
    }
    merges_.push_back(tokens_[a] + " " + tokens_[b]);
    ++merge_no_;
    std::unordered_set<PairKey> grown;
    const std::vector<std::uint32_t> word_list = std::move(where_[key]);
    where_.erase(key);
    for (std::uint32_t w : word_list) {
      if (touched_marker_[w] == merge_no_) continue;
      touched_marker_[w] = merge_no_;
      rewrite_word(w, a, b, id, grown);
    }
    pair_counts_.erase(key);
    for (PairKey k : grown) heap_.emplace(pair_counts_[k], k);
  }

  // Replaces every (a, b) in word w by `id`, moving its pair counts; `grown` collects the pairs
  // that now hold `id`.
  void rewrite_word(std::uint32_t w, std::uint32_t a, std::uint32_t b, std::uint32_t id,
                    std::unordered_set<PairKey>& grown) {
    TrainWord& word = words_[w];
    auto& s = word.syms;
    bool has = false;
    for (std::size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
    if (!has) return;
    for (std::size_t i = 0; i + 1 < s.size(); ++i) {
      pair_counts_[pair_key(s[i], s[i + 1])] -= word.count;
    }
    std::vector<std::uint32_t> next;
    next.reserve(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
        next.push_back(id);
        ++i;
      } else {
        next.push_back(s[i]);
      }
    }
    s = std::move(next);
    for (std::size_t i = 0; i + 1 < s.size(); ++i) {
      const PairKey k = pair_key(s[i], s[i + 1]);
      pair_counts_[k] += word.count;
      if (s[i] == id || s[i + 1] == id) {
        grown.insert(k);
        note_word(k, w);
      }
    }
  }

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, std::uint32_t> token_ids_;
  std::vector<TrainWord> words_;
  std::unordered_map<PairKey, std::int64_t> pair_counts_;
  std::unordered_map<PairKey, std::vector<std::uint32_t>> where_;
  std::priority_queue<Entry, std::vector<Entry>, Less> heap_;  // stale entries re-checked on pop
  std::vector<std::uint32_t> touched_marker_;
  std::uint32_t merge_no_ = 0;
  nlohmann::ordered_json merges_ = nlohmann::ordered_json::array();
};

// The trained tokenizer.json: the skeleton with vocab, merges and <|endoftext|> as the last id.
std::string trained_tokenizer_json(nlohmann::ordered_json j, BpeMerger& merger) {
  const std::vector<std::string>& tokens = merger.tokens();
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  j["added_tokens"].push_back({{"id", tokens.size()},
                               {"content", "<|endoftext|>"},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", false},
                               {"special", true}});
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merger.merges())}};
  return j.dump(1);
}

}  // namespace

Result<std::string> train_byte_level_bpe(const std::vector<std::string>& text_paths,
                                         const TrainTokenizerOptions& options) {
  if (options.vocab < 257 || options.vocab > 0x7fffffff) {
    return Status::invalid_argument("byte-level BPE trainer: vocab " +
                                    std::to_string(options.vocab) +
                                    " must be at least 257 (256 bytes and <|endoftext|>)");
  }
  if (text_paths.empty()) {
    return Status::invalid_argument("byte-level BPE trainer: no text files");
  }
  nlohmann::ordered_json j = byte_level_skeleton();
  TZ_ASSIGN_OR_RETURN(
      std::vector<PreTokenizer> pre,
      parse_pre_tokenizers(nlohmann::json::parse(j["pre_tokenizer"].dump()), "<trainer>"));
  const int threads = thread_count(options.threads);
  WordCounts counts;
  for (const std::string& path : text_paths) {
    TZ_RETURN_IF_ERROR(count_words(path, pre, threads, counts));
  }
  BpeMerger merger(std::move(counts));
  const auto target = static_cast<std::size_t>(options.vocab - 1);  // the last id is <|endoftext|>
  while (merger.merge_next(target)) {
    if (options.progress != nullptr) options.progress->add(1);
  }
  return trained_tokenizer_json(std::move(j), merger);
}

Status write_tokenizer_json(const std::string& dir, const std::string& json) {
  return write_output_file("", dir + "/tokenizer.json", json);
}

}  // namespace tz::model
