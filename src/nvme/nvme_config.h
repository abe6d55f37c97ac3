// How the DeepSpeed `aio` section and tierzero's `io_engine`, `sqpoll` and `keep_swap_files` keys
// become the NVMe engine's options, so every caller maps them the same way.
#pragma once

#include <string>

#include "core/config.h"
#include "nvme/io_engine.h"
#include "nvme/io_queue.h"

namespace tz::nvme {

struct NvmeSettings {
  std::string engine = "auto";  // tierzero.io_engine, for choose_io_engine
  IoEngineOptions engine_options;
  IoQueueOptions queue_options;
  bool keep_swap_files = false;
};

// aio.block_size -> queue block size (rounded up to 4 KiB); aio.queue_depth -> depth per file and
// engine capacity (times `files`); tierzero.sqpoll, tierzero.keep_swap_files as they are.
NvmeSettings nvme_settings(const Config& config, std::size_t files = 1);

}  // namespace tz::nvme
