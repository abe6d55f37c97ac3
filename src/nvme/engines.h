// Factories of the concrete backends, private to the nvme module; everything else goes through
// make_io_engine (io_engine.h).
#pragma once

#include <memory>

#include "nvme/io_engine.h"

namespace tz::nvme {

Result<std::unique_ptr<IoEngine>> make_uring_engine(const IoEngineOptions& options);
Result<std::unique_ptr<IoEngine>> make_aio_engine(const IoEngineOptions& options);
Result<std::unique_ptr<IoEngine>> make_psync_engine(const IoEngineOptions& options);

}  // namespace tz::nvme
