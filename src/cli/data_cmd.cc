// `tierzero data ...`: prepare and check training data.
//   tokenize        text -> llm.c token file: bytes (vocab 256), or the ids of a Hugging Face
//                   tokenizer.json (--tokenizer), streamed and encoded on every core;
//   detokenize      token file -> text through a tokenizer.json;
//   train-tokenizer a byte-level BPE tokenizer.json learned from text files;
//   inspect         what a token file or text corpus holds, after the checks train runs.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/output_file.h"
#include "core/progress.h"
#include "model/data.h"
#include "model/tokenizer.h"
#include "model/tokenizer_files.h"

namespace tz::cli {
namespace {

int fail(const char* command, const Status& st) {
  return report_failure(std::string("data ") + command, st);
}

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

int tokenize_bytes(const std::string& text_path, const std::string& out_path) {
  // The output is checked before the text is read: writable, and never the text itself.
  if (Status st = check_output("--out", out_path, {text_path}); !st.is_ok()) {
    return fail("tokenize", st);
  }
  // Loading as text with vocab 256 accepts every byte; a file that is already a token file (it
  // starts with the magic or ends in .bin) is refused rather than tokenized twice.
  auto data = model::load_tokens(text_path, 256);
  if (!data.is_ok()) return fail("tokenize", data.status());
  if (!data->byte_level) {
    report_failure("data tokenize", text_path + " is already a token file");
    return 1;
  }
  const Status st =
      model::write_token_file(out_path, data->tokens, model::kTokenFileVersion, {text_path});
  if (!st.is_ok()) return fail("tokenize", st);
  std::printf("%s: %zu byte tokens (vocab 256) from %s\n", out_path.c_str(), data->tokens.size(),
              text_path.c_str());
  return 0;
}

int tokenize(const std::string& tokenizer_path, const std::string& text_path,
             const std::string& out_path, int threads) {
  if (tokenizer_path.empty()) return tokenize_bytes(text_path, out_path);
  auto tok = model::Tokenizer::load(tokenizer_path);
  if (!tok.is_ok()) return fail("tokenize", tok.status());
  Progress progress("tokenize " + text_path, file_size(text_path), "B");
  model::TokenizeFileOptions opt;
  opt.threads = threads;
  opt.progress = &progress;
  auto stats = model::tokenize_file(*tok, text_path, out_path, opt);
  progress.finish();
  if (!stats.is_ok()) return fail("tokenize", stats.status());
  std::printf("%s: %llu tokens (vocab %u, token file version %d) from %llu bytes of %s%s\n",
              out_path.c_str(), static_cast<unsigned long long>(stats->tokens), tok->vocab_size(),
              stats->version, static_cast<unsigned long long>(stats->bytes), text_path.c_str(),
              stats->parallel ? "" : " (one thread: this tokenizer cannot be cut at newlines)");
  return 0;
}

int detokenize(const std::string& tokenizer_path, const std::string& in_path,
               const std::string& out_path) {
  auto tok = model::Tokenizer::load(tokenizer_path);
  if (!tok.is_ok()) return fail("detokenize", tok.status());
  auto bytes = model::detokenize_file(*tok, in_path, out_path);
  if (!bytes.is_ok()) return fail("detokenize", bytes.status());
  std::printf("%s: %llu bytes of text from %s\n", out_path.c_str(),
              static_cast<unsigned long long>(*bytes), in_path.c_str());
  return 0;
}

int train_tokenizer(const std::vector<std::string>& texts, std::int64_t vocab,
                    const std::string& out_dir, int threads) {
  Progress progress("train-tokenizer",
                    static_cast<std::uint64_t>(std::max<std::int64_t>(vocab - 257, 0)), "merges");
  model::TrainTokenizerOptions opt;
  opt.vocab = vocab;
  opt.threads = threads;
  opt.progress = &progress;
  auto json = model::train_byte_level_bpe(texts, opt);
  progress.finish();
  if (!json.is_ok()) return fail("train-tokenizer", json.status());
  const Status st = model::write_tokenizer_json(out_dir, *json);
  if (!st.is_ok()) return fail("train-tokenizer", st);
  // Read it back as every other command will, so a broken file is caught here.
  auto tok = model::Tokenizer::load(out_dir);
  if (!tok.is_ok()) return fail("train-tokenizer", tok.status());
  std::printf("%s/tokenizer.json: byte-level BPE, %u ids\n", out_dir.c_str(), tok->vocab_size());
  return 0;
}

int inspect(const std::string& path, std::int64_t vocab, bool json) {
  auto data = model::load_tokens(path, vocab);
  if (!data.is_ok()) return fail("inspect", data.status());
  std::uint32_t max_token = 0;
  for (std::uint32_t t : data->tokens) max_token = std::max(max_token, t);
  if (json) {
    nlohmann::ordered_json j;
    j["path"] = path;
    j["format"] = data->byte_level ? "text" : "llm.c";
    if (!data->byte_level) j["version"] = data->version;
    j["tokens"] = data->tokens.size();
    j["max_token"] = max_token;
    std::printf("%s\n", j.dump().c_str());
  } else if (data->byte_level) {
    std::printf("%s: plain text (bytes), %zu tokens, largest id %u\n", path.c_str(),
                data->tokens.size(), max_token);
  } else {
    std::printf("%s: llm.c token file version %d (%s), %zu tokens, largest id %u\n", path.c_str(),
                data->version, data->version == 1 ? "uint16" : "uint32", data->tokens.size(),
                max_token);
  }
  return 0;
}

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* data = tree.group("data", "Prepare and check training data");

  struct TokenizeOptions {
    std::string tokenizer;
    std::string text;
    std::string out;
    int threads = 0;
  };
  auto t = std::make_shared<TokenizeOptions>();
  CLI::App* tok = data->add_subcommand(
      "tokenize",
      "Write a text file as an llm.c token file: bytes (vocab 256), or the ids of a "
      "Hugging Face tokenizer.json");
  tok->add_option("--tokenizer", t->tokenizer,
                  "tokenizer.json, or a folder holding one (default: bytes, vocab 256)");
  tok->add_option("--text", t->text, "UTF-8 text input")->required();
  tok->add_option("--out", t->out,
                  "Token file to write (256 x int32 header + uint16 tokens, or uint32 (version 2) "
                  "past 65,536 ids)")
      ->required();
  tok->add_option("--threads", t->threads, "Encoding threads (default: all cores)")
      ->check(CLI::Range(0, 4096));
  tok->callback([t] { exit_code() = tokenize(t->tokenizer, t->text, t->out, t->threads); });

  struct DetokenizeOptions {
    std::string tokenizer;
    std::string in;
    std::string out;
  };
  auto d = std::make_shared<DetokenizeOptions>();
  CLI::App* detok = data->add_subcommand("detokenize", "Write a token file back as text");
  detok->add_option("--tokenizer", d->tokenizer, "tokenizer.json, or a folder holding one")
      ->required();
  detok->add_option("--in", d->in, "Token file (version 1 or 2)")->required();
  detok->add_option("--out", d->out, "Text file to write")->required();
  detok->callback([d] { exit_code() = detokenize(d->tokenizer, d->in, d->out); });

  struct TrainOptions {
    std::vector<std::string> texts;
    std::int64_t vocab = 0;
    std::string out;
    int threads = 0;
  };
  auto tr = std::make_shared<TrainOptions>();
  CLI::App* train = data->add_subcommand(
      "train-tokenizer", "Learn a byte-level BPE tokenizer.json (GPT-2's pre-tokenizer) from text");
  train->add_option("--text", tr->texts, "UTF-8 text files")->required()->expected(1, -1);
  train
      ->add_option("--vocab", tr->vocab,
                   "Ids in all: 256 bytes, the merges and <|endoftext|> (at least 257)")
      ->required();
  train->add_option("--out", tr->out, "Folder to write tokenizer.json into")->required();
  train->add_option("--threads", tr->threads, "Counting threads (default: all cores)")
      ->check(CLI::Range(0, 4096));
  train->callback(
      [tr] { exit_code() = train_tokenizer(tr->texts, tr->vocab, tr->out, tr->threads); });

  struct InspectOptions {
    std::string path;
    std::int64_t vocab = 0x7fffffff;
    bool json = false;
  };
  auto i = std::make_shared<InspectOptions>();
  CLI::App* ins = data->add_subcommand(
      "inspect", "Check a token file or text corpus as `train --data` does and print its size");
  ins->add_option("file", i->path, "Token file (.bin, version 1 or 2) or plain text")->required();
  ins->add_option("--vocab", i->vocab, "Reject tokens >= this (default: any id)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{0x7fffffff}));
  ins->add_flag("--json", i->json, "One JSON object");
  ins->callback([i] { exit_code() = inspect(i->path, i->vocab, i->json); });
});

}  // namespace
}  // namespace tz::cli
