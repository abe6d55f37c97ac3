// Entry point of the `tierzero` executable: builds the command tree from the registered
// subcommands (command.h), parses the command line and returns the command's exit code.
#include <cstdio>

#include "cli/command.h"
#include "core/log.h"

namespace tz::cli {

std::vector<Registration>& CommandRegistry::all() {
  static std::vector<Registration> registrations;
  return registrations;
}

CLI::App* CommandTree::group(const std::string& name, const std::string& description) {
  for (CLI::App* sub : root->get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == name) return sub;
  }
  CLI::App* sub = root->add_subcommand(name, description);
  sub->require_subcommand(1);
  return sub;
}

int& exit_code() {
  static int code = 0;
  return code;
}

}  // namespace tz::cli

int main(int argc, char** argv) {
  CLI::App app{"tierzero: tiered-offload ZeRO training engine (GPU HBM, pinned host memory, NVMe)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tierzero 0.1.0");
  std::string level = "";
  app.add_option("--log-level", level, "error, warn, info or debug (default: $TZ_LOG_LEVEL or info)")
      ->check(CLI::IsMember({"error", "warn", "info", "debug"}));
  app.parse_complete_callback([&] {
    if (!level.empty()) tz::set_log_level(*tz::parse_log_level(level));
  });
  tz::cli::CommandTree tree{&app};
  for (const auto& reg : tz::cli::CommandRegistry::all()) reg(tree);
  CLI11_PARSE(app, argc, argv);
  return tz::cli::exit_code();
}
