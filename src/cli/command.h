// The `tierzero` command tree. Each subcommand lives in its own file and registers itself with
// TZ_REGISTER_COMMAND, so adding a command (for example `bench nvme`) touches no other file.
// A command's callback returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tz::cli {

// Parent commands that registrations attach to: "" (the root), "bench", "config", ...
struct CommandTree {
  CLI::App* root = nullptr;
  // Returns the subcommand `name` of the root, creating it with `description` on first use.
  CLI::App* group(const std::string& name, const std::string& description);
};

using Registration = std::function<void(CommandTree&)>;

struct CommandRegistry {
  static std::vector<Registration>& all();
};

struct Registrar {
  explicit Registrar(Registration r) { CommandRegistry::all().push_back(std::move(r)); }
};

// A flag's check for a count that must be at least 1 (0 and negatives refused alike):
// "--seq: must be at least 1 (got 0)".
inline CLI::Validator at_least_one() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          std::size_t used = 0;
          if (std::stoll(value, &used) >= 1 && used == value.size()) return "";
        } catch (const std::exception&) {
        }
        return "must be at least 1 (got " + value + ")";
      },
      "INT>=1");
}

// Set by a command's callback; main returns it.
int& exit_code();

// The one error line of docs/cli.md: prints "tierzero <command>: <what failed>" on stderr (the
// status's message, without its internal code name) and returns 1, the exit status of a failed
// command. `command` is the command's words after "tierzero" ("bench nvme").
// With `--json` given to the failed command, a JSON object {"error": "<the same message>",
// "command": "<command>"} is printed on stdout as well.
int report_failure(std::string_view command, const Status& status);
int report_failure(std::string_view command, std::string_view message);

// The root of the command tree main parses (set by main; report_failure reads which command was
// reached and whether it was given --json).
CLI::App*& root_app();

}  // namespace tz::cli

#define TZ_CLI_CONCAT_INNER_(a, b) a##b
#define TZ_CLI_CONCAT_(a, b) TZ_CLI_CONCAT_INNER_(a, b)
// TZ_REGISTER_COMMAND([](tz::cli::CommandTree& tree) { ... add a subcommand ... });
#define TZ_REGISTER_COMMAND(fn) \
  static const ::tz::cli::Registrar TZ_CLI_CONCAT_(tz_cli_registrar_, __LINE__)(fn)
