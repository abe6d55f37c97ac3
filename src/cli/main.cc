// Entry point of the `tierzero` executable: builds the command tree from the registered
// subcommands (command.h), parses the command line and returns the command's exit code.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

CLI::App*& root_app() {
  static CLI::App* app = nullptr;
  return app;
}

namespace {

// Whether the deepest parsed command was given --json.
bool json_requested() {
  CLI::App* cur = root_app();
  if (cur == nullptr) return false;
  for (std::vector<CLI::App*> subs = cur->get_subcommands(); !subs.empty();
       subs = cur->get_subcommands()) {
    cur = subs.front();
  }
  const CLI::Option* json = cur->get_option_no_throw("--json");
  return json != nullptr && json->count() > 0;
}

}  // namespace

int report_failure(std::string_view command, std::string_view message) {
  std::fprintf(stderr, "tierzero %.*s: %.*s\n", static_cast<int>(command.size()), command.data(),
               static_cast<int>(message.size()), message.data());
  if (json_requested()) {
    const nlohmann::ordered_json j = {{"error", std::string(message)}, {"command", std::string(command)}};
    std::fflush(stderr);
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 1;
}

int report_failure(std::string_view command, const Status& status) {
  return report_failure(command, std::string_view(status.message()));
}

namespace {

// The deepest command the parser reached ("tierzero bench nvme") and its App.
CLI::App* reached(CLI::App& app, std::string& path) {
  path = "tierzero";
  CLI::App* cur = &app;
  for (std::vector<CLI::App*> subs = cur->get_subcommands(); !subs.empty();
       subs = cur->get_subcommands()) {
    cur = subs.front();
    path += " " + cur->get_name();
  }
  return cur;
}

std::string subcommand_list(CLI::App* app) {
  std::string out;
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; })) {
    out += (out.empty() ? "" : ", ") + sub->get_name();
  }
  return out;
}

// A command-line mistake follows the one error convention (docs/cli.md): one line
// "tierzero <command>: <what is wrong>" on stderr and exit 1, whatever CLI11's own code is; a
// missing or unknown subcommand lists the valid ones.
int report_parse_error(CLI::App& app, const CLI::ParseError& e) {
  std::string path;
  CLI::App* cur = reached(app, path);
  std::string what = e.what();
  const bool needs_sub = cur->get_require_subcommand_min() > 0 && cur->get_subcommands().empty();
  if (needs_sub) {
    const std::vector<std::string> extra = cur->remaining();
    if (!extra.empty() && !extra.front().empty() && extra.front()[0] != '-') {
      what = "unknown command '" + extra.front() + "' (one of: " + subcommand_list(cur) + ")";
    } else {
      what = "a command is required (one of: " + subcommand_list(cur) + ")";
    }
  }
  std::fprintf(stderr, "%s: %s\n", path.c_str(), what.c_str());
  return 1;
}

}  // namespace
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
  tz::cli::root_app() = &app;
  tz::cli::CommandTree tree{&app};
  for (const auto& reg : tz::cli::CommandRegistry::all()) reg(tree);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return tz::cli::report_parse_error(app, e);
  }
  return tz::cli::exit_code();
}
