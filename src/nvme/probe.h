// What a directory's filesystem and this kernel support for swap I/O (O_DIRECT, io_uring with
// registered buffers and files, libaio), for `tierzero info` and for choosing the I/O engine at
// start-up with one log line that says which engine and why.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "nvme/io_engine.h"

namespace tz::nvme {

// Probes `dir` and returns {"path", "filesystem" (ext4, xfs, tmpfs, overlay, ...), "free_bytes",
// "total_bytes", "o_direct", "logical_block_bytes", "io_uring": {"ring", "registered_buffers",
// "fixed_files", "error"?}, "libaio", "libaio_error"?, "recommended_engine", "reason",
// "error"?}. Never fails or throws: what could not be probed is false with an "error" text. A
// probe file is created in `dir` and unlinked at once, so nothing is left behind.
nlohmann::json probe_path(const std::string& dir);

// The statfs magic's filesystem name ("ext4", "tmpfs", ...; "0x1234abcd" when unknown).
std::string filesystem_name(long magic);

struct EngineChoice {
  IoEngineKind kind = IoEngineKind::kPsync;
  bool direct = true;  // false when some path cannot do O_DIRECT (psync then uses the page cache)
  std::string reason;  // one sentence, as logged
};

// Chooses the engine for swap files on `paths`: `requested` is "auto" (probe: io_uring, then
// libaio; psync with a warning when a filesystem lacks O_DIRECT) or an engine name (forced; the
// reason says so). Logs one line "io engine: <name> (<reason>)". Errors: kInvalidArgument for
// an unknown name.
Result<EngineChoice> choose_io_engine(std::string_view requested, const std::vector<std::string>& paths);

}  // namespace tz::nvme
