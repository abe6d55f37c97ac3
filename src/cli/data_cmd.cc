// `tierzero data tokenize --text FILE --out FILE.bin`: writes a plain text file as a byte-level
// (vocab 256) llm.c token file, the format `tierzero train --data` reads, and
// `tierzero data inspect FILE`: what a token file or text corpus holds, after the checks train
// runs.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "model/data.h"

namespace tz::cli {
namespace {

int tokenize(const std::string& text_path, const std::string& out_path) {
  // Loading as text with vocab 256 accepts every byte; a file that is already a token file (it
  // starts with the magic or ends in .bin) is refused rather than tokenized twice.
  auto data = model::load_tokens(text_path, 256);
  if (!data.is_ok()) {
    std::fprintf(stderr, "tierzero data tokenize: %s\n", data.status().message().c_str());
    return 1;
  }
  if (!data->byte_level) {
    std::fprintf(stderr, "tierzero data tokenize: %s is already a token file\n", text_path.c_str());
    return 1;
  }
  const Status st = model::write_token_file(out_path, data->tokens);
  if (!st.is_ok()) {
    std::fprintf(stderr, "tierzero data tokenize: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("%s: %zu byte tokens (vocab 256) from %s\n", out_path.c_str(), data->tokens.size(),
              text_path.c_str());
  return 0;
}

int inspect(const std::string& path, int vocab, bool json) {
  auto data = model::load_tokens(path, vocab);
  if (!data.is_ok()) {
    std::fprintf(stderr, "tierzero data inspect: %s\n", data.status().message().c_str());
    return 1;
  }
  unsigned max_token = 0;
  for (std::uint16_t t : data->tokens) max_token = std::max<unsigned>(max_token, t);
  if (json) {
    nlohmann::ordered_json j;
    j["path"] = path;
    j["format"] = data->byte_level ? "text" : "llm.c";
    j["tokens"] = data->tokens.size();
    j["max_token"] = max_token;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s: %s, %zu tokens, largest id %u\n", path.c_str(),
                data->byte_level ? "plain text (bytes)" : "llm.c token file", data->tokens.size(),
                max_token);
  }
  return 0;
}

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* data = tree.group("data", "Prepare and check training data");

  struct TokenizeOptions {
    std::string text;
    std::string out;
  };
  auto t = std::make_shared<TokenizeOptions>();
  CLI::App* tok = data->add_subcommand(
      "tokenize", "Write a plain text file as a byte-level (vocab 256) llm.c token file");
  tok->add_option("--text", t->text, "Plain text input (read as bytes)")->required();
  tok->add_option("--out", t->out, "Token file to write (256 x int32 header + uint16 tokens)")
      ->required();
  tok->callback([t] { exit_code() = tokenize(t->text, t->out); });

  struct InspectOptions {
    std::string path;
    int vocab = 65536;
    bool json = false;
  };
  auto i = std::make_shared<InspectOptions>();
  CLI::App* ins = data->add_subcommand(
      "inspect", "Check a token file or text corpus as `train --data` does and print its size");
  ins->add_option("file", i->path, "Token file (.bin) or plain text")->required();
  ins->add_option("--vocab", i->vocab, "Reject tokens >= this (default 65536: any uint16)")
      ->check(CLI::Range(1, 65536));
  ins->add_flag("--json", i->json, "One JSON object");
  ins->callback([i] { exit_code() = inspect(i->path, i->vocab, i->json); });
});

}  // namespace
}  // namespace tz::cli
