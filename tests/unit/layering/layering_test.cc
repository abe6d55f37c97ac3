// The `layering` test: reads every `#include "..."` of every source file under src/ and fails on
// any edge that DESIGN.md's layer table ("Layers") does not allow, naming the file and the line.
//
// Usage: layering_test <src dir>. Exit 0 when every include is allowed, 1 with one line per
// violation otherwise, 2 when the tree cannot be read. Before reading the tree it checks itself on
// hand-written includes (an upward one must be caught), so the test cannot pass by matching
// nothing.
//
// Rules (DESIGN.md, "Layers"; the module's own folder is always allowed):
// - a module includes only the modules its row lists below;
// - where a row lists headers for a module, only those headers of it (gpu/ uses cpu/ for the
//   pinned pool and the optimizer's shared functors only; model/ and train/ see zero/'s model
//   API only);
// - `<module>/internal/...` is private to <module>;
// - an include without a module folder must name a file next to the including one.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// One allowed edge: the module, and (when non-empty) the only headers of it that may be included.
struct Edge {
  std::string module;
  std::set<std::string> headers;  // paths from src/ ("zero/engine.h"); empty = any header
};

// DESIGN.md's layer table, bottom to top. Where the code was right and DESIGN.md silent or wrong,
// the edge is allowed here and listed in the report of the change that added it.
const std::map<std::string, std::vector<Edge>>& layer_table() {
  static const std::map<std::string, std::vector<Edge>> table = {
      {"core", {}},
      // nvme/ and cpu/ know nothing of each other or of ZeRO.
      {"nvme", {{"core", {}}}},
      {"cpu", {{"core", {}}}},
      // gpu/ uses cpu/ for two things only: registering the pinned pool with the device and
      // running the optimizer's shared functors (HostDevice through the SIMD span update).
      {"gpu",
       {{"core", {}},
        {"cpu", {"cpu/pinned_pool.h", "cpu/optimizer_math.h", "cpu/span_update.h"}}}},
      // comm/ runs on gpu/ streams and buffers.
      {"comm", {{"core", {}}, {"cpu", {}}, {"gpu", {}}}},
      // store/ sees nvme/, gpu/ and cpu/ through their interfaces.
      {"store", {{"core", {}}, {"cpu", {}}, {"nvme", {}}, {"gpu", {}}}},
      // ops/: a CPU backend (cpu/'s SIMD) and a CUDA backend (gpu/'s devices and checks).
      {"ops", {{"core", {}}, {"cpu", {}}, {"gpu", {}}}},
      // zero/ sits on store/, comm/, cpu/ and gpu/ (devices and streams), never on nvme/.
      {"zero", {{"core", {}}, {"cpu", {}}, {"gpu", {}}, {"comm", {}}, {"store", {}}}},
      // model/ sees zero/'s model API and ops/, never shards, tiers or ranks.
      {"model", {{"core", {}}, {"ops", {}}, {"zero", {"zero/engine.h"}}}},
      // train/ sees model/ and zero/'s model API (the engine and its checkpoints).
      {"train",
       {{"core", {}}, {"model", {}}, {"zero", {"zero/engine.h", "zero/checkpoint.h"}}}},
      // cli/: flags and output over everything.
      {"cli",
       {{"core", {}},
        {"cpu", {}},
        {"nvme", {}},
        {"gpu", {}},
        {"comm", {}},
        {"store", {}},
        {"ops", {}},
        {"zero", {}},
        {"model", {}},
        {"train", {}}}},
  };
  return table;
}

// Edges the code still has that the table refuses, each to be removed by the change named; an
// entry that no longer matches an include fails the test too, so the list only shrinks.
struct Exception {
  std::string file;    // path from src/
  std::string target;  // the included path
};
const std::vector<Exception>& pending_exceptions() {
  // None today: an edge the code needs and DESIGN.md refuses is added here with the change that
  // removes it, as {"zero/engine.cc", "nvme/io_engine.h"} was until store/stack.h.
  static const std::vector<Exception> list = {};
  return list;
}

struct Violation {
  std::string file;  // relative to src/
  int line = 0;
  std::string message;
};

// The first path component of `path` ("zero/engine.h" -> "zero"), or nullopt without a folder.
std::optional<std::string> module_of(const std::string& path) {
  const std::size_t slash = path.find('/');
  if (slash == std::string::npos || slash == 0) return std::nullopt;
  return path.substr(0, slash);
}

// Checks one include of `file` (a path from src/ in module `from`) at `line`.
void check_include(const std::string& file, const std::string& from, int line,
                   const std::string& target, const std::set<std::string>& existing,
                   std::vector<Violation>& out) {
  const auto fail = [&](std::string message) {
    out.push_back({file, line, "#include \"" + target + "\": " + std::move(message)});
  };
  const std::optional<std::string> to = module_of(target);
  const std::string internal = to ? *to + "/internal/" : std::string();
  if (!to || !layer_table().contains(*to)) {
    // A relative include must name a file next to the including one (same module).
    const std::string dir = fs::path(file).parent_path().generic_string();
    const std::string sibling = dir.empty() ? target : dir + "/" + target;
    if (existing.contains(sibling)) return;
    fail(to ? "module '" + *to + "/' is not in the layer table"
            : "no module folder and no file of that name next to the including one");
    return;
  }
  if (target.find("/internal/") != std::string::npos && *to != from) {
    fail("'" + internal + "' is private to " + *to + "/");
    return;
  }
  if (*to == from) return;
  const auto& edges = layer_table().at(from);
  const auto edge = std::find_if(edges.begin(), edges.end(),
                                 [&](const Edge& e) { return e.module == *to; });
  if (edge == edges.end()) {
    fail(from + "/ may not depend on " + *to + "/ (DESIGN.md, \"Layers\")");
    return;
  }
  if (!edge->headers.empty() && !edge->headers.contains(target)) {
    std::string allowed;
    for (const std::string& h : edge->headers) allowed += (allowed.empty() ? "" : ", ") + h;
    fail(from + "/ sees only " + allowed + " of " + *to + "/ (DESIGN.md, \"Layers\")");
  }
}

// Checks every include of one file's `text`; `file` is its path from src/.
void check_file(const std::string& file, const std::string& text,
                const std::set<std::string>& existing, std::vector<Violation>& out) {
  static const std::regex include_re(R"re(^\s*#\s*include\s*"([^"]+)")re");
  const std::optional<std::string> from = module_of(file);
  if (!from) return;  // files at src/'s top (CMakeLists.txt) include nothing
  if (!layer_table().contains(*from)) {
    out.push_back({file, 0, "module '" + *from + "/' is not in the layer table"});
    return;
  }
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    std::smatch m;
    if (std::regex_search(line, m, include_re)) {
      check_include(file, *from, number, m[1].str(), existing, out);
    }
  }
}

bool is_source(const fs::path& p) {
  static const std::set<std::string> exts = {".h", ".hh", ".hpp", ".cc", ".cpp", ".cu", ".cuh",
                                             ".inc"};
  return exts.contains(p.extension().string());
}

// The checker on hand-written files: what it must catch and what it must let through.
bool self_check() {
  const std::set<std::string> existing = {"cpu/simd.h", "ops/internal/check.h", "zero/engine.h",
                                          "store/store.h", "nvme/io_engine.h",
                                          "train/trainer.h"};
  struct Case {
    std::string file;
    std::string include;
    bool allowed;
  };
  const std::vector<Case> cases = {
      {"cpu/optimizer.cc", "zero/engine.h", false},       // upward
      {"nvme/swap_space.cc", "cpu/pinned_pool.h", false},  // sideways: nvme/ and cpu/
      {"zero/engine.cc", "nvme/io_engine.h", false},       // zero/ never on nvme/
      {"model/gpt2.cc", "zero/plan.h", false},             // not the model API
      {"model/gpt2.cc", "store/store.h", false},           // tiers
      {"gpu/device.h", "cpu/topology.h", false},           // not one of gpu's two cpu/ uses
      {"zero/engine.cc", "ops/internal/check.h", false},   // another module's internal/
      {"cpu/optimizer.cc", "simd_missing.h", false},       // relative, no such file
      {"zero/engine.cc", "store/store.h", true},
      {"model/gpt2.cc", "zero/engine.h", true},
      {"gpu/pinned_registration.h", "cpu/pinned_pool.h", true},
      {"ops/cpu_ops.cc", "ops/internal/check.h", true},
      {"cpu/optimizer.cc", "simd.h", true},  // relative, next to it
      {"cli/train.cc", "zero/plan.h", true},
      // train/: the loop over model/ and the engine's model API, below cli/.
      {"train/trainer.cc", "model/factory.h", true},
      {"train/trainer.cc", "zero/engine.h", true},
      {"train/trainer.cc", "zero/checkpoint.h", true},
      {"train/trainer.cc", "zero/plan.h", false},    // not the model API
      {"train/trainer.cc", "store/store.h", false},  // tiers
      {"train/trainer.cc", "gpu/select.h", false},   // devices are the caller's (cli/)
      {"model/gpt2.cc", "train/trainer.h", false},   // upward
      {"zero/engine.cc", "train/trainer.h", false},  // upward
      {"cli/train.cc", "train/trainer.h", true},
  };
  bool ok = true;
  for (const Case& c : cases) {
    std::vector<Violation> v;
    check_file(c.file, "#include <vector>\n#include \"" + c.include + "\"\n", existing, v);
    const bool caught = !v.empty();
    if (caught == c.allowed || (caught && v[0].line != 2)) {
      std::fprintf(stderr, "layering self-check: %s including \"%s\" should be %s\n",
                   c.file.c_str(), c.include.c_str(), c.allowed ? "allowed" : "refused at line 2");
      ok = false;
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: layering_test <src dir>\n");
    return 2;
  }
  if (!self_check()) return 1;
  const fs::path root(argv[1]);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    std::fprintf(stderr, "layering: '%s' is not a directory\n", argv[1]);
    return 2;
  }
  std::set<std::string> existing;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.is_regular_file() && is_source(entry.path())) {
      existing.insert(fs::relative(entry.path(), root).generic_string());
    }
  }
  std::vector<Violation> found;
  for (const std::string& file : existing) {
    std::ifstream in(root / file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "layering: cannot read src/%s\n", file.c_str());
      return 2;
    }
    std::ostringstream text;
    text << in.rdbuf();
    check_file(file, text.str(), existing, found);
  }
  std::vector<Violation> violations;
  std::vector<bool> used(pending_exceptions().size(), false);
  for (const Violation& v : found) {
    bool excepted = false;
    for (std::size_t i = 0; i < pending_exceptions().size(); ++i) {
      const Exception& e = pending_exceptions()[i];
      if (v.file == e.file && v.message.starts_with("#include \"" + e.target + "\"")) {
        used[i] = excepted = true;
      }
    }
    if (!excepted) violations.push_back(v);
  }
  for (std::size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      const Exception& e = pending_exceptions()[i];
      violations.push_back({e.file, 0, "pending exception for \"" + e.target +
                                           "\" matches no include: remove it from the list"});
    }
  }
  for (const Violation& v : violations) {
    std::fprintf(stderr, "src/%s:%d: %s\n", v.file.c_str(), v.line, v.message.c_str());
  }
  std::printf("layering: %zu files, %zu violations\n", existing.size(), violations.size());
  return violations.empty() ? 0 : 1;
}
