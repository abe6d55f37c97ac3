// Config -> NVMe engine options.
#include "nvme/nvme_config.h"

#include <algorithm>

namespace tz::nvme {

NvmeSettings nvme_settings(const Config& config, std::size_t files) {
  NvmeSettings s;
  s.engine = config.tierzero.io_engine;
  const std::uint64_t bs = std::max<std::uint64_t>(config.aio.block_size, 4096);
  s.queue_options.block_bytes = std::min<std::uint64_t>((bs + 4095) / 4096 * 4096, 1ull << 30);
  const auto qd = static_cast<std::uint32_t>(std::max<std::int64_t>(config.aio.queue_depth, 1));
  s.queue_options.depth_per_file = qd;
  s.engine_options.queue_depth = qd * static_cast<std::uint32_t>(std::max<std::size_t>(files, 1));
  s.engine_options.sqpoll = config.tierzero.sqpoll;
  s.engine_options.max_files = std::max<std::uint32_t>(64, static_cast<std::uint32_t>(files));
  s.keep_swap_files = config.tierzero.keep_swap_files;
  return s;
}

}  // namespace tz::nvme
