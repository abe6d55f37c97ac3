// `tierzero config check FILE [--print]` validates a training configuration, and
// `tierzero config keys [--markdown]` documents every key the schema knows.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/config.h"

namespace tz::cli {
namespace {

int run_check(const std::string& path, bool print) {
  const ConfigLoad load = load_config_file(path);
  int errors = 0;
  for (const ConfigDiagnostic& d : load.diagnostics) {
    const bool is_error = d.severity == ConfigDiagnostic::Severity::kError;
    errors += is_error ? 1 : 0;
    std::fprintf(stderr, "%s: %s: %s\n", path.c_str(), is_error ? "error" : "warning",
                 d.message.c_str());
  }
  if (errors > 0) return 1;
  std::printf("%s: OK\n", path.c_str());
  if (print) std::printf("%s\n", load.resolved.dump(2).c_str());
  return 0;
}

int run_keys(bool markdown) {
  const auto docs = config_key_docs();
  if (markdown) {
    std::printf("| key | type | accepted | default | meaning |\n| --- | --- | --- | --- | --- |\n");
    for (const auto& d : docs) {
      std::printf("| `%s` | %s | %s | `%s` | %s |\n", d.key.c_str(), d.type.c_str(),
                  d.accepted.c_str(), d.default_value.c_str(), d.doc.c_str());
    }
    return 0;
  }
  for (const auto& d : docs) {
    std::printf("%-58s %-6s default %-12s %s\n", d.key.c_str(), d.type.c_str(),
                d.default_value.c_str(), d.doc.c_str());
    std::printf("%-58s        accepted: %s\n", "", d.accepted.c_str());
  }
  return 0;
}

TZ_REGISTER_COMMAND([](CommandTree& tree) {
  CLI::App* config = tree.group("config", "Check and document training configurations");

  struct CheckOptions {
    std::string path;
    bool print = false;
  };
  auto check_opts = std::make_shared<CheckOptions>();
  CLI::App* check = config->add_subcommand(
      "check", "Validate a DeepSpeed-style JSON config: exit 0 and one OK line, or one line per "
               "problem and a non-zero exit");
  check->add_option("file", check_opts->path, "Configuration file (JSON)")->required();
  check->add_flag("--print", check_opts->print, "Print the resolved config with every default");
  check->callback([check_opts] { exit_code() = run_check(check_opts->path, check_opts->print); });

  auto markdown = std::make_shared<bool>(false);
  CLI::App* keys = config->add_subcommand("keys", "List every configuration key with its type, "
                                                  "accepted values, default and meaning");
  keys->add_flag("--markdown", *markdown, "Print a Markdown table (docs/config.md)");
  keys->callback([markdown] { exit_code() = run_keys(*markdown); });
});

}  // namespace
}  // namespace tz::cli
