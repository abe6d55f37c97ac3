// Engine names and the backend factory.
#include "nvme/io_engine.h"

#include "nvme/engines.h"

namespace tz::nvme {

const char* io_engine_name(IoEngineKind kind) {
  switch (kind) {
    case IoEngineKind::kIoUring: return "io_uring";
    case IoEngineKind::kLibaio: return "libaio";
    case IoEngineKind::kPsync: return "psync";
  }
  return "unknown";
}

Result<IoEngineKind> parse_io_engine(std::string_view name) {
  if (name == "io_uring" || name == "uring") return IoEngineKind::kIoUring;
  if (name == "libaio" || name == "aio") return IoEngineKind::kLibaio;
  if (name == "psync" || name == "sync") return IoEngineKind::kPsync;
  return Status::invalid_argument("io engine '" + std::string(name) +
                                  "': expected auto, io_uring, libaio or psync");
}

Result<std::unique_ptr<IoEngine>> make_io_engine(IoEngineKind kind, const IoEngineOptions& options) {
  switch (kind) {
    case IoEngineKind::kIoUring: return make_uring_engine(options);
    case IoEngineKind::kLibaio: return make_aio_engine(options);
    case IoEngineKind::kPsync: return make_psync_engine(options);
  }
  return Status::invalid_argument("unknown io engine");
}

}  // namespace tz::nvme
